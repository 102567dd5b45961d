"""Smoke version of the shipped FedSP suite: its arms' mechanics on the real SmolLM2.

Two arms (FedSP and its server-only control), one round, two clients, tiny sizes: the full
suite (fedkt/configs/suites/fedsp.yaml) is documented in docs/records/fedsp.md.
"""

from __future__ import annotations

import json
from typing import Any

from fedkt.eval.predictions import prediction_files
from tests.suites.smoke import SMOLLM2, run_suite, shipped_suite

pytestmark = SMOLLM2


def _smoke_suite() -> dict[str, Any]:
    """The shipped suite with two arms, one round, two clients and a few dozen examples."""
    suite = shipped_suite("fedsp", ("fedsp", "server_only"))
    suite["base"]["training"]["prefix_tokens"] = 8
    suite["arms"]["fedsp"]["method"].update(kd_steps=2, kd_cache=False)
    return suite


def test_fedsp_suite_smoke(tmp_path):
    smoke = _smoke_suite()
    claims = smoke["claims"]
    folder, result = run_suite(smoke, tmp_path)
    assert claims == ["fedsp.server.accuracy > server_only.server.accuracy"]
    assert {row["arm"] for row in result["table"]} == {
        "round 0 (fedsp@0)", "fedsp", "server_only"}
    rows = {arm: [json.loads(line) for line in
                  (folder / arm / "seed_0" / "metrics.jsonl").read_text().splitlines()]
            for arm in ("fedsp", "server_only")}
    # FedSP: distillation, client alignment + prompts, then the server's own prompt steps.
    (train,) = [r for r in rows["fedsp"] if r["participant"] == "server" and r["split"] == "train"]
    assert train["kd_steps"] == 2 and "align_loss" in train and "server_loss" in train
    assert {r["participant"] for r in rows["fedsp"]} >= {"client_0", "client_1"}
    # The control: the server's steps only; no client is ever called.
    assert {r["participant"] for r in rows["server_only"]} == {"server"}
    (ctrl,) = [r for r in rows["server_only"] if r["split"] == "train"]
    assert "server_loss" in ctrl and "loss" not in ctrl
    for arm in ("fedsp", "server_only"):
        test = [r for r in rows[arm] if r["split"] == "test" and r["round"] == 1]
        assert test and {"accuracy", "loss"} <= set(test[0])
        files = prediction_files(folder / arm / "seed_0")
        assert (1, "server", "") in files
    assert (0, "server", "") in prediction_files(folder / "fedsp" / "seed_0")  # initial prompts
