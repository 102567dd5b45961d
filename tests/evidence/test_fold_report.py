"""Seeds inside folds: the three-level bootstrap (folds, seeds within a fold, items) on
simulated suites with known fold, seed and item noise; a fast numpy simulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedkt.evidence.stats import Sample, _mean_metric, bootstrap_difference

METRIC = _mean_metric("accuracy")
ROOT = Path(__file__).resolve().parents[2]


def _suite(rng, folds, seeds, items, fold_sd, seed_sd, item_sd, effect):
    """Per run (fold, seed): a Sample of item scores (effect + fold + seed + item noise)
    against a zero baseline on the same items; the runs' folds."""
    ids = [str(i) for i in range(items)]
    zero = Sample(ids, [np.stack([np.zeros(items), np.ones(items)], 1)], METRIC)
    a, b, units = [], [], []
    for f in range(folds):
        u = rng.normal(0, fold_sd)
        for _ in range(seeds):
            x = effect + u + rng.normal(0, seed_sd) + rng.normal(0, item_sd, items)
            a.append(Sample(ids, [np.stack([x, np.ones(items)], 1)], METRIC))
            b.append(zero)
            units.append(f)
    return a, b, units


def test_the_fold_is_the_unit():
    rng = np.random.default_rng(0)
    a, b, units = _suite(rng, 4, 2, 30, 0.2, 0.05, 0.3, 0.1)
    d = bootstrap_difference(a, b, units=units, reps=300)
    assert d.seeds == 4 and len(d.per_seed) == 4
    assert d.resampling == "folds, seeds within a fold, items"
    runs = [float(s.value()) for s in a]
    assert d.per_seed == pytest.approx([np.mean(runs[2 * f: 2 * f + 2]) for f in range(4)])
    assert d.estimate == pytest.approx(np.mean(runs))
    assert d.per_run == pytest.approx(runs)
    flat = bootstrap_difference(a, b, reps=300)  # without units: each seed its own unit
    assert flat.seeds == 8 and flat.resampling == "seeds, items"
    with pytest.raises(ValueError, match="units"):
        bootstrap_difference(a, b, units=units[:-1], reps=300)


def test_coverage_is_near_95_percent_when_folds_vary():
    # 200 simulated suites: 20 folds x 2 seeds x 40 items, fold SD 0.15, seed SD 0.05,
    # item SD 0.5 (the fold the main source, as in the published suites).  Measured on
    # this seed: 0.935 (the folds' t-interval 0.96).  A percentile interval over 4 folds
    # covers less (0.84; the t-interval 0.975), which is why a verdict also needs the
    # folds' t-interval.
    rng = np.random.default_rng(1)
    hits = 0
    for k in range(200):
        a, b, units = _suite(rng, 20, 2, 40, 0.15, 0.05, 0.5, 0.1)
        d = bootstrap_difference(a, b, units=units, reps=300, seed=k)
        hits += d.low <= 0.1 <= d.high
    assert 0.90 <= hits / 200 <= 0.99


def test_without_fold_or_seed_variance_it_is_the_item_level_interval():
    # No fold or seed effect: all the noise is the items'.  The three-level interval must
    # then be about as wide as the items' own (all runs' items resampled together).
    # Measured over these 40 suites: 1.11 times (a shrink factor is the positive part of an
    # estimated variance, so it is above 0 in about half the suites); resampling every
    # level unshrunk gives 1.54 times.
    rng = np.random.default_rng(2)
    ratios = []
    for k in range(40):
        a, b, units = _suite(rng, 10, 2, 40, 0.0, 0.0, 0.5, 0.1)
        d = bootstrap_difference(a, b, units=units, reps=400, seed=k)
        ids = [str(i) for i in range(800)]
        pooled = Sample(ids, [np.concatenate([s.parts[0] for s in a])], METRIC)
        zero = Sample(ids, [np.concatenate([s.parts[0] for s in b])], METRIC)
        items = bootstrap_difference([pooled], [zero], reps=400, seed=k)
        ratios.append((d.high - d.low) / (items.high - items.low))
    assert 0.95 <= float(np.mean(ratios)) <= 1.2


# --------------------------------------------------------------- a suite's folds and seeds


def _fold_suite(tmp_path, **extra):
    import yaml

    from fedkt.evidence.suite import load_suite

    data = yaml.safe_load((ROOT / "configs" / "suites" / "quick.yaml").read_text())
    data["base"]["data"]["split"] = {"scheme": "holdout", "folds": 4}
    data.pop("seeds")
    data.update(extra)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_suite(path, tmp_path / "out")


