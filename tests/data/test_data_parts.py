"""The server's own data, public sets without labels or from another dataset, class filters
(data.split.server_size, data.public_labels, data.public_dataset, data.classes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedkt.config import ConfigError, DataConfig, DatasetConfig, parse_config
from fedkt.data import (
    DataError,
    choice_view,
    client_splits,
    lm_pair,
    load_dataset_records,
    mc_view,
)

INTENTS = {"name": "intent_recognition"}


def _data(**over: Any) -> DataConfig:
    raw: dict[str, Any] = {"dataset": INTENTS, "split": {"scheme": "fedmkt", "test_size": 100}}
    for key, value in over.items():
        if key in ("split", "classes") and isinstance(value, dict):
            raw[key] = {**raw.get(key, {}), **value}
        else:
            raw[key] = value
    return DataConfig.model_validate(raw)


def _ids(records: list[dict]) -> list[str]:
    return [r["id"] for r in records]


def _labels(records: list[dict]) -> set[int]:
    return {r["label"] for r in records}


# --------------------------------------------------------------------------- server part


def _expected(n: int, seed: int, n_test: int, n_server: int, k: int) -> dict[str, list[int]]:
    """The documented cuts, recomputed from the seeded permutation: test, server, then
    fedmkt's k + 1 equal parts of the rest."""
    perm = np.random.default_rng([seed, 1]).permutation(n)
    rest = perm[n_test + n_server:]
    part = len(rest) // (k + 1)
    return {"test": perm[:n_test].tolist(), "server": perm[n_test:n_test + n_server].tolist(),
            "public": rest[:part].tolist(),
            "private": [rest[part * (c + 1): part * (c + 2)].tolist() for c in range(k)]}


@pytest.mark.parametrize("server_size", [0, 60])
def test_server_part_is_cut_after_the_test_set_and_before_public_and_private(
        server_size: int) -> None:
    records = load_dataset_records(DatasetConfig(**INTENTS)).records
    ids = [r["id"] for r in records]
    data = client_splits(_data(split={"server_size": server_size}), num_clients=3, seed=5)
    want = _expected(len(records), 5, 100, server_size, 3)
    assert _ids(data.test) == [ids[i] for i in want["test"]]
    assert _ids(data.server) == [ids[i] for i in want["server"]]
    assert _ids(data.public) == [ids[i] for i in want["public"]]
    assert [_ids(p) for p in data.private] == [[ids[i] for i in p] for p in want["private"]]
    assert len(data.server) == server_size
    every = _ids(data.server) + _ids(data.public) + _ids(data.test) + sum(
        (_ids(p) for p in data.private), [])
    assert len(set(every)) == len(every)
    assert all("label" in r for r in data.server)
    assert ("server" in data.sizes()) == bool(server_size)


def test_server_size_zero_changes_nothing() -> None:
    """Existing configs (no server_size) give the records they gave before."""
    for split in ({"scheme": "fedmkt", "test_size": 100},
                  {"scheme": "holdout", "test_size": 0.2, "public_fraction": 0.25}):
        before = client_splits(DataConfig.model_validate({"dataset": INTENTS, "split": split}),
                               num_clients=2, seed=1)
        after = client_splits(DataConfig.model_validate(
            {"dataset": INTENTS, "split": {**split, "server_size": 0}}), num_clients=2, seed=1)
        assert before.server == [] and after.server == []
        assert _ids(before.public) == _ids(after.public)
        assert [_ids(p) for p in before.private] == [_ids(p) for p in after.private]
        assert _ids(before.test) == _ids(after.test)


def test_server_size_fraction_with_holdout() -> None:
    cfg = DataConfig.model_validate({"dataset": INTENTS, "split": {
        "test_size": 93, "server_size": 0.25, "public_fraction": 0.5}})
    data = client_splits(cfg, num_clients=2, seed=0)
    assert len(data.server) == 150  # a quarter of 600 training records
    assert len(data.public) == 225  # half of the 450 left
    assert [len(p) for p in data.private] == [112, 112]
    again = client_splits(cfg, num_clients=2, seed=0)
    assert _ids(again.server) == _ids(data.server)
    with pytest.raises(DataError, match="split.server_size = 600 leaves no training records"):
        client_splits(DataConfig.model_validate(
            {"dataset": INTENTS, "split": {"test_size": 93, "server_size": 600}}), 2, 0)


# --------------------------------------------------------------------------- public labels


