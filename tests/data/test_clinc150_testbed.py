"""The affordable many-class testbed: vendored CLINC150, ``data.dataset.classes`` (a class
subset that becomes the task), and the split of suites/clinc150_fedmkt_transfer."""

from __future__ import annotations

import fnmatch
import tomllib
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fedkt.config import DataConfig, DatasetConfig
from fedkt.data import load_dataset_records
from fedkt.data.builtin import VENDORED, clinc150_domains
from fedkt.data.dataset import DataError
from fedkt.data.splits import client_splits

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "fedkt" / "configs" / "suites"


def test_clinc150_counts_domains_and_licence() -> None:
    ds = load_dataset_records(DatasetConfig(name="clinc150"))
    assert len(ds.records) == 22500 and len(ds.label_names) == 150
    assert Counter(r["label"] for r in ds.records) == {c: 150 for c in range(150)}
    assert Counter(r["extra"]["split"] for r in ds.records) == {
        "train": 15000, "val": 3000, "test": 4500}
    assert ds.label_names[:3] == ["freeze account", "routing", "pin change"]
    domains = clinc150_domains()
    assert len(domains) == 10 and domains["banking"] == "0-14"
    assert domains["credit_cards"] == "15-29" and domains["meta"] == "135-149"
    folder = VENDORED / "clinc150"
    assert "Attribution 3.0 Unported" in (folder / "LICENSE").read_text(encoding="utf-8")
    assert "CC BY 3.0" in (folder / "NOTICE.md").read_text(encoding="utf-8")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["fedkt"]
    for name in ("LICENSE", "NOTICE.md", "domains.json", "all.jsonl"):
        rel = (folder / name).relative_to(ROOT / "fedkt").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


def test_dataset_classes_keeps_and_renumbers_in_the_order_given() -> None:
    full = load_dataset_records(DatasetConfig(name="clinc150"))
    sub = load_dataset_records(DatasetConfig(name="clinc150", classes="15-29,0-14"))
    assert len(sub.records) == 4500
    assert sub.label_names == full.label_names[15:30] + full.label_names[:15]
    by_id = {r["id"]: r for r in full.records}
    for r in sub.records[:200]:
        old = by_id[r["id"]]["label"]
        assert r["label"] == (old - 15 if old >= 15 else old + 15) and r["text"] == by_id[
            r["id"]]["text"]


@pytest.mark.parametrize(("spec", "match"), [
    ("0-150", r"dataset\.classes: '0-150' must name distinct classes in 0\.\.149"),
    ("3,3", r"dataset\.classes"),
])
def test_dataset_classes_names_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_dataset_records(DatasetConfig(name="clinc150", classes=spec))


def test_dataset_classes_is_for_classification_and_checks_its_syntax() -> None:
    with pytest.raises(DataError, match=r"dataset\.classes: keeps classes of a "
                                        r"classification task"):
        load_dataset_records(DatasetConfig(name="dialogsum", classes="0"))
    with pytest.raises(ValueError, match=r"dataset\.classes: expected class indices"):
        DatasetConfig(name="clinc150", classes="banking")


def test_suite_split_has_disjoint_sides_and_its_counts() -> None:
    raw = yaml.safe_load((SUITES / "clinc150_fedmkt_transfer.yaml").read_text())["base"]
    for fold in (0, 3):
        cfg = DataConfig.model_validate({**raw["data"],
                                         "split": {**raw["data"]["split"], "fold": fold}})
        fd = client_splits(cfg, 2, 1000 * (fold + 1))
        assert len(fd.label_names) == 30 and sorted(fd.class_order) == list(range(30))
        srv, cli = set(fd.class_order[:15]), set(fd.class_order[15:])
        assert {r["label"] for r in fd.server} == srv
        assert {r["label"] for p in fd.private for r in p} == cli
        assert len(fd.test) == 1000 and {r["label"] for r in fd.test} == set(range(30))
        assert len(fd.public) == 500 and not any("label" in r for r in fd.public)
        assert min(Counter(r["label"] for r in fd.server).values()) >= 10
    pilot = yaml.safe_load((SUITES / "clinc150_fedmkt_pilot.yaml").read_text())
    assert pilot["base"] == raw  # the pilot runs the suite's own runs


def test_variance_pilot_runs_the_suites_fedmkt_arm_with_one_change_each() -> None:
    suite = yaml.safe_load((SUITES / "clinc150_fedmkt_transfer.yaml").read_text())
    pilot = yaml.safe_load((SUITES / "clinc150_fedmkt_variance_pilot.yaml").read_text())
    base = {k: v for k, v in pilot["base"].items() if k != "method"}
    assert base == suite["base"] and pilot["base"]["method"] == suite["arms"]["fedmkt"]["method"]
    assert pilot["arms"]["fedmkt"] == {} and pilot["arms"]["fedmkt_rounds2"] == {"rounds": 2}
    data = {**base["data"], **pilot["arms"]["fedmkt_public750"]["data"],
            "require": {**base["data"]["require"], "min_public": 750}}
    cfg = DataConfig.model_validate({**data, "split": {**data["split"], "fold": 1}})
    fd = client_splits(cfg, 2, 1001)
    public = {r["text"] for r in fd.public}
    assert len(fd.public) == 750 == len(public) and not any("label" in r for r in fd.public)
    others = {r["text"] for r in [*fd.server, *fd.test, *(r for p in fd.private for r in p)]}
    assert not public & others