def test_a_suite_runs_seeds_inside_its_folds(tmp_path):
    suite = _fold_suite(tmp_path, folds=[0, 1, 2, 3], seeds_per_fold=2)
    assert suite.seeds == [1000, 2000, 1001, 2001, 1002, 2002, 1003, 2003]
    assert len(suite.runs) == 2 * 8
    for (arm, seed), cfg in suite.runs.items():
        fold = suite.fold_of[seed]
        assert cfg.seed == seed and cfg.data.split.fold == fold == seed % 1000
        assert cfg.seed not in (fold, cfg.data.split.fold_seed)  # a training seed of its own
        assert suite.run_dir(arm, seed) == tmp_path / "out" / arm / f"fold_{fold}" / \
            f"seed_{seed}"


def test_a_fold_suite_runs_fold_by_fold(tmp_path):
    """Whole folds first (arms in file order inside a fold, then seeds), so a suite stopped
    part-way leaves complete folds; without folds, arm by arm as before."""
    from fedkt.evidence.suite import plan_runs

    suite = _fold_suite(tmp_path, folds=[0, 1, 2], seeds_per_fold=2)
    order = [(suite.fold_of[seed], arm, seed) for arm, seed, _, _ in plan_runs(suite)]
    assert order == [(f, arm, s) for f in (0, 1, 2) for arm in suite.cfg.arms
                     for s in (1000 + f, 2000 + f)]
    plain = _fold_suite(tmp_path, seeds=[0, 1])  # no folds: seeds are the unit
    assert [(arm, seed) for arm, seed, _, _ in plan_runs(plain)] == [
        (arm, s) for arm in plain.cfg.arms for s in (0, 1)]


def test_fold_keys_are_checked(tmp_path):
    from fedkt.config import ConfigError

    with pytest.raises(ConfigError, match="seeds_per_fold: needs folds"):
        _fold_suite(tmp_path, seeds_per_fold=2)
    with pytest.raises(ConfigError, match="seeds: with folds"):
        _fold_suite(tmp_path, folds=[0, 1], seeds=[0, 1])
    with pytest.raises(ConfigError, match="fold: 5 does not exist"):
        _fold_suite(tmp_path, folds=[0, 5])
    with pytest.raises(ConfigError, match="repeat a fold"):
        _fold_suite(tmp_path, folds=[0, 0])


def test_fold_overrides_give_a_fold_its_own_config(tmp_path):
    """Folds 2-3 as folds 0-1 of another cut (fold_seed 7): each such run tests the fold
    its override names, keeps its suite fold's seed and folder, and the others are as
    without overrides; an override of a fold the suite lacks is refused by name."""
    from fedkt.config import ConfigError

    other = {"data.split.fold_seed": 7}
    suite = _fold_suite(tmp_path, folds=[0, 1, 2, 3], seeds_per_fold=2, fold_overrides={
        2: {**other, "data.split.fold": 0}, 3: {**other, "data.split.fold": 1}})
    plain = _fold_suite(tmp_path, folds=[0, 1, 2, 3], seeds_per_fold=2)
    assert suite.seeds == plain.seeds and suite.fold_of == plain.fold_of
    for (arm, seed), cfg in suite.runs.items():
        fold = suite.fold_of[seed]
        split = cfg.data.split
        if fold < 2:
            assert cfg == plain.runs[(arm, seed)]
        else:
            assert (split.fold, split.fold_seed) == (fold - 2, 7) and cfg.seed == seed
            assert suite.run_dir(arm, seed).parent.name == f"fold_{fold}"
    with pytest.raises(ConfigError, match=r"fold_overrides: fold 5 is not one of"):
        _fold_suite(tmp_path, folds=[0, 1], fold_overrides={5: other})
    with pytest.raises(ConfigError, match=r"fold_overrides: fold 1: give a mapping"):
        _fold_suite(tmp_path, folds=[0, 1], fold_overrides={1: {}})
    with pytest.raises(ConfigError, match=r"fold: 4 does not exist"):  # names no cut's fold
        _fold_suite(tmp_path, folds=[0, 4], fold_overrides={4: other})