def test_withheld_public_labels_reach_no_side() -> None:
    labelled = client_splits(_data(), num_clients=2, seed=3)
    data = client_splits(_data(public_labels=False), num_clients=2, seed=3)
    assert data.public_labels is False and labelled.public_labels is True
    assert _ids(data.public) == _ids(labelled.public) and data.public
    assert all("label" not in r for r in data.public)
    assert [{k: v for k, v in r.items() if k != "label"} for r in labelled.public] == data.public
    # Test and private records keep theirs, and are the same records.
    assert all("label" in r for r in data.test + sum(data.private, []))
    assert data.test == labelled.test and data.private == labelled.private
    # The labelled view is not changed by the unlabelled one (no shared dicts mutated).
    assert all("label" in r for r in client_splits(_data(), 2, 3).public)


def test_withheld_generation_targets() -> None:
    cfg = DataConfig.model_validate({
        "dataset": {"name": "dialogsum"}, "public_labels": False, "max_public": 20,
        "split": {"scheme": "fedmkt", "test_dataset": {"name": "dialogsum:test"}}})
    data = client_splits(cfg, num_clients=2, seed=0)
    assert len(data.public) == 20
    assert all(set(r) <= {"id", "prompt", "extra"} and r["prompt"] for r in data.public)
    assert all("target" in r and "references" in r for r in data.test)
    assert all("target" in r for p in data.private for r in p)


# --------------------------------------------------------------------------- class filters


def test_class_filters_keep_each_parts_classes_in_order() -> None:
    base = client_splits(_data(split={"server_size": 120}), num_clients=2, seed=2)
    data = client_splits(_data(split={"server_size": 120},
                               classes={"server": "0-2", "private": [3, 4, 5, 6]}), 2, 2)
    assert _labels(data.server) == {0, 1, 2}
    assert _ids(data.server) == [r["id"] for r in base.server if r["label"] <= 2]
    for k in range(2):
        assert _labels(data.private[k]) == {3, 4, 5, 6}
        assert _ids(data.private[k]) == [r["id"] for r in base.private[k] if r["label"] >= 3]
    # Public and test: unfiltered, all 7 classes.
    assert data.public == base.public and data.test == base.test
    assert _labels(data.test) == set(range(7))
    test_only = client_splits(_data(classes={"test": "5,1"}), 2, 2)
    assert _ids(test_only.test) == [r["id"] for r in base.test if r["label"] in (1, 5)]


def test_class_filter_then_cap_then_withhold() -> None:
    data = client_splits(_data(classes={"public": "6", "private": "0"}, max_public=5,
                               max_private_per_client=4, public_labels=False), 2, 2)
    labelled = client_splits(_data(), 2, 2)
    by_id = {r["id"]: r["label"] for r in labelled.public}
    assert len(data.public) == 5 and {by_id[i] for i in _ids(data.public)} == {6}
    assert all("label" not in r for r in data.public)
    assert all(len(p) == 4 and _labels(p) == {0} for p in data.private)


@pytest.mark.parametrize(("over", "message"), [
    ({"classes": {"private": "3-7"}}, r"data.classes.private: '3-7' must name distinct "
                                      r"classes in 0..6 \(out of range: \[7\]\)"),
    ({"classes": {"server": "0"}}, r"data.classes.server: the server has no records"),
    ({"classes": {"public": [1]}, "split": {"scheme": "holdout"}},
     r"data.classes.public: the public set has no record of classes \[1\] \(0 records"),
    ({"classes": {"test": 2}, "max_test": 3, "split": {"test_size": 0.2}}, None),
])
def test_class_filter_errors_name_the_key(over: dict, message: str | None) -> None:
    cfg = _data(**over)
    if message is None:  # filters apply before the caps: 3 test records of class 2
        data = client_splits(cfg, 2, 0)
        assert len(data.test) == 3 and _labels(data.test) == {2}
        return
    with pytest.raises(DataError, match=message):
        client_splits(cfg, 2, 0)


def test_class_filter_needs_classification_and_valid_syntax() -> None:
    cfg = DataConfig.model_validate({"dataset": {"name": "social_iqa"},
                                     "classes": {"test": "0"}})
    with pytest.raises(DataError, match="data.classes.test: class filters are for "
                                        "classification tasks; social_iqa is a multiple_choice"):
        client_splits(cfg, 2, 0)
    for bad in ("0-", "a", [1, 1], [-1]):
        with pytest.raises(ConfigError, match="data.classes.private: expected"):
            parse_config({"method": "fedavg", "data": {"dataset": INTENTS,
                                                       "classes": {"private": bad}}})


