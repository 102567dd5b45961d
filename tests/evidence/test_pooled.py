"""The pooled verdict across kernel settings (blocked by fold): known answers, its
false-positive rate at a null effect and its power against "both must win", simulated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedkt.evidence.across import across_report
from fedkt.evidence.claims import CONTRADICTED, REPRODUCED, decide, parse_claim
from fedkt.evidence.pooled import align_folds, pooled_decision, simulate_across, t_rule
from fedkt.evidence.stats import seed_interval

CLAIM = "a.server.accuracy > b.server.accuracy"


def test_pooled_is_students_t_over_the_fold_means_by_hand():
    fp32 = {"0": 0.10, "1": 0.30, "2": 0.20, "3": 0.00}
    bf16 = {"0": 0.20, "1": 0.10, "2": 0.20, "3": 0.20}
    got = pooled_decision(CLAIM, [fp32, bf16])
    means = [0.15, 0.20, 0.20, 0.10]
    sd = float(np.std(means, ddof=1))  # 0.0478714
    half = 3.182446305284263 * sd / 2  # t(0.975, 3)
    assert got.fold_means == pytest.approx(means)
    assert (got.estimate, got.low, got.high) == pytest.approx((0.1625, 0.1625 - half,
                                                               0.1625 + half))
    assert got.decision.verdict == REPRODUCED and got.aligned_by == "fold label"


def test_folds_are_matched_by_label_then_by_position():
    by_label = align_folds([{"1": 1.0, "0": 0.0}, {"0": 2.0, "1": 3.0}])
    assert by_label[1] == "fold label" and by_label[0].tolist() == [[1.0, 3.0], [0.0, 2.0]]
    by_position = align_folds([{"#0": 1.0, "#1": 0.0}, {"0": 2.0, "1": 3.0}])
    assert by_position[1] == "position" and by_position[0].tolist() == [[1.0, 2.0], [0.0, 3.0]]
    assert align_folds([{"0": 1.0}, {"0": 1.0, "1": 2.0}]) is None
    assert pooled_decision(CLAIM, [{"0": 1.0}, {"0": 1.0}]) is None  # one fold: no interval


def test_the_vectorised_rule_is_decide_on_the_t_interval():
    rng = np.random.default_rng(3)
    claim = parse_claim(CLAIM)
    draws = rng.normal(0.1, 0.15, size=(300, 4))
    fast = t_rule(draws)
    for row, got in zip(draws, fast, strict=True):
        ci = seed_interval(row.tolist())
        word = decide(claim, *ci, row.tolist(), seed_interval=ci).verdict
        assert got == {REPRODUCED: 1, CONTRADICTED: -1}.get(word, 0), row
    assert t_rule(draws[:, :3]).tolist() == [0] * 300  # 3 folds never decide


def test_pooled_false_positive_rate_at_a_null_effect():
    # 2,000 simulated suites: 4 folds x 2 settings, fold SD 0.15 (shared by the settings,
    # as a split and seed are), each setting's own noise SD 0.10, true difference 0.
    rates = simulate_across(0.0, sims=2000, seed=11)
    assert rates["pooled_decided"] <= 0.06  # either side decided: the nominal rate is 0.05
    assert rates["pooled"] <= 0.035  # one-sided: nominal 0.025
    assert rates["machine_dependent"] <= 0.01


def test_pooled_has_more_power_than_both_must_win():
    # The same simulated design at a true difference of 0.25 (the fold SD 0.15): the
    # pooled verdict reproduces in about 53% of suites, both settings' own in about 33%.
    rates = simulate_across(0.25, sims=2000, seed=12)
    assert rates["pooled"] > rates["both"] + 0.1
    assert rates["pooled_contradicted"] == 0.0


def _result(folder: Path, per_seed: dict[str, float], verdict: str) -> Path:
    folder.mkdir()
    claim = {"claim": CLAIM, "estimate": f"{np.mean(list(per_seed.values())):+.4f}",
             "ci": "[+0.0100, +0.2000]", "verdict": verdict, "reason": "",
             "per_seed": per_seed, "role": "primary",
             "per_seed_text": ", ".join(f"{v:+.3f}" for v in per_seed.values())}
    (folder / "suite.json").write_text(json.dumps({"name": "demo", "claims": [claim],
                                                   "environment": [f"- environment: {folder.name}"]}))
    return folder


def test_across_prints_the_pooled_verdict(tmp_path):
    a = _result(tmp_path / "fp32", {"0": 0.10, "1": 0.30, "2": 0.20, "3": 0.00}, "fragile")
    b = _result(tmp_path / "bf16", {"0": 0.20, "1": 0.10, "2": 0.20, "3": 0.20}, "reproduced")
    text = across_report([a, b])
    row = next(line for line in text.splitlines() if line.startswith("| primary"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2] == "differs: fragile / reproduced"
    assert cells[-1] == ("+0.1625 [+0.0863, +0.2387]; per fold +0.150, +0.200, +0.200, "
                         "+0.100; reproduced")
