"""Smoke version of the shipped FedMKT suite: its arms' mechanics on the real SmolLM2.

Two arms (FedMKT and its lambda=1 control), one round, tiny sizes: the full suite
(fedkt/configs/suites/fedmkt.yaml) is documented in docs/records/fedmkt.md.
"""

from __future__ import annotations

import json
from typing import Any

from fedkt.eval.predictions import prediction_files
from tests.suites.smoke import SMOLLM2, run_suite, shipped_suite

pytestmark = SMOLLM2


def _smoke_suite() -> dict[str, Any]:
    """The shipped suite with two arms, one seed, one round and a few dozen examples."""
    suite = shipped_suite("fedmkt", ("fedmkt", "fedmkt_lambda1"))
    suite["base"]["clients"]["models"] = [{"name": "smollm2-135m", "num_layers": 4, "lr": 5.0e-3}]
    return suite


def test_fedmkt_suite_smoke(tmp_path):
    smoke = _smoke_suite()
    claims = smoke["claims"]
    folder, result = run_suite(smoke, tmp_path)
    assert len(claims) == 3
    arms = {row["arm"] for row in result["table"]}
    assert arms == {"round 0 (fedmkt@0)", "fedmkt", "fedmkt_lambda1"}
    ratios, took = {}, {}
    for arm in ("fedmkt", "fedmkt_lambda1"):
        run = folder / arm / "seed_0"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (server,) = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
        clients = [r for r in rows if r["participant"].startswith("client_")
                   and r["split"] == "train"]
        assert len(clients) == 2
        # The diagnostics are logged in both arms: DualMinCE's choices, the KD gradient
        # share and the projected teacher's top-1 agreement.
        for row in (server, *clients):
            assert 0.0 <= row["kd_teacher_top1"] <= 1.0
            assert 0.0 <= row.get("kd_from_clients", row.get("kd_from_server")) <= 1.0
        ratios[arm] = [r["kd_grad_ratio"] for r in (server, *clients)]
        took[arm] = [r.get("kd_from_clients", r.get("kd_from_server")) for r in (server, *clients)]
        files = prediction_files(run)
        assert {(1, "server", ""), (1, "client_0", ""), (1, "client_1", "")} <= set(files)
    # lambda = 1 switches the KD gradient off everywhere; at lambda = 0.9 there is one
    # exactly where DualMinCE took the other side's logits for some sample (S~ not empty).
    assert ratios["fedmkt_lambda1"] == [0.0, 0.0, 0.0]
    assert [r > 0 for r in ratios["fedmkt"]] == [t > 0 for t in took["fedmkt"]], (ratios, took)
    assert any(t > 0 for t in took["fedmkt"]), took
