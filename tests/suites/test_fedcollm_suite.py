"""Smoke version of the shipped FedCoLLM suite: its arms' mechanics on the real SmolLM2.

Two arms (FedCoLLM and its lambda=0 control), one round, tiny sizes: the full suite
(fedkt/configs/suites/fedcollm.yaml) is documented in docs/records/fedcollm.md.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fedkt.eval.predictions import prediction_files
from tests.suites.smoke import SMOLLM2, run_suite, shipped_suite

pytestmark = SMOLLM2


def _smoke_suite() -> dict[str, Any]:
    """The shipped suite with two arms, one seed, one round and a few dozen examples."""
    suite = shipped_suite("fedcollm", ("fedcollm", "fedcollm_lambda0"))
    suite["base"]["clients"]["models"] = [{"name": "smollm2-135m", "num_layers": 4}]
    return suite


def test_fedcollm_suite_smoke(tmp_path):
    smoke = _smoke_suite()
    claims = smoke["claims"]
    folder, result = run_suite(smoke, tmp_path)
    assert len(claims) == 3
    arms = {row["arm"] for row in result["table"]}
    assert arms == {"round 0 (fedcollm@0)", "fedcollm", "fedcollm_lambda0"}
    for arm, lam in (("fedcollm", 1.0), ("fedcollm_lambda0", 0.0)):
        run = folder / arm / "seed_0"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (train,) = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
        # The co-tuning objective is L_FT + lambda * KD for each model; the KD terms are
        # measured in both arms (the control only switches their weight off).
        assert train["cotune_kd_llm"] > 0 and train["cotune_kd_slm"] > 0
        assert train["cotune_llm"] == pytest.approx(
            train["cotune_ft_llm"] + lam * train["cotune_kd_llm"], rel=1e-6)
        # The LLM and the global SLM are two participants, each with its own table.
        files = prediction_files(run)
        assert {(1, "server", ""), (1, "global_slm", "")} <= set(files)
        if arm == "fedcollm":  # round 0: both server-side models zero-shot (this arm only)
            assert {(0, "server", ""), (0, "global_slm", "")} <= set(files)
        assert not any(p.startswith("client_") for _, p, _ in files)  # eval.clients: false
