"""A smoke version of the FedKD suite (configs/suites/fedkd.yaml): its base config and two of
its arms at tiny sizes on the real all-MiniLM-L6-v2, through `fedkt suite run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from fedkt.config import ModelConfig
from fedkt.train.encoder import build_encoder, feature_spread, load_trainable
from tests.conftest import needs_models

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "fedkt" / "configs" / "suites" / "fedkd.yaml"
TWEETS = ["@user you are a complete idiot", "what a lovely morning for a walk",
          "this game was so boring honestly", "thanks for the help today!",
          "shut up nobody asked you", "new blog post on my garden is up"]


@pytest.mark.slow
@needs_models("all-minilm-l6-v2")
def test_fedkd_suite_smoke(tmp_path):
    shipped = yaml.safe_load(SUITE.read_text())
    suite = {
        "name": "fedkd_smoke", "seeds": [0], "baseline": "fedavg_student",
        "base": str((SUITE.parent / shipped["base"]).resolve()),
        "metrics": ["f1", "accuracy"],
        "arms": {arm: {**shipped["arms"][arm],
                       "rounds": 2, "eval": {**shipped["arms"][arm].get("eval", {}),
                                             "every": 1},
                       "clients": {"num_clients": 2},
                       "data": {"max_private_per_client": 16, "max_test": 48}}
                 for arm in ("fedavg_student", "fedkd")},
        "claims": ["fedkd.clients.f1 > fedavg_student.server.f1",
                   "fedkd.clients.bytes_total <= 0.9 * fedavg_student.clients.bytes_total"],
    }
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(suite))
    out_dir = tmp_path / "out"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "fedkt.cli", "suite", "run", str(path),
                           "--jobs", "1", "--output-dir", str(out_dir)], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (out_dir / "suite.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.split("## Claims")[0].splitlines()
            if line.startswith("| fed")}
    assert set(rows) == {"fedavg_student", "fedkd"}, table
    assert rows["fedkd"].count("[") == 2, table  # a paired CI per metric vs the baseline
    assert "test examples per run: 48" in table
    verdicts = table.split("## Claims")[1]
    # FedKD moves SVD-compressed 2-layer updates; student-size FedAvg dense ones
    (bytes_claim,) = [ln for ln in verdicts.splitlines() if "bytes_total" in ln]
    # below 0.9x on the interval's side; one seed decides nothing more (docs/evidence.md)
    assert bytes_claim.endswith(
        "| fragile: reproduced by the interval, but 1 seed (4 needed) |"), verdicts
    # The global student after 2 rounds: its pooling weights moved (they travel with it)
    # and its pooled features are not constant across tweets.
    state = load_file(out_dir / "fedkd" / "seed_0" / "checkpoints" / "round_0002"
                      / "server.safetensors")
    student_state = {k[len("global."):]: v for k, v in state.items() if k.startswith("global.")}
    assert student_state["pooling.query.weight"].abs().sum() > 0  # starts at 0
    student, tok = build_encoder(ModelConfig(name="all-minilm-l6-v2"), 2, 0, layers=2,
                                 device="cpu")
    load_trainable(student, student_state)
    torch.set_num_threads(1)
    assert feature_spread(student, tok, TWEETS, 64) > 0.2
