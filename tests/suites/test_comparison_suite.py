"""Smoke version of the shipped cross-method suite (fedkt/configs/suites/comparison.yaml).

Every arm, one round, two clients, a few dozen examples, on the real SmolLM2: the table
docs/comparison.md shows comes out with each arm's columns read where the suite says,
bytes and compute measured, and the two plots written.
"""

from __future__ import annotations

import json
from typing import Any

from tests.suites.smoke import SMOLLM2, run_suite, shipped_suite

pytestmark = SMOLLM2

ARMS = ("fedsp", "fedmkt", "fedprompt", "centralized", "llm2slm", "fedcollm", "standalone",
        "fedavg", "zero_shot")


def _smoke_suite() -> dict[str, Any]:
    suite = shipped_suite("comparison", ARMS)
    suite["base"]["clients"]["models"] = [{"name": "smollm2-135m", "num_layers": 2}]
    for arm in ("fedsp", "fedprompt"):  # a step or two: the mechanics, not the result
        suite["arms"][arm]["method"].update(prompt_steps=1, server_prompt_steps=1)
    suite["arms"]["fedsp"]["method"].update(kd_steps=2, align_steps=1, kd_cache=False)
    return suite


def test_comparison_suite_smoke(tmp_path):
    smoke = _smoke_suite()
    assert set(smoke["arms"]) == set(ARMS)  # the shipped suite has every method
    folder, result = run_suite(smoke, tmp_path)
    rows = {r["arm"]: r for r in json.loads((folder / "comparison.json").read_text())}
    assert set(rows) == set(ARMS)
    # Columns are read where the suite's `comparison.read` says, and only there.
    for arm in ("fedsp", "fedmkt", "fedprompt", "centralized", "fedcollm", "zero_shot"):
        assert rows[arm]["server"] is not None, arm
    for arm in ("llm2slm", "fedavg", "standalone"):
        assert rows[arm]["server"] is None, arm
    for arm in ("fedmkt", "llm2slm", "standalone", "zero_shot", "fedavg", "fedcollm",
                "fedprompt"):
        assert rows[arm]["clients"] is not None, arm
    for arm in ("fedsp", "centralized"):
        assert rows[arm]["clients"] is None, arm
    assert rows["fedcollm"]["clients_group"] == "global_slm"
    # FedPrompt's clients hold the LLM with the global prompts: the same model as its server.
    assert rows["fedprompt"]["clients"]["value"] == rows["fedprompt"]["server"]["value"]
    # Paired CIs against the baselines; the baselines themselves have none.
    assert rows["standalone"]["clients"]["delta"] is None
    assert rows["zero_shot"]["server"]["delta"] is None
    d = rows["fedmkt"]["clients"]["delta"]
    assert d["low"] <= d["estimate"] <= d["high"]
    for r in rows.values():
        for col in ("server", "clients"):
            if r[col] is not None:
                assert r[col]["low"] <= r[col]["value"] <= r[col]["high"]
    # Bytes as measured: FedMKT's clients upload logits on the server's share, LLM2SLM's
    # only metrics, standalone's nothing but the envelope; centralized has no client.
    assert rows["fedmkt"]["bytes_up"] > 20 * rows["llm2slm"]["bytes_up"]
    assert rows["llm2slm"]["bytes_down"] > 20 * rows["llm2slm"]["bytes_up"]
    assert rows["standalone"]["bytes_up"] < 2000
    assert rows["centralized"]["bytes_up"] is None and rows["centralized"]["client_compute"] is None
    # Compute: every client trains in the federated arms; the centralized server does it all.
    for arm in ("fedsp", "fedmkt", "fedprompt", "llm2slm", "fedcollm", "standalone", "fedavg"):
        assert rows[arm]["client_compute"] > 0, arm
    assert rows["centralized"]["server_compute"] > 0
    assert rows["fedmkt"]["server_sees"] == "SLM top-K logits on public data"
    md = (folder / "suite.md").read_text()
    assert "## Comparison" in md and "up / client / round" in md
    for name in ("comparison_bytes.png", "comparison_compute.png"):
        assert (folder / "plots" / name).stat().st_size > 10_000