# --------------------------------------------------------------------------- public dataset


def test_public_dataset_maps_another_datasets_text() -> None:
    dialogs = {r["id"]: r["prompt"] for r in
               load_dataset_records(DatasetConfig(name="dialogsum")).records}
    cfg = _data(public_labels=False, max_public=40,
                public_dataset={"name": "dialogsum", "fields": {"text": "prompt"}})
    data = client_splits(cfg, num_clients=2, seed=4)
    assert len(data.public) == 40 and data.public_labels is False
    assert all(set(r) == {"id", "text"} and r["text"] == dialogs[r["id"]] for r in data.public)
    assert _ids(data.public) == _ids(client_splits(cfg, 2, 4).public)  # seeded order
    assert _ids(data.public) != _ids(client_splits(cfg, 2, 5).public)
    # The task's own data is cut as without it: fedmkt's public fifth goes unused.
    own = client_splits(_data(), 2, 4)
    assert data.private == own.private and data.test == own.test
    used = set(_ids(data.test)) | {i for p in data.private for i in _ids(p)}
    assert not used & set(_ids(own.public))


def test_public_dataset_same_field_name_and_files(tmp_path: Any) -> None:
    tweets = client_splits(_data(public_labels=False, public_dataset={"name": "tweeteval_hate"}),
                           2, 0)
    assert len(tweets.public) == 3000 and all(r["id"].startswith("tweeteval_hate:train:")
                                              for r in tweets.public)
    path = tmp_path / "chat.jsonl"
    path.write_text('{"utterance": "hello there", "y": 1}\n{"utterance": " ", "y": 0}\n')
    cfg = _data(public_labels=False,
                public_dataset={"path": str(path), "fields": {"text": "utterance"}})
    with pytest.raises(DataError, match=r"data.public_dataset: .*chat.jsonl record 2 .*"
                                        r"'utterance' \(mapped from 'text'\) must be a non-empty"):
        client_splits(cfg, 2, 0)
    path.write_text('{"utterance": "hello there", "y": 1}\n')
    data = client_splits(cfg, 2, 0)
    assert data.public == [{"id": "chat:0", "text": "hello there"}]
    with pytest.raises(DataError, match=r"data.public_dataset.fields: \['label'\] are not input"):
        client_splits(_data(public_labels=False, public_dataset={
            "path": str(path), "fields": {"text": "utterance", "label": "y"}}), 2, 0)
    with pytest.raises(DataError, match="no field 'text'; map it with data.public_dataset"):
        client_splits(_data(public_labels=False, public_dataset={"path": str(path)}), 2, 0)


def test_public_dataset_needs_withheld_labels() -> None:
    base = {"method": "fedavg", "data": {"dataset": INTENTS,
                                         "public_dataset": {"name": "tweeteval_hate"}}}
    with pytest.raises(ConfigError, match="data.public_dataset: an off-distribution public set "
                                          "has no labels; set data.public_labels: false"):
        parse_config(base)
    with pytest.raises(ConfigError, match="data.classes.public: data.public_dataset has no"):
        parse_config({**base, "data": {**base["data"], "public_labels": False,
                                       "classes": {"public": "0"}}})


def test_steps_that_need_a_gold_label_refuse_withheld_records() -> None:
    data = client_splits(_data(public_labels=False), num_clients=2, seed=0)
    labelled = client_splits(_data(), num_clients=2, seed=0)
    rec, gold = data.public[0], labelled.public[0]
    names = data.label_names
    for fn in (lm_pair, mc_view):
        with pytest.raises(DataError, match=f"record {rec['id']} has no gold 'label' .*"
                                            "data.public_labels: false"):
            fn(rec, "classification", names)
    # Scoring the choices needs no label: the same context and continuations as labelled.
    assert choice_view(rec, "classification", names) == mc_view(gold, "classification",
                                                                names)[:2]
    gen = client_splits(DataConfig.model_validate({
        "dataset": {"name": "dialogsum"}, "public_labels": False, "max_public": 2,
        "split": {"scheme": "fedmkt"}}), 2, 0)
    with pytest.raises(DataError, match="has no gold 'target'"):
        lm_pair(gen.public[0], "generation", None, gen.template)