def test_seeds_of_one_fold_share_its_test_items_not_their_order():
    from fedkt.config.data_schema import SplitConfig
    from fedkt.data.dataset import Dataset
    from fedkt.data.splits import make_splits

    records = [{"id": str(i), "text": f"r{i}", "label": i % 3} for i in range(40)]
    data = Dataset("toy", "classification", records, ["a", "b", "c"])
    split = SplitConfig(scheme="holdout", folds=4, fold=2)
    one, two = make_splits(data, split, 2, 1002), make_splits(data, split, 2, 2002)
    assert [r["id"] for r in one["test"]] == [r["id"] for r in two["test"]]
    assert len(one["test"]) == 10
    train = [r["id"] for r in one["public"] + one["private_pool"]]
    assert train != [r["id"] for r in two["public"] + two["private_pool"]]
    assert sorted(train) == sorted(r["id"] for r in two["public"] + two["private_pool"])
    legacy = make_splits(data, SplitConfig(scheme="holdout", folds=4), 2, 2)  # fold = seed
    assert [r["id"] for r in legacy["test"]] == [r["id"] for r in one["test"]]


def test_a_fold_suites_report_counts_folds(tmp_path):
    """Run folders as a suite with 4 folds x 2 seeds leaves them (prediction files with a
    known number right), reported: the verdict's units are the 4 fold means."""
    import json

    import yaml

    from fedkt.eval.predictions import Predictions, write_predictions
    from fedkt.evidence.suite import load_suite
    from fedkt.evidence.suite_report import report_suite

    data = {"name": "folds", "folds": [0, 1, 2, 3], "seeds_per_fold": 2, "baseline": "b",
            "base": {"name": "x", "rounds": 1, "method": {"name": "fedavg"},
                     "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
                     "data": {"dataset": {"name": "intent_recognition"},
                              "split": {"scheme": "holdout", "folds": 4}}},
            "arms": {"a": {}, "b": {}}, "metrics": ["accuracy"], "groups": ["server"],
            "primary": "a.server.accuracy > b.server.accuracy", "target_floor": 0.5,
            "target_half_width": 0.01, "bootstrap": 500}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(data))
    suite = load_suite(tmp_path / "suite.yaml", tmp_path)
    for (arm, seed), _cfg in suite.runs.items():
        fold, r = suite.fold_of[seed], seed // 1000 - 1
        right = 20 + 4 * fold + r if arm == "a" else 10 + fold
        run = suite.run_dir(arm, seed)
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump({"name": arm, "seed": seed}))
        (run / "metrics.jsonl").write_text(json.dumps(
            {"round": 1, "participant": "server", "split": "test", "accuracy": right / 40,
             "wall_time": 10.0}) + "\n")
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "latest.json").write_text('{"round": 1}')
        ids = [f"{fold}-{i}" for i in range(40)]
        table = Predictions({"id": ids, "gold": [0] * 40,
                             "pred": [0] * right + [1] * (40 - right)},
                            {"task": "classification"})
        write_predictions(run, 1, "server", {"": table})
    text = report_suite(tmp_path)
    assert "- folds: [0, 1, 2, 3], 2 training seed(s) in each" in text
    assert "- resampling: folds, then seeds within a fold, then each seed's test items" in text
    claim = json.loads((tmp_path / "suite.json").read_text())["claims"][0]
    want = [(10 + 3 * f + 0.5) / 40 for f in range(4)]  # each fold: a's 2 seeds vs b
    assert list(claim["per_seed"]) == ["0", "1", "2", "3"]
    assert list(claim["per_seed"].values()) == pytest.approx(want)
    assert claim["resampling"] == "folds, seeds within a fold, items"
    # each run's own difference under its fold and seed: a's seed r of fold f has
    # 20 + 4f + r right against b's 10 + f
    assert claim["per_run"] == {str(f): {str(1000 * (r + 1) + f): pytest.approx(
        (10 + 3 * f + r) / 40) for r in range(2)} for f in range(4)}
    assert claim["verdict"] == "reproduced" and claim["value"] == pytest.approx(np.mean(want))
    assert claim["targets"] == {"floor": 0.5, "floor_met": True, "half_width": 0.01,
                                "half_width_met": False}
    assert "### Design targets" in text


def test_a_runs_fold_is_checked_apart_from_its_seed():
    from pydantic import ValidationError

    from fedkt.config.data_schema import SplitConfig

    with pytest.raises(ValidationError, match="fold: names a test fold, but folds is not set"):
        SplitConfig(scheme="holdout", fold=1)
    with pytest.raises(ValidationError, match="fold: 4 does not exist"):
        SplitConfig(scheme="holdout", folds=4, fold=4)
    assert SplitConfig(scheme="holdout", folds=4, fold=3).fold == 3
