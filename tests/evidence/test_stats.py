"""Paired statistics on constructed prediction tables whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from fedkt.eval.metrics import macro_f1, precision_recall_f1
from fedkt.eval.predictions import Predictions
from fedkt.evidence.claims import (
    CONTRADICTED,
    NOT_RESOLVED,
    REPRODUCED,
    ClaimError,
    parse_claim,
    verdict,
)
from fedkt.evidence.stats import (
    bootstrap_difference,
    components,
    mcnemar_exact,
    normal_difference,
    sample,
)


def mc_table(right: np.ndarray, n_choices: int = 4, offset: int = 0) -> Predictions:
    """A multiple-choice table: gold is 0, the prediction 0 where ``right`` else 1."""
    n = len(right)
    ids = [f"item{(i + offset) % n}" for i in range(n)]
    order = [(i + offset) % n for i in range(n)]
    pred = [0 if right[j] else 1 for j in order]
    scores = [[0.0 if p == c else -1.0 for c in range(n_choices)] for p in pred]
    return Predictions({"id": ids, "gold": [0] * n, "pred": pred, "pred_norm": pred,
                        "scores": scores}, {"task": "multiple_choice"})


def base_right(n: int = 1000, acc: float = 0.5, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random(n) < acc


def test_identical_predictions_give_zero_and_not_resolved():
    right = base_right()
    a = sample([mc_table(right)], "accuracy")
    b = sample([mc_table(right, offset=17)], "accuracy")  # same items, other order
    d = bootstrap_difference([a], [b], reps=500)
    assert d.estimate == 0.0 and d.low == 0.0 and d.high == 0.0
    claim = parse_claim("x.clients.accuracy > y.clients.accuracy")
    assert verdict(claim, d.low, d.high) == NOT_RESOLVED
    assert mcnemar_exact(a.parts[0][:, 0] > 0, b.aligned(a.ids).parts[0][:, 0] > 0)[2] == 1.0


def test_sixty_more_right_and_wrong_nowhere_else_is_reproduced():
    right = base_right()
    better = right.copy()
    better[np.flatnonzero(~right)[:60]] = True  # right on 60 more, wrong nowhere else
    a, b = sample([mc_table(better)], "accuracy"), sample([mc_table(right)], "accuracy")
    d = bootstrap_difference([a], [b])
    assert d.estimate == pytest.approx(0.060)
    assert d.low > 0.03 and d.high < 0.09
    assert verdict(parse_claim("a.server.accuracy > b.server.accuracy"), d.low, d.high) \
        == REPRODUCED
    # The reverse claim is contradicted by the same interval.
    assert verdict(parse_claim("a.server.accuracy < b.server.accuracy"), d.low, d.high) \
        == CONTRADICTED
    b_count, c_count, p = mcnemar_exact(a.parts[0][:, 0] > 0, b.parts[0][:, 0] > 0)
    assert (b_count, c_count) == (60, 0)
    assert p == pytest.approx(2 * 0.5 ** 60, rel=1e-12)


def test_ci_matches_a_hand_computation_for_a_fixed_seed():
    rng = np.random.default_rng(3)
    ra, rb = rng.random(200) < 0.6, rng.random(200) < 0.5
    a, b = sample([mc_table(ra)], "accuracy"), sample([mc_table(rb)], "accuracy")
    d = bootstrap_difference([a], [b], reps=300, seed=11)
    hand = np.random.default_rng(11)
    idx = hand.integers(0, 200, size=(300, 200))
    diffs = [ra[row].mean() - rb[row].mean() for row in idx]
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    assert d.low == pytest.approx(lo, abs=1e-12) and d.high == pytest.approx(hi, abs=1e-12)
    assert d.estimate == pytest.approx(ra.mean() - rb.mean())


def test_normal_approximation_agrees_with_the_bootstrap():
    rng = np.random.default_rng(5)
    ra = rng.random(1000) < 0.62
    rb = np.where(rng.random(1000) < 0.8, ra, rng.random(1000) < 0.55)  # correlated runs
    a, b = sample([mc_table(ra)], "accuracy"), sample([mc_table(rb)], "accuracy")
    boot = bootstrap_difference([a], [b], reps=4000, seed=2)
    normal = normal_difference(a, b)
    assert normal.estimate == pytest.approx(boot.estimate)
    width = boot.high - boot.low
    assert abs(normal.low - boot.low) < 0.1 * width
    assert abs(normal.high - boot.high) < 0.1 * width
    # Pairing matters: the unpaired interval (two independent accuracies) is wider.
    unpaired = 1.96 * math.sqrt(ra.mean() * (1 - ra.mean()) / 1000
                                + rb.mean() * (1 - rb.mean()) / 1000)
    assert width < 2 * unpaired


@pytest.mark.parametrize("b_count, c_count", [(0, 0), (3, 9), (10, 10), (40, 17), (1, 0)])
def test_mcnemar_matches_the_exact_binomial(b_count, c_count):
    ra = [True] * b_count + [False] * c_count + [True] * 5
    rb = [False] * b_count + [True] * c_count + [True] * 5
    b, c, p = mcnemar_exact(ra, rb)
    assert (b, c) == (b_count, c_count)
    expected = 1.0 if b + c == 0 else binomtest(min(b, c), b + c, 0.5).pvalue
    assert p == pytest.approx(expected, rel=1e-9)


def test_f1_and_macro_f1_components_reproduce_the_metrics():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 3, 300).tolist()
    pred = [g if rng.random() < 0.6 else int(rng.integers(0, 3)) for g in gold]
    table = Predictions({"id": list(range(300)), "gold": gold, "pred": pred},
                        {"task": "classifier", "positive_label": 1})
    for name, want in [("f1", precision_recall_f1(pred, gold, 1)[2]),
                       ("precision", precision_recall_f1(pred, gold, 1)[0]),
                       ("recall", precision_recall_f1(pred, gold, 1)[1]),
                       ("macro_f1", macro_f1(pred, gold))]:
        comp, metric = components(table, name)
        assert float(metric.fn(comp.sum(0))) == pytest.approx(want)


def test_seed_groups_bootstrap_over_seeds_and_examples():
    rng = np.random.default_rng(9)
    a_runs, b_runs = [], []
    for _ in range(3):
        rb = rng.random(400) < 0.5
        ra = rb | (rng.random(400) < 0.1)  # A is never worse than B on an item
        a_runs.append(sample([mc_table(ra)], "accuracy"))
        b_runs.append(sample([mc_table(rb)], "accuracy"))
    d = bootstrap_difference(a_runs, b_runs, reps=1000)
    per_seed = [float(x.value() - y.value()) for x, y in zip(a_runs, b_runs, strict=True)]
    assert d.seeds == 3 and d.estimate == pytest.approx(np.mean(per_seed))
    assert 0 < d.low < d.estimate < d.high
    # One seed alone has a wider interval than the three together.
    one = bootstrap_difference(a_runs[:1], b_runs[:1], reps=1000)
    assert (one.high - one.low) > (d.high - d.low)


def test_different_examples_are_refused():
    a = sample([mc_table(base_right(100))], "accuracy")
    other = mc_table(base_right(100))
    other.columns["id"] = [f"other{i}" for i in range(100)]
    with pytest.raises(ValueError, match="same examples"):
        bootstrap_difference([a], [sample([other], "accuracy")])


def test_claims_parse_factors_offsets_and_rounds():
    c = parse_claim("fedmkt.server.accuracy >= 0.9 * centralized.server.accuracy")
    assert c.factor == 0.9 and c.op == ">=" and c.rhs.arm == "centralized"
    c = parse_claim("koala_homo.server.accuracy>=baseline.server.accuracy - 0.07")
    assert c.offset == pytest.approx(-0.07)
    c = parse_claim("fedavg.clients.accuracy > fedavg@0.clients.accuracy")
    assert c.rhs.round == 0 and c.lhs.round is None
    assert parse_claim("a.server.accuracy < 0.5").rhs == 0.5
    with pytest.raises(ClaimError, match="does not parse"):
        parse_claim("fedmkt.accuracy > standalone")
    with pytest.raises(ClaimError, match="unknown arm"):
        parse_claim("x.server.accuracy > y.server.accuracy", {"x"})


def test_equivalence_claims_need_the_whole_ci_inside_the_tolerance():
    """``~=``: a control at a constant (chance, its round 0) within a tolerance."""
    c = parse_claim("shuffled.server.accuracy ~= 0.2 +- 0.1")
    assert (c.op, c.rhs, c.tolerance) == ("~=", 0.2, 0.1)
    assert parse_claim("a.server.accuracy ~= b@0.server.accuracy ± 0.05").rhs.round == 0
    for bad in ("a.server.accuracy ~= 0.2", "a.server.accuracy > 0.2 +- 0.1",
                "a.server.accuracy ~= 0.2 +- 0"):
        with pytest.raises(ClaimError):
            parse_claim(bad)
    # 1000 items at accuracy 0.5 (the CI of D = acc - constant is about +-0.03 wide).
    acc = sample([mc_table(base_right(1000, 0.5))], "accuracy")
    mean = float(acc.parts[0][:, 0].mean())

    def decide(text: str) -> str:
        claim = parse_claim(text)
        d = bootstrap_difference([acc], [acc], factor=0.0, offset=claim.rhs, reps=500)
        assert d.estimate == pytest.approx(mean - claim.rhs)
        return verdict(claim, d.low, d.high)

    assert decide("a.server.accuracy ~= 0.5 +- 0.1") == REPRODUCED
    assert decide("a.server.accuracy ~= 0.8 +- 0.1") == CONTRADICTED  # far from 0.8
    assert decide("a.server.accuracy ~= 0.2 +- 0.1") == CONTRADICTED
    # A tolerance narrower than the CI proves nothing either way.
    assert decide(f"a.server.accuracy ~= {mean:.3f} +- 0.01") == NOT_RESOLVED
    # Few items: the same mean, a CI too wide to show equivalence within 0.1.
    few = sample([mc_table(base_right(20, 0.5, seed=4))], "accuracy")
    m20 = float(few.parts[0][:, 0].mean())
    d = bootstrap_difference([few], [few], factor=0.0, offset=m20, reps=500)
    assert verdict(parse_claim(f"a.server.accuracy ~= {m20} +- 0.1"), d.low, d.high) \
        == NOT_RESOLVED