def test_the_other_transfer_suites_run_on_the_same_testbed() -> None:
    """The FedMKT (LLM -> clients), LLM2SLM and FedCoLLM suites share the transfer suite's
    testbed: its base (FedCoLLM's with its own learning-rate keys at the same rates, and no
    client evaluation), folds and targets; the FedMKT suite's arms are the transfer suite's."""
    import copy

    from fedkt.evidence.suite import load_suite

    suite = yaml.safe_load((SUITES / "clinc150_fedmkt_transfer.yaml").read_text())
    lr = suite["arms"]["fedmkt"]["method"]
    loaded = {}
    for name in ("clinc150_fedmkt_to_clients", "clinc150_llm2slm_transfer",
                 "clinc150_fedcollm_transfer"):
        other = yaml.safe_load((SUITES / f"{name}.yaml").read_text())
        assert other["folds"] == suite["folds"] and other["seeds_per_fold"] == 3
        assert (other["target_floor"], other["target_half_width"]) == (0.10, 0.06)
        loaded[name] = other
    assert loaded["clinc150_fedmkt_to_clients"]["base"] == suite["base"]
    assert loaded["clinc150_llm2slm_transfer"]["base"] == suite["base"]
    for arm, spec in loaded["clinc150_fedmkt_to_clients"]["arms"].items():
        assert spec == suite["arms"][arm], arm
    llm2slm = loaded["clinc150_llm2slm_transfer"]["arms"]["llm2slm"]["method"]
    assert (llm2slm["client_kd_epochs"], llm2slm["client_kd_lr"]) == (
        lr["client_kd_epochs"], lr["client_kd_lr"])
    expected = copy.deepcopy(suite["base"])
    server_lr = expected["server"].pop("lr")
    client_lr = expected["clients"]["models"][0].pop("lr")
    expected["training"]["lr"] = client_lr
    expected["eval"]["clients"] = False
    fedcollm = loaded["clinc150_fedcollm_transfer"]
    assert fedcollm["base"] == expected
    method = fedcollm["arms"]["fedcollm"]["method"]
    assert method["llm_lr"] == server_lr and method["slm_lr"] == lr["client_kd_lr"]
    # the same runs: fold 2's data and the seeds a fold
    for name in loaded:
        s = load_suite(SUITES / f"{name}.yaml")
        assert s.seeds == [1000 * k + f for f in range(4) for k in (1, 2, 3)]
        cfg = next(iter(s.runs.values()))
        assert cfg.data.dataset.classes == "0-29" and cfg.data.max_test == 1000


def test_the_keep_pilots_run_the_transfer_suites_base_on_other_domains() -> None:
    """The FedMKT and FedCoLLM keep pilots: their transfer suite's base on CLINC150's
    kitchen-and-dining and home domains (intents 30-59, none of the keep suites' 0-29),
    one fold at 2 seeds, the paper's arm and no exchange beside the options, and a joint
    (gain and keep) primary on the transfer primary's receiver."""
    from fedkt.data.builtin import clinc150_domains
    from fedkt.evidence.suite import load_suite

    domains = clinc150_domains()
    assert (domains["kitchen_and_dining"], domains["home"]) == ("30-44", "45-59")
    for name, transfer, paper, receiver in (
            ("clinc150_fedmkt_keep_pilot", "clinc150_fedmkt_transfer", "fedmkt", "server"),
            ("clinc150_fedcollm_keep_pilot", "clinc150_fedcollm_transfer", "fedcollm",
             "global_slm")):
        pilot = yaml.safe_load((SUITES / f"{name}.yaml").read_text())
        other = yaml.safe_load((SUITES / f"{transfer}.yaml").read_text())
        base = pilot["base"]
        assert base["data"]["dataset"] == {"name": "clinc150", "classes": "30-59"}
        base["data"]["dataset"]["classes"] = "0-29"
        assert base == other["base"], name
        assert pilot["arms"][paper] == other["arms"][paper]
        assert pilot["arms"][f"{paper}_none"] == other["arms"][f"{paper}_none"]
        options = [a for a in pilot["arms"] if a not in (paper, f"{paper}_none")]
        assert len(options) >= 4 and all("receiving" in pilot["arms"][a]["method"]
                                         for a in options)
        s = load_suite(SUITES / f"{name}.yaml")
        assert s.seeds == [1000, 2000] and s.cfg.folds == [0]
        [first, second] = s.primary.parts  # gain over no exchange and the keeping, jointly
        assert first.lhs.group == second.lhs.group == receiver
        assert (first.rhs.arm, second.rhs.arm) == (f"{paper}_none", f"{paper}_none")
        assert (first.op, second.op, second.offset) == (">", ">=", -0.03)


