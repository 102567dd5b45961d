"""FedKD's baselines for encoder text classifiers: FedAvg, local-only and centralized.

Each fine-tunes ``clients.models[0]`` (cross-entropy) with its classification head, at
teacher size (``layers: null``, every layer) or at student size (``layers: N``: the
embeddings and first N layers, FedKD's student). Embeddings are frozen by default,
as in FedKD, so the same parameters train (and travel) as in FedKD.

* ``fedavg_encoder``: FedAvg of the whole model. Teacher size is the paper's
  "UniLM (Fed)", student size its "UniLM_2"/"UniLM_4". Updates travel as in FedKD
  (client update up, aggregate down, :class:`fedkt.methods.fedkd.GlobalModelSync`),
  uncompressed unless ``compress: true``. The server evaluates the global model.
* ``standalone_encoder``: every client fine-tunes its own model on its private data
  and evaluates it; nothing but metrics leaves a client ("local" in the paper).
* ``centralized_encoder``: one model on all clients' private data pooled (and the
  public set with ``include_public``): the upper bound.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from torch import nn

from fedkt.config import RunConfig
from fedkt.data.splits import FederatedData
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Method, Server, broadcast
from fedkt.methods.fedkd import (
    EncoderHead,
    ExchangeSettings,
    SyncedEncoderServer,
    client_global,
    client_sync,
    teacher_config,
    upload_update,
)
from fedkt.payload import Payload
from fedkt.train.encoder import (
    build_encoder,
    check_text_classification,
    evaluate_encoder,
    load_trainable,
    train_encoder,
    trainable_state,
)


class _EncoderChoice(EncoderHead):
    # None: the whole encoder (teacher size); N: its embeddings + first N layers.
    layers: int | None = Field(None, ge=1)
    freeze_embeddings: bool = True


def _build(cfg: RunConfig, fd: FederatedData, layers: int | None, freeze: bool
           ) -> tuple[nn.Module, Any]:
    labels = check_text_classification(fd, cfg.method.name)
    return build_encoder(teacher_config(cfg), labels, cfg.seed, layers=layers,
                         freeze_embeddings=freeze, pooling=cfg.method.pooling,
                         device=cfg.runtime.device)


def _test_metrics(ctx: ClientContext, model: nn.Module, tokenizer: Any) -> dict[str, float]:
    return ctx.test_metrics(lambda: evaluate_encoder(ctx.cfg, model, tokenizer, ctx.data().test))


def _train_metrics(stats: dict[str, float]) -> dict[str, float]:
    return {f"train/{k}": stats[k] for k in ("loss", "steps", "step_seconds")}


def client_evaluate(ctx: ClientContext, msg: Payload) -> Payload:
    """The client's initial classifier on the test split (round 0)."""
    m = ctx.method
    model, tokenizer = _build(ctx.cfg, ctx.data(), m.layers, m.freeze_embeddings)
    return Payload(metrics=_test_metrics(ctx, model, tokenizer))


# --------------------------------------------------------------------------- FedAvg


class FedAvgEncoderConfig(_EncoderChoice, ExchangeSettings):
    name: Literal["fedavg_encoder"] = "fedavg_encoder"
    compress: bool = False


class FedAvgEncoderServer(SyncedEncoderServer):
    def model_layers(self) -> int | None:
        return self.method.layers


def fedavg_client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Fine-tune the global model on private data; upload the (optionally compressed) update."""
    m = ctx.method
    model, tokenizer = _build(ctx.cfg, ctx.data(), m.layers, m.freeze_embeddings)
    received = client_global(ctx, msg, trainable_state(model))
    load_trainable(model, received)
    stats = train_encoder(ctx.cfg, model, tokenizer, ctx.private, seed=ctx.seed("train"))
    update = {k: v - received[k] for k, v in trainable_state(model).items()}
    T = msg.number("T", source="server", low=0.0) if m.compress else None
    metrics = {**_train_metrics(stats), **_test_metrics(ctx, model, tokenizer)}
    return Payload(update=upload_update(ctx, update, T)[0], num_examples=stats["num_examples"],
                   train_loss=stats["loss"] if stats["steps"] else 0.0, metrics=metrics)


# --------------------------------------------------------------------------- local only


class StandaloneEncoderConfig(_EncoderChoice):
    name: Literal["standalone_encoder"] = "standalone_encoder"


class StandaloneEncoderServer(Server):
    """Only asks clients to train; their models stay on their disks."""

    def round(self, rnd: int, clients) -> dict[str, float]:
        check_text_classification(self.data(), self.method.name)
        broadcast(clients, "train")
        return {}


def standalone_client_train(ctx: ClientContext, msg: Payload) -> Payload:
    m = ctx.method
    model, tokenizer = _build(ctx.cfg, ctx.data(), m.layers, m.freeze_embeddings)
    saved = ctx.load_state("model")
    if saved is not None:
        load_trainable(model, saved)
    stats = train_encoder(ctx.cfg, model, tokenizer, ctx.private, seed=ctx.seed("train"))
    ctx.save_state("model", trainable_state(model))
    return Payload(metrics={**_train_metrics(stats), **_test_metrics(ctx, model, tokenizer)})


# --------------------------------------------------------------------------- centralized


class CentralizedEncoderConfig(_EncoderChoice):
    name: Literal["centralized_encoder"] = "centralized_encoder"
    include_public: bool = True


class CentralizedEncoderServer(Server):
    """Pools the private data of every client taking part (and the public set) on the server."""

    def setup(self) -> None:
        m = self.method
        self.model, self.tokenizer = _build(self.cfg, self.data(), m.layers, m.freeze_embeddings)
        self.state = trainable_state(self.model)
        data = self.data()
        self.records = [r for cid in self.cfg.client_ids() for r in data.private[cid]]
        if m.include_public:
            self.records += data.public

    def round(self, rnd: int, clients) -> dict[str, float]:
        load_trainable(self.model, self.state)
        stats = train_encoder(self.cfg, self.model, self.tokenizer, self.records,
                                 seed=self.seed(rnd, "train"))
        self.state = trainable_state(self.model)
        return _train_metrics(stats)

    def evaluate(self, rnd: int) -> dict[str, float]:
        load_trainable(self.model, self.state)
        return evaluate_encoder(self.cfg, self.model, self.tokenizer, self.data().test)

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state) -> None:
        self.state = dict(state)


register(Method(
    "fedavg_encoder", FedAvgEncoderConfig, FedAvgEncoderServer,
    {"train": fedavg_client_train, "sync": client_sync, "evaluate": client_evaluate},
    aggregates=True, server_sees="model update", clients_see="global model",
    summary="FedAvg of an encoder classifier, teacher or student size (FedKD's baselines)",
    paper="McMahan et al. 2017; as the 'UniLM (Fed)' / 'UniLM_N' rows of Wu et al. 2022"))
register(Method(
    "standalone_encoder", StandaloneEncoderConfig, StandaloneEncoderServer,
    {"train": standalone_client_train, "evaluate": client_evaluate},
    summary="each client fine-tunes its own encoder classifier alone"))
register(Method(
    "centralized_encoder", CentralizedEncoderConfig, CentralizedEncoderServer, {},
    server_sees="all raw data", clients_see="-",
    summary="one encoder classifier on all data pooled (upper bound)"))
