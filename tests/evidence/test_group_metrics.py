"""accuracy_<group> in the evidence tools: samples, paired CIs and suite claims over the
group's test items only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedkt.eval.predictions import Predictions, write_predictions
from fedkt.evidence.paired_table import baseline_report
from fedkt.evidence.stats import bootstrap_difference, components, metric_names, sample
from fedkt.evidence.suite import load_suite
from fedkt.evidence.suite_report import report_suite
from tests.evidence.test_suite import _hand_ci  # the paired bootstrap written out

SRV = {0, 1, 2}


def _table(gold: list[int], right: np.ndarray, groups: dict | None = None) -> Predictions:
    pred = [g if r else (g + 1) % 7 for g, r in zip(gold, right, strict=True)]
    meta: dict = {"task": "classification", "labels": list(range(7))}
    if groups is not None:
        meta["class_groups"] = groups
    return Predictions({"id": [f"x{i}" for i in range(len(gold))], "gold": gold, "pred": pred},
                       meta)

def test_group_sample_holds_the_groups_items_only() -> None:
    rng = np.random.default_rng(0)
    gold = [i % 7 for i in range(70)]
    ra, rb = rng.random(70) < 0.7, rng.random(70) < 0.5
    groups = {"srv": [0, 1, 2], "cli": [3, 4, 5, 6]}
    a, b = _table(gold, ra, groups), _table(gold, rb, groups)
    assert metric_names(a)[-2:] == ["accuracy_srv", "accuracy_cli"]
    inside = np.array([g in SRV for g in gold])
    sa = sample([a], "accuracy_srv")
    assert sa.ids == [f"x{i}" for i in np.flatnonzero(inside)]
    assert float(sa.value()) == pytest.approx(ra[inside].mean())
    diff = bootstrap_difference([sa], [sample([b], "accuracy_srv")], reps=500, seed=3)
    est, lo, hi, _ = _hand_ci([(ra[inside].astype(float), rb[inside].astype(float))], 500, 3)
    assert (diff.estimate, diff.low, diff.high, diff.n) == (pytest.approx(est), pytest.approx(lo),
                                                           pytest.approx(hi), int(inside.sum()))
    # A group no test item is in is not a metric of the table.
    c = _table(gold, ra, {"none": [7]})
    assert "accuracy_none" not in metric_names(c)
    with pytest.raises(KeyError):
        components(c, "accuracy_none")


def _write_run(folder: Path, cfg_yaml: str, table: Predictions, rounds: int) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(cfg_yaml)
    acc = float(np.mean([p == g for p, g in zip(table.columns["pred"], table.columns["gold"],
                                                strict=True)]))
    (folder / "metrics.jsonl").write_text(json.dumps(
        {"round": rounds, "participant": "server", "split": "test", "accuracy": acc}) + "\n")
    write_predictions(folder, rounds, "server", {"": table})
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "latest.json").write_text(json.dumps({"round": rounds}))


def test_suite_claim_on_a_group_metric_pairs_the_groups_items(tmp_path: Path) -> None:
    """Tables without class_groups (as image classifiers write them) take the run config's
    eval.class_groups; the claim's CI is the paired bootstrap over the srv items and seeds."""
    base = {"method": {"name": "fedavg"}, "rounds": 1,
            "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
            "data": {"dataset": {"name": "intent_recognition"}},
            "eval": {"class_groups": {"srv": "0-2", "cli": "3-6"}, "plots": False}}
    claims = ["real.server.accuracy_srv > control.server.accuracy_srv",
              "real.server.accuracy > control.server.accuracy"]
    spec = {"name": "groups", "base": base, "seeds": [0, 1], "bootstrap": 400,
            "arms": {"real": {}, "control": {"training.lr": 1e-3}}, "claims": claims}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(spec))
    folder = tmp_path / "out"
    suite = load_suite(path, folder)
    rng = np.random.default_rng(1)
    gold = [i % 7 for i in range(84)]
    inside = np.array([g in SRV for g in gold])
    right: dict[tuple[str, int], np.ndarray] = {}
    for seed in (0, 1):
        # real: better on the server's classes, worse on the clients'.
        p_real = np.where(inside, 0.85, 0.35)
        p_ctrl = np.where(inside, 0.35, 0.7)
        right["real", seed] = rng.random(84) < p_real
        right["control", seed] = rng.random(84) < p_ctrl
        for arm in ("real", "control"):
            _write_run(suite.run_dir(arm, seed), suite.runs[(arm, seed)].to_yaml(),
                       _table(gold, right[arm, seed]), 1)
    report_suite(folder, suite=suite)
    out = json.loads((folder / "suite.json").read_text())
    assert {"accuracy_srv", "accuracy_cli"} <= set(out["metrics"])
    by_claim = {c["claim"]: c for c in out["claims"]}
    pairs = [(right["real", s][inside].astype(float), right["control", s][inside].astype(float))
             for s in (0, 1)]
    est, lo, hi, _ = _hand_ci(pairs, 400, 0)
    got = by_claim[claims[0]]
    assert (got["value"], got["low"], got["high"]) == (pytest.approx(est), pytest.approx(lo),
                                                       pytest.approx(hi))
    assert got["verdict"] == "fragile"  # the interval decides, but 2 seeds (4 needed)
    assert got["reason"] == "reproduced by the interval, but 2 seeds (4 needed)"
    # Over every item the same runs give another interval (the restriction is what differs).
    all_pairs = [(right["real", s].astype(float), right["control", s].astype(float))
                 for s in (0, 1)]
    est_all, lo_all, hi_all, _ = _hand_ci(all_pairs, 400, 0)
    overall = by_claim[claims[1]]
    assert (overall["low"], overall["high"]) == (pytest.approx(lo_all), pytest.approx(hi_all))
    assert (overall["low"], overall["high"]) != (pytest.approx(lo), pytest.approx(hi))
    # `fedkt report --baseline` lists the group metrics too, paired over the group's items.
    runs = [suite.run_dir("real", 0), suite.run_dir("real", 1), suite.run_dir("control", 1)]
    text = baseline_report(runs, suite.run_dir("control", 0), reps=400)
    row = next(line for line in text.splitlines() if "| accuracy_srv |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == f"{est:+.4f}" and cells[6] == f"[{lo:+.4f}, {hi:+.4f}]"
    assert cells[8:] == [str(int(inside.sum())), "2"]