# Each keep suite: (its transfer suite and pilot, the option's arm, the receiver's group,
# the metric it gains on and the one it keeps, and what its teacher controls add).
KEEP_SUITES = {
    "clinc150_fedmkt_keep": ("clinc150_fedmkt_transfer", "clinc150_fedmkt_keep_pilot",
                             "rehearse_anchor", "fedmkt_none", "server", "accuracy_cli",
                             "accuracy_srv", {"teacher_from": "clients", "client_kd": False}),
    "clinc150_fedcollm_keep": ("clinc150_fedcollm_transfer", "clinc150_fedcollm_keep_pilot",
                               "anchor", "fedcollm_none", "global_slm",
                               "accuracy_srv", "accuracy_cli", {"llm_kd": False}),
}


@pytest.mark.parametrize("name", sorted(KEEP_SUITES))
def test_a_keep_suite_runs_its_pilots_choice_on_eight_folds(name: str) -> None:
    """A CLINC150 keep suite: its transfer suite's base to the byte, its pilot's chosen
    option and the same option under shuffled and marginal teachers (their other side's
    learning skipped: no claim reads it), no exchange as the transfer suite runs it, a
    joint primary (the gain over the stronger teacher control, the keeping against no
    exchange), and folds 4-7 the same 4-fold cut of intents 60-89, none of the pilot's."""
    from fedkt.evidence.suite import load_suite

    transfer, pilot, option, none, group, gains, keeps, control = KEEP_SUITES[name]
    keep = yaml.safe_load((SUITES / f"{name}.yaml").read_text())
    other = yaml.safe_load((SUITES / f"{transfer}.yaml").read_text())
    chosen = yaml.safe_load((SUITES / f"{pilot}.yaml").read_text())["arms"][option]
    assert keep["base"] == other["base"]
    assert keep["arms"][option] == {**chosen, "eval": {"round0": True}}
    assert keep["arms"][none] == other["arms"][none]
    for teacher in ("shuffled", "marginal"):
        arm = keep["arms"][f"{option}_{teacher}"]
        assert arm == {"method": {**chosen["method"], "teacher": teacher, **control}}
    assert set(keep["arms"]) == {option, none, f"{option}_shuffled", f"{option}_marginal"}
    assert keep["fold_overrides"] == yaml.safe_load(
        (SUITES / "clinc150_fedmkt_keep.yaml").read_text())["fold_overrides"]
    suite = load_suite(SUITES / f"{name}.yaml")
    assert suite.cfg.folds == list(range(8)) and suite.cfg.seeds_per_fold == 2
    assert (suite.cfg.target_floor, suite.cfg.target_half_width) == (0.10, 0.06)
    gain, kept = suite.primary.parts
    assert (gain.lhs.arm, gain.lhs.group, gain.lhs.metric, gain.rhs.arms) == (
        option, group, gains, (f"{option}_shuffled", f"{option}_marginal"))
    assert (kept.lhs.group, kept.lhs.metric, kept.rhs.arm, kept.op, kept.offset) == (
        group, keeps, none, ">=", -0.03)


def test_the_keep_suites_folds_4_to_7_are_another_testbed() -> None:
    """Folds 4-7 (auto and commute, and travel): each fold's sides disjoint, 1,000 test
    records, the four test folds disjoint; folds 0-3 are the transfer suite's own runs."""
    from fedkt.evidence.suite import load_suite

    domains = clinc150_domains()
    assert (domains["auto_and_commute"], domains["travel"]) == ("60-74", "75-89")
    suite = load_suite(SUITES / "clinc150_fedmkt_keep.yaml")
    plain = load_suite(SUITES / "clinc150_fedmkt_transfer.yaml")
    tests: dict[int, set[str]] = {}
    for seed, fold in suite.fold_of.items():
        cfg = suite.runs[("fedmkt_none", seed)]
        if fold < 4:  # the transfer suite's own runs (--runs-from takes them)
            other = plain.runs[("fedmkt_none", seed)].model_dump()
            assert {**cfg.model_dump(), "output_dir": None} == {**other, "output_dir": None}
            continue
        data = cfg.data
        assert (data.dataset.classes, data.split.fold, data.split.fold_seed) == (
            "60-89", fold - 4, 1)
        if seed >= 2000:
            continue
        fd = client_splits(data, 2, seed)
        assert set(fd.class_order[:15]).isdisjoint(fd.class_order[15:])
        assert {r["label"] for r in fd.server} == set(fd.class_order[:15])
        assert {r["label"] for p in fd.private for r in p} == set(fd.class_order[15:])
        assert len(fd.test) == 1000 and len(fd.public) == 500
        tests[fold] = {r["text"] for r in fd.test}
    assert sum(len(t) for t in tests.values()) == len(set().union(*tests.values())) == 4000
