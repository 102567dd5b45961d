"""Cross-fitted folds (``data.split.folds``): every record tested exactly once over the
folds, never in the training part of its own fold, the same cut for every seed."""

from __future__ import annotations

from collections import Counter

import pytest

from fedkt.config import ConfigError, DataConfig, DatasetConfig, SplitConfig, parse_config
from fedkt.data import DataError, load_dataset_records, make_splits
from fedkt.data.splits import run_data

FOLDS = 4


def _ids(records: list[dict]) -> list[str]:
    return [r["id"] for r in records]


def test_each_record_is_tested_once_and_never_trained_on_in_its_fold() -> None:
    ds = load_dataset_records(DatasetConfig(name="intent_recognition"))
    tested: Counter[str] = Counter()
    for fold in range(FOLDS):
        sp = make_splits(ds, SplitConfig(scheme="fedmkt", folds=FOLDS, server_size=120),
                         num_clients=2, seed=fold)
        test = set(_ids(sp["test"]))
        trained = set(_ids(sp["server"])) | set(_ids(sp["public"])) | set(_ids(sp["private_pool"]))
        assert not test & trained, f"fold {fold}: {len(test & trained)} records in both"
        assert len(test) == len(sp["test"])  # no record twice within a fold
        tested.update(test)
        # the training part is what the test fold leaves, cut as scheme fedmkt cuts it
        assert len(sp["server"]) == 120
        assert abs(len(sp["test"]) - len(ds.records) / FOLDS) < 1
    assert set(tested) == set(_ids(ds.records))
    assert set(tested.values()) == {1}


def test_the_cut_is_shared_by_seeds_and_moved_by_fold_seed() -> None:
    ds = load_dataset_records(DatasetConfig(name="intent_recognition"))
    a = make_splits(ds, SplitConfig(folds=FOLDS), 2, seed=1)
    b = make_splits(ds, SplitConfig(folds=FOLDS), 2, seed=1)
    c = make_splits(ds, SplitConfig(folds=FOLDS, fold_seed=5), 2, seed=1)
    assert _ids(a["test"]) == _ids(b["test"])
    assert set(_ids(a["test"])) != set(_ids(c["test"]))


def test_a_seed_without_a_fold_is_refused_by_name(tmp_path) -> None:
    data = {"seed": 4, "output_dir": str(tmp_path), "method": {"name": "fedavg"},
            "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
            "data": {"dataset": {"name": "intent_recognition"}, "split": {"folds": FOLDS}}}
    with pytest.raises(ConfigError, match=r"seed: 4 has no fold.*folds is 4"):
        parse_config(data)
    data["seed"] = 3
    assert parse_config(data).data.split.folds == FOLDS
    with pytest.raises(ConfigError, match="folds"):
        parse_config({**data, "data": {**data["data"], "split": {
            "folds": 3, "test_dataset": {"name": "intent_recognition"}}}})
    with pytest.raises(DataError, match="fold 7 of 4"):
        make_splits(load_dataset_records(DatasetConfig(name="intent_recognition")),
                    SplitConfig(folds=FOLDS), 2, seed=7)


def test_run_data_tests_on_the_fold() -> None:
    cfg = DataConfig(dataset=DatasetConfig(name="intent_recognition"),
                     split=SplitConfig(scheme="fedmkt", folds=FOLDS))
    seen = [set(_ids(run_data(cfg, 2, k).test)) for k in range(FOLDS)]
    assert all(not (seen[i] & seen[j]) for i in range(FOLDS) for j in range(i + 1, FOLDS))
