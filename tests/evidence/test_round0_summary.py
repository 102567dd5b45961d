"""``eval.compare_round0``: the round 0 -> final table printed after ``fedkt run``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedkt.config import ConfigError
from fedkt.eval.predictions import prediction_files, read_predictions
from fedkt.evidence.stats import DEFAULT_BOOTSTRAP
from fedkt.runner import run


def _right(run_dir, rnd: int, participant: str) -> tuple[list[str], np.ndarray]:
    table = read_predictions(prediction_files(run_dir)[(rnd, participant, "")])
    cols = table.columns
    return table.ids, np.array([p == g for p, g in zip(cols["pred"], cols["gold"], strict=True)],
                               dtype=float)


def _hand_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The documented paired bootstrap (seed 0), written out with index arrays."""
    idx = np.random.default_rng(0).integers(0, len(a), size=(DEFAULT_BOOTSTRAP, len(a)))
    lo, hi = np.quantile(a[idx].mean(1) - b[idx].mean(1), [0.025, 0.975])
    return float(lo), float(hi)


def test_round0_summary_is_printed_and_follows_from_the_prediction_files(make_config, capsys):
    cfg = make_config("eval.compare_round0=true", "training.lr=0.02", "rounds=1",
                      "training.lora.target_modules=all-linear")
    run(cfg)
    out = capsys.readouterr().out
    text = out[out.index("Round 0 -> round 1"):]
    lines = text.splitlines()
    assert "over the same 24 test examples" in lines[0]
    assert lines[1].split()[:4] == ["participant", "metric", "round", "0"]
    rows = {ln[:16].strip(): ln[16:].split() for ln in lines[2:] if ln.strip()
            and not ln.startswith("done")}
    assert list(rows) == ["server", "client_0", "client_1", "clients (mean)"]
    logged = {(r["round"], r["participant"]): r for r in map(json.loads, (
        cfg.run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("split") == "test"}
    # Round 0's server row times the round's evaluations (clients' and the server's).
    assert logged[(0, "server")]["wall_time"] > 0.01
    mean = {}
    for part in ("server", "client_0", "client_1"):
        metric, r0, r1, delta, lo, hi, excl = rows[part]
        assert metric == "accuracy"
        assert float(r0) == pytest.approx(logged[(0, part)]["accuracy"], abs=5e-4)
        assert float(r1) == pytest.approx(logged[(1, part)]["accuracy"], abs=5e-4)
        ids0, b = _right(cfg.run_dir, 0, part)
        ids1, a = _right(cfg.run_dir, 1, part)
        assert ids0 == ids1
        mean[part] = (a, b)
        want_lo, want_hi = _hand_ci(a, b)
        assert float(delta) == pytest.approx(a.mean() - b.mean(), abs=5e-4)
        assert float(lo.strip("[,")) == pytest.approx(want_lo, abs=5e-4)
        assert float(hi.strip("]")) == pytest.approx(want_hi, abs=5e-4)
        assert excl == ("yes" if want_lo > 0 or want_hi < 0 else "no")
    clients = rows["clients (mean)"]
    a = (mean["client_0"][0] + mean["client_1"][0]) / 2
    b = (mean["client_0"][1] + mean["client_1"][1]) / 2
    assert float(clients[3]) == pytest.approx(a.mean() - b.mean(), abs=5e-4)


def test_compare_round0_needs_round0_and_predictions(make_config):
    for off in ("round0", "predictions"):
        with pytest.raises(ConfigError, match=f"eval.compare_round0.*eval.{off}"):
            make_config("eval.compare_round0=true", f"eval.{off}=false")
