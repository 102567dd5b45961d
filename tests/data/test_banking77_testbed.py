"""The many-class testbed: vendored Banking77, the drawn class-disjoint split, its
preconditions (data.require) and `fedkt data`, which prints each fold's sides."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fedkt.cli import main
from fedkt.config import DataConfig, DatasetConfig, load_config
from fedkt.data import load_dataset_records
from fedkt.data.builtin import VENDORED
from fedkt.data.dataset import DataError
from fedkt.data.splits import SplitCheckError, client_splits, drawn_groups
from tests.conftest import run_data_of

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "fedkt" / "configs" / "suites" / "banking77_fedmkt_transfer.yaml"
SUITES = ("banking77_fedmkt_transfer", "banking77_fedmkt_transfer_to_clients",
          "banking77_llm2slm_transfer", "banking77_fedcollm_transfer")


def _suite_data(**over) -> DataConfig:
    """The data section the Banking77 transfer suites share, with ``over`` merged in."""
    raw = yaml.safe_load(SUITE.read_text(encoding="utf-8"))["base"]["data"]
    for key, value in over.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    return DataConfig.model_validate(raw)


def test_banking77_counts_names_and_licence() -> None:
    train = load_dataset_records(DatasetConfig(name="banking77"))
    test = load_dataset_records(DatasetConfig(name="banking77:test"))
    assert (len(train.records), len(test.records)) == (10003, 3080)
    assert len(train.label_names) == 77 and train.label_names == test.label_names
    assert Counter(r["label"] for r in test.records) == {c: 40 for c in range(77)}
    assert set(Counter(r["label"] for r in train.records)) == set(range(77))
    # Readable names: "card arrival" for card_arrival, no source quirks left.
    assert train.label_names[0] == "card arrival"
    assert all(re.fullmatch(r"[a-z0-9 ]+", n) for n in train.label_names)
    assert len(set(train.label_names)) == 77
    # Its licence and notice ship with the package data.
    folder = VENDORED / "banking77"
    assert "Attribution 4.0 International" in (folder / "LICENSE").read_text(encoding="utf-8")
    assert "CC BY 4.0" in (folder / "NOTICE.md").read_text(encoding="utf-8")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["fedkt"]
    for name in ("LICENSE", "NOTICE.md", "categories.json", "train.jsonl", "test.jsonl"):
        rel = (folder / name).relative_to(ROOT / "fedkt").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


def test_drawn_split_has_disjoint_many_class_sides_per_fold() -> None:
    cfg = _suite_data()
    sides = []
    for fold in (0, 1):
        fd = client_splits(cfg, 2, fold)
        order = fd.class_order
        assert sorted(order) == list(range(77))
        srv, cli = set(order[:38]), set(order[38:])
        sides.append(srv)
        # Each side holds only its own classes, and every one of them.
        assert {r["label"] for r in fd.server} == srv
        assert {r["label"] for p in fd.private for r in p} == cli
        per_server = Counter(r["label"] for r in fd.server)
        per_clients = Counter(r["label"] for p in fd.private for r in p)
        assert min(per_server.values()) >= 6 and max(per_server.values()) <= 8
        assert min(per_clients.values()) >= 6
        assert all(max(Counter(r["label"] for r in p).values()) <= 8 for p in fd.private)
        # Test: 1,000 records of the fold over all classes; public: 500, unlabelled,
        # none of them private, server or test.
        assert len(fd.test) == 1000 and {r["label"] for r in fd.test} == set(range(77))
        assert len(fd.public) == 500 and not any("label" in r for r in fd.public)
        others = {r["id"] for r in fd.test + fd.server} | {r["id"] for p in fd.private
                                                           for r in p}
        assert not {r["id"] for r in fd.public} & others
        # eval.class_groups name the same slots.
        groups = drawn_groups({"srv": "0-37", "cli": "38-76"}, order)
        assert (set(groups["srv"]), set(groups["cli"])) == (srv, cli)
    assert sides[0] != sides[1]  # each fold re-draws the sides
    assert client_splits(cfg, 2, 1).class_order == client_splits(cfg, 2, 1).class_order
    # Another fold_seed draws other sides for the same fold.
    other = _suite_data(split={"fold_seed": 1})
    assert set(client_splits(other, 2, 0).class_order[:38]) != sides[0]


@pytest.mark.parametrize(("over", "key"), [
    ({"require": {"min_test": 1001}}, "data.require.min_test"),
    ({"require": {"min_public": 501}}, "data.require.min_public"),
    ({"require": {"min_per_class": 9}}, "data.require.min_per_class"),
    ({"classes": {"server": "0-40"}}, "data.require.disjoint"),
])
def test_preconditions_fail_by_name(over: dict, key: str) -> None:
    with pytest.raises(SplitCheckError, match=re.escape(key)):
        client_splits(_suite_data(**over), 2, 0)


def test_require_and_draw_refuse_what_they_cannot_check() -> None:
    with pytest.raises(ValueError, match=r"require\.disjoint.*classes\.private"):
        DataConfig.model_validate({"dataset": {"name": "banking77"},
                                   "classes": {"server": "0-37"},
                                   "require": {"disjoint": True}})
    gen = DataConfig.model_validate({"dataset": {"name": "dialogsum"},
                                     "classes": {"draw": True}})
    with pytest.raises(DataError, match=r"data\.classes\.draw"):
        client_splits(gen, 2, 0)


def test_shipped_banking77_suites_validate_with_their_claims() -> None:
    from fedkt.evidence.suite import load_suite

    for name in SUITES:
        suite = load_suite(ROOT / "fedkt" / "configs" / "suites" / f"{name}.yaml",
                           output_dir="unused")
        assert suite.cfg.folds == [0, 1, 2, 3] and suite.cfg.seeds_per_fold == 2, name
        assert suite.primary is not None and suite.cfg.target_floor == 0.10, name
        assert any("@0." in c.text for c in suite.claims), name  # round 0 beside it
        arms = set(suite.cfg.arms)
        assert {a.rsplit("_", 1)[-1] for a in arms} >= {"shuffled", "marginal", "none"}, name
        for cfg in suite.runs.values():
            assert cfg.data.dataset.name == "banking77" and cfg.data.classes.draw
            assert cfg.data.split.folds == 4 and cfg.data.require.disjoint


def test_fedkt_data_prints_each_folds_sides(capsys: pytest.CaptureFixture[str]) -> None:
    from fedkt.evidence.suite import load_suite

    assert main(["data", "suites/banking77_fedmkt_transfer", "--fold", "1"]) == 0
    out = capsys.readouterr().out
    suite = load_suite(SUITE, output_dir="unused")
    seed = min(s for s, f in suite.fold_of.items() if f == 1)  # the fold's first seed
    cfg = suite.runs[(next(iter(suite.cfg.arms)), seed)]
    fd = client_splits(cfg.data, 2, cfg.seed)
    assert f"seed {seed} (fold 1 of 4)" in out and "fold 0" not in out
    # every training seed of a fold draws the same sides
    other = max(s for s, f in suite.fold_of.items() if f == 1)
    assert other != seed and client_splits(cfg.data, 2, other).class_order == fd.class_order
    listed = {}
    for side in ("server side", "clients side"):
        m = re.search(rf"  {side}: (\d+) classes\n    (.+)\n", out)
        assert m, out
        listed[side] = (int(m[1]), {int(x.split(" ", 1)[0]) for x in m[2].split(", ")})
    assert listed["server side"] == (38, set(fd.class_order[:38]))
    assert listed["clients side"] == (39, set(fd.class_order[38:]))
    names = fd.label_names
    assert f"{fd.class_order[0]} {names[fd.class_order[0]]}" in out
    assert re.search(r"test: 1000 records \((\d+) of the server's classes, (\d+) of the "
                     r"clients'\), 77 classes", out)
    assert "public: 500 records, without labels, none of them a private" in out
    assert f"server: {len(fd.server)} records, per class min " in out
    assert f"clients: {len(fd.private[0])} + {len(fd.private[1])} records, together" in out
    assert "data.require: disjoint, min_test 1000, min_public 500, min_per_class 6: met" in out


def test_fedkt_data_names_the_failed_precondition(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = yaml.safe_load(SUITE.read_text(encoding="utf-8"))["base"]
    raw["method"] = {"name": "fedmkt", "knowledge": "choices", "selection": "entropy",
                     "ft_weight": 0.0}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    load_config(path)  # a valid run config
    assert main(["data", str(path), "--no-names", "--set", "data.require.min_test=2000"]) == 2
    captured = capsys.readouterr()
    assert "data.require.min_test: the test set has 1000 records, fewer than 2000" in \
        captured.err
    # A suite's data is its own: --set is refused, naming the option.
    assert main(["data", str(SUITE), "--set", "seed=1"]) == 2
    assert "--set" in capsys.readouterr().err


def test_evaluation_reports_groups_over_the_drawn_classes(make_config) -> None:
    """With data.classes.draw, eval.class_groups name slots: the scorer's groups (and the
    predictions' meta the suites pair over) are the classes drawn for the fold."""
    from fedkt.data.splits import run_data
    from fedkt.eval import predictions
    from fedkt.train.lm import client_lm, evaluate_lm

    cfg = make_config("eval.class_groups={srv: '0-2', cli: '3-6'}",
                      "data.classes={draw: true}", "seed=1")
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    order = fd.class_order
    assert sorted(order) == list(range(7)) and order != list(range(7))
    with predictions.capture() as tables:
        metrics = evaluate_lm(cfg, client_lm(cfg, 0), fd.test, data=run_data_of(cfg))
    table = tables[""]
    assert table.meta["class_groups"] == {"srv": order[:3], "cli": order[3:]}
    srv = set(order[:3])
    rows = [(p, g) for p, g in zip(table.columns["pred"], table.columns["gold"], strict=True)
            if g in srv]
    assert rows and metrics["accuracy_srv"] == pytest.approx(
        sum(p == g for p, g in rows) / len(rows))
