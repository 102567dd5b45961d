"""Client handlers that several methods share (a method's own live in its ``algorithm.py``).

* :func:`client_evaluate`: the ``evaluate`` handler of every causal-LM method whose clients
  start from ``clients.models`` (FedAvg, FedCoLLM, FedMKT, LLM2SLM).
"""

from __future__ import annotations

from fedkt.federated.payload import Payload
from fedkt.methods.base import ClientContext
from fedkt.train.lm import client_lm, client_test_metrics

__all__ = ["client_evaluate"]


def client_evaluate(ctx: ClientContext, msg: Payload) -> Payload:
    """Handler ``evaluate``: the client's initial model on the test split (round 0,
    zero-shot)."""
    return Payload(metrics=client_test_metrics(ctx, client_lm(ctx.cfg, ctx.cid, ctx.data())))
