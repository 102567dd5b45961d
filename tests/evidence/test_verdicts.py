"""A suite's verdict rules on synthetic per-seed differences with known answers: the
seed count, sign agreement, the seeds' t-interval, the detection floor, primary claims."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedkt.config import ConfigError
from fedkt.evidence.claims import (
    CONTRADICTED,
    FRAGILE,
    NOT_RESOLVED,
    REPRODUCED,
    decide,
    parse_claim,
)
from fedkt.evidence.stats import Difference, Sample, bootstrap_difference, seed_interval
from fedkt.evidence.suite import load_suite

GT = parse_claim("a.server.accuracy > b.server.accuracy")
LT = parse_claim("a.server.accuracy < b.server.accuracy")
EQ = parse_claim("a.server.accuracy ~= b.server.accuracy +- 0.05")


def _decide(claim, per_seed, low=0.01, high=0.2):
    return decide(claim, low, high, per_seed, seed_interval=seed_interval(per_seed))


def test_seed_interval_is_students_t_by_hand():
    values = [0.10, 0.20, 0.05, 0.15]
    low, high = seed_interval(values)
    mean, sd = 0.125, float(np.std(values, ddof=1))
    half = 3.182446305284263 * sd / 2  # t(0.975, 3), from tables
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=1e-12)
    assert seed_interval([0.3]) is None
    # 90%: t(0.95, 3) = 2.353363
    lo90, hi90 = seed_interval(values, 0.90)
    assert hi90 - lo90 == pytest.approx(2 * 2.353363435 * sd / 2, abs=1e-8)


def test_reproduced_needs_four_seeds_that_agree():
    assert _decide(GT, [0.10, 0.20, 0.05, 0.15]).verdict == REPRODUCED
    few = _decide(GT, [0.10, 0.20])
    assert few.verdict == FRAGILE and "2 seeds (4 needed)" in few.reason
    # one seed against is allowed when the t-interval still agrees
    one_against = _decide(GT, [0.30, 0.25, 0.35, -0.01, 0.28])
    assert one_against.verdict == REPRODUCED, one_against
    two_against = _decide(GT, [0.30, 0.25, -0.02, -0.01, 0.28])
    assert two_against.verdict == FRAGILE and "2 of 5 seeds disagree" in two_against.reason
    wide = _decide(GT, [0.40, 0.01, 0.02, -0.30])  # 1 against, but the t-interval spans 0
    assert wide.verdict == FRAGILE and "t-interval" in wide.reason


def test_less_than_and_contradicted_mirror():
    assert _decide(LT, [-0.1, -0.2, -0.05, -0.15], -0.2, -0.01).verdict == REPRODUCED
    # the interval below 0 for '>' is contradicted, if the seeds carry it
    assert _decide(GT, [-0.1, -0.2, -0.05, -0.15], -0.2, -0.01).verdict == CONTRADICTED
    got = _decide(GT, [-0.1, 0.2, 0.05, -0.15], -0.2, -0.01)
    assert got.verdict == FRAGILE and got.reason.startswith("contradicted by the interval")


def test_equivalence_counts_seeds_inside_the_tolerance():
    assert decide(EQ, -0.02, 0.02, [0.01, -0.01, 0.0, 0.02],
                  seed_interval=seed_interval([0.01, -0.01, 0.0, 0.02])).verdict == REPRODUCED
    got = decide(EQ, -0.02, 0.02, [0.01, -0.09, 0.0, 0.08])
    assert got.verdict == FRAGILE and "2 of 4" in got.reason


def test_not_resolved_names_the_detection_floor():
    below = decide(GT, -0.05, 0.09, [0.02] * 4, estimate=0.02, floor=0.10)
    assert below.verdict == NOT_RESOLVED and "below the detection floor 0.100" in below.reason
    above = decide(GT, -0.01, 0.4, [0.2] * 4, estimate=0.2, floor=0.10)
    assert above.verdict == NOT_RESOLVED and "floor" not in above.reason


def test_detection_floor_from_the_wider_interval():
    d = Difference(0.1, 0.0, 0.2, 0.95, 100, 4, 0.5, 0.4, (0.1, 0.1, 0.1, 0.1))
    z95, z80 = 1.959963984540054, 0.8416212335729143
    assert d.floor() == pytest.approx(0.1 * (1 + z80 / z95), rel=1e-9)  # seeds agree: no spread
    spread = Difference(0.1, 0.0, 0.2, 0.95, 100, 4, 0.5, 0.4, (0.0, 0.4, -0.2, 0.2))
    lo, hi = seed_interval(spread.per_seed)
    assert spread.floor() == pytest.approx((hi - lo) / 2 * (1 + z80 / z95), rel=1e-9)


def test_bootstrap_keeps_each_seeds_difference():
    from fedkt.evidence.stats import _mean_metric

    rng = np.random.default_rng(3)
    sides_a, sides_b, expected = [], [], []
    for _ in range(4):
        right_a = (rng.random(50) < 0.7).astype(float)
        right_b = (rng.random(50) < 0.5).astype(float)
        ids = [f"x{i}" for i in range(50)]
        sides_a.append(Sample(ids, [np.stack([right_a, np.ones(50)], 1)], _mean_metric("accuracy")))
        sides_b.append(Sample(ids, [np.stack([right_b, np.ones(50)], 1)], _mean_metric("accuracy")))
        expected.append(right_a.mean() - right_b.mean())
    d = bootstrap_difference(sides_a, sides_b, reps=200)
    assert d.per_seed == pytest.approx(tuple(expected), abs=1e-12)
    assert d.estimate == pytest.approx(float(np.mean(expected)), abs=1e-12)
    assert math.isfinite(d.floor())


def _suite_file(tmp_path: Path, **extra) -> Path:
    data = {"name": "s", "base": str(Path(__file__).resolve().parents[2] / "configs"
                                     / "quickstart.yaml"),
            "seeds": [0], "arms": {"fedavg": {}, "fedavg2": {}},
            "claims": ["fedavg.server.accuracy > fedavg2.server.accuracy",
                       "fedavg.clients.accuracy > fedavg2.clients.accuracy"], **extra}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_primary_claim_comes_first_once(tmp_path):
    suite = load_suite(_suite_file(
        tmp_path, primary="fedavg.clients.accuracy > fedavg2.clients.accuracy"))
    assert suite.primary is not None and suite.claims[0] is suite.primary
    assert [c.text for c in suite.claims] == [
        "fedavg.clients.accuracy > fedavg2.clients.accuracy",
        "fedavg.server.accuracy > fedavg2.server.accuracy"]
    assert load_suite(_suite_file(tmp_path)).primary is None


def test_primary_claim_is_checked_like_the_others(tmp_path):
    with pytest.raises(ConfigError, match="unknown arm"):
        load_suite(_suite_file(tmp_path, primary="nope.clients.accuracy > fedavg.clients.accuracy"))


def test_an_exact_run_level_quantity_needs_two_agreeing_seeds_not_four():
    claim = parse_claim("a.server.size >= 0.976")
    assert decide(claim, -0.1, -0.1, [-0.1, -0.1], fixed=True).verdict == CONTRADICTED
    assert decide(claim, 0.2, 0.2, [0.2, 0.2, 0.2], fixed=True).verdict == REPRODUCED
    one = decide(claim, 0.2, 0.2, [0.2], fixed=True)  # one seed cannot show seeds don't move it
    assert one.verdict == FRAGILE and "1 seed (4 needed)" in one.reason


def test_a_zero_width_per_example_interval_from_one_fold_is_not_decided():
    # docs/suites/fedmkt_receiving_pilot: two arms right on the same 64 items gave the
    # interval [+0.03, +0.03] from one fold; before the rule fix this read "reproduced".
    claim = parse_claim("a.server.accuracy_srv >= b.server.accuracy_srv - 0.03")
    got = decide(claim, 0.03, 0.03, [0.03])
    assert got.verdict == FRAGILE and "1 seed (4 needed)" in got.reason
    assert decide(claim, 0.03, 0.03, [0.03] * 3).verdict == FRAGILE  # 3 < MIN_SEEDS
    assert decide(claim, 0.03, 0.03, [0.03] * 4).verdict == REPRODUCED


def test_max_of_two_controls_is_the_larger_on_each_resample():
    """``A > max(B, C)``: on each resample the larger of B and C, paired item by item; by
    hand with the same index draws."""
    from fedkt.evidence.stats import Largest, _mean_metric

    rng = np.random.default_rng(7)
    n, reps = 60, 300
    right = {k: (rng.random(n) < p).astype(float) for k, p in (("a", .8), ("b", .5), ("c", .55))}
    ids = [f"x{i}" for i in range(n)]

    def side(key):
        return Sample(ids, [np.stack([right[key], np.ones(n)], 1)], _mean_metric("accuracy"))

    d = bootstrap_difference([side("a")], [Largest((side("b"), side("c")))], reps=reps, seed=2)
    idx = np.random.default_rng(2).integers(0, n, size=(reps, n))
    by_hand = right["a"][idx].mean(1) - np.maximum(right["b"][idx].mean(1),
                                                   right["c"][idx].mean(1))
    lo, hi = np.quantile(by_hand, [0.025, 0.975])
    assert (d.low, d.high) == pytest.approx((lo, hi), abs=1e-12)
    assert d.estimate == pytest.approx(right["a"].mean() - max(right["b"].mean(),
                                                               right["c"].mean()))
    claim = parse_claim("a.server.accuracy > max(b, c).server.accuracy", {"a", "b", "c"})
    assert claim.arms() == {"a", "b", "c"} and str(claim.rhs) == "max(b, c).server.accuracy"
    with pytest.raises(Exception, match="does not parse"):
        parse_claim("max(a, b).server.accuracy > c.server.accuracy")


def test_a_fold_suites_reasons_count_folds_not_seeds():
    # a suite whose unit is the fold passes each fold's mean: its reasons name folds
    claim = parse_claim("a.server.accuracy > b.server.accuracy")
    one = decide(claim, 0.6, 0.8, [0.7], unit="fold")
    assert one.verdict == FRAGILE and one.reason.endswith("but 1 fold (4 needed)")
    split = decide(claim, 0.1, 0.3, [0.2, -0.1, -0.2, 0.4, 0.5], unit="fold")
    assert split.verdict == FRAGILE and "2 of 5 folds disagree" in split.reason
    assert "seed" not in one.reason + split.reason
