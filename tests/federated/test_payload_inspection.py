"""The payload inspection (:mod:`tests.support.inspection`) is not vacuous.

The conformance test (``tests/methods/test_conformance.py``) runs every registered method
and inspects every reply; here edits of a real FedAvg reply show that each check catches
what it should: private text, an undeclared field, a tensor outside the declaration, a
base weight, a malformed metric, leaked or foreign predictions.
"""

from __future__ import annotations

import pytest
import torch

from fedkt.data.splits import run_data
from fedkt.federated.payload import loads
from tests.support.inspection import check_reply, private_needles
from tests.support.trust_helpers import recorded_run


def test_the_checks_catch_a_leak_an_extra_field_and_a_base_weight():
    """The checker is not vacuous: edits of a real FedAvg reply are caught."""
    from fedkt.federated.payload import dumps

    run = recorded_run("fedavg")
    call = next(c for c in run.replies() if c.cid == 1 and c.handler == "train")
    needles = private_needles(run)
    bases: dict = {}
    check_reply(run, 1, "train", call.reply, needles, bases)  # the real reply passes
    text = next(r["text"] for r in run_data(run.cfg.data, 3, run.cfg.seed).private[1]
                if len(r["text"]) >= 24)
    embed = next(v for k, v in bases[1][0].items() if k.endswith("embed_tokens.weight"))
    test_id = run_data(run.cfg.data, 3, run.cfg.seed).test[0]["id"]

    def _tables(columns: dict) -> torch.Tensor:
        from fedkt.eval.predictions import Predictions, pack

        blob = bytearray(pack({"": Predictions(columns)}))
        return torch.frombuffer(blob, dtype=torch.uint8).clone()

    cases = {
        "leaks": lambda p: {**p, "metrics": {**p["metrics"], "train/loss": 0.0},
                            "note": f"from {text}"},
        "beyond the declaration": lambda p: {**p, "num_layers": 2},
        "outside the declaration": lambda p: {**p, "adapter": {
            **p["adapter"], "base_model.model.model.norm.weight": torch.ones(64)}},
        "equals a base weight": lambda p: {**p, "adapter": {
            **p["adapter"], "base_model.model.model.embed_tokens.lora_A.weight": embed}},
        "should be a finite": lambda p: {**p, "metrics": {"train/loss": "high"}},
        "predictions leak": lambda p: {**p, "_predictions": _tables(
            {"id": [test_id], "gold": [0], "pred": [text]})},
        "ids outside the test split": lambda p: {**p, "_predictions": _tables(
            {"id": ["not-a-test-id"], "gold": [0], "pred": [1]})},
    }
    for what, edit in cases.items():
        bad = dumps(edit(loads(call.reply)))
        with pytest.raises(AssertionError, match=what):
            check_reply(run, 1, "train", bad, needles, bases)
