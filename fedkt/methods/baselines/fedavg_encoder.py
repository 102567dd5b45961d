"""FedAvg of an encoder text classifier: FedKD's baselines "UniLM (Fed)" and "UniLM_N".

The whole model (``layers: null``, teacher size) or its embeddings and first N layers
(student size) fine-tune on the clients' private data with cross-entropy; the server
averages their updates.  The updates travel exactly as FedKD's do
(:mod:`fedkt.methods.exchange`: client update up, aggregate down, an ``adopt`` call), uncompressed
unless ``compress: true``, so the two methods' bytes compare: the server is FedKD's, with
the model's depth taken from ``layers``.  The server evaluates the global model.
"""

from __future__ import annotations

from fedkt.federated.payload import Payload
from fedkt.methods.base import ClientContext
from fedkt.methods.exchange import GLOBAL, upload_update
from fedkt.methods.fedkd.algorithm import FedKDServer

from .families import ENCODER, train_metrics


class FedAvgEncoderServer(FedKDServer):
    """FedKD's server (Algorithm 1's exchange) for a global model ``layers`` deep."""

    def global_layers(self) -> int | None:
        return self.method.layers


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Fine-tune the global model on private data; upload the (optionally compressed) update."""
    model = ENCODER.build(ctx.cfg, ctx.cid, ctx.data())
    initial = ENCODER.state(model)  # version 0: built from the seed everywhere
    received = ctx.received(msg, GLOBAL, start=initial, like=initial)
    ENCODER.load(model, received)
    stats = ENCODER.train(ctx.cfg, model, ctx.private, data=ctx.data(), seed=ctx.seed("train"),
                          desc=f"{ctx.name} train")
    update = {k: v - received[k] for k, v in ENCODER.state(model).items()}
    T = msg.number("T", source="server", low=0.0) if ctx.method.compress else None
    metrics = {**train_metrics(stats), **ctx.test_metrics(
        lambda: ENCODER.evaluate(ctx.cfg, model, ctx.data().test, data=ctx.data()))}
    return Payload(update=upload_update(ctx, update, T)[0], num_examples=stats["num_examples"],
                   metrics=metrics)
