"""FedAvg of an image classifier: KOALA's baseline, and plain vision FedAvg.

KOALA (Chen et al., arXiv:2407.05268) compares against the conventional approach:
every client runs the server's large pretrained model and FedAvg trains its adapter
(classifier head) on the clients' private labelled images. That is this method with
``model: server`` and ``trainable: head`` (the defaults); the large model's backbone
is pretrained exactly as KOALA's server does it (same class-disjoint pretraining data,
same cache), so both start from the same weights. ``model: client`` / ``trainable: full`` give ordinary
FedAvg of a whole (small) model. Each round:

1. the server sends the global trainable weights theta (and, to a client that does
   not hold it yet, the frozen rest of the model: clients store the whole model);
2. client k trains theta on its private images (CE, Adam, the ``training`` settings);
3. the server sets theta = sum_k n_k theta_k / sum_k n_k.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedkt.config import ConfigError, MethodConfig, ModelConfig, RunConfig
from fedkt.data.images import data_spec, image_tensors
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Method, Server, derive_seed, mean_number
from fedkt.models.vision import build_model, head_module
from fedkt.payload import Payload
from fedkt.train.optim import pick_device
from fedkt.train.pretrain import (
    VisionPretrain,
    check_pretrain_source,
    pretrained_model,
    server_pretrain_records,
)
from fedkt.train.vision import evaluate_vision, extract_features, train_vision


class FedAvgVisionConfig(MethodConfig):
    name: Literal["fedavg_vision"] = "fedavg_vision"
    # server: clients run the server's (large, pretrained) model; client: clients.models.
    model: Literal["server", "client"] = "server"
    # head: only the classifier head trains (KOALA's baseline); full: every weight.
    trainable: Literal["head", "full"] = "head"
    weighted: bool = True
    # Pretraining of the server model's backbone (used with model: server).
    pretrain: VisionPretrain = Field(default_factory=VisionPretrain)


def _model_config(cfg: RunConfig) -> ModelConfig:
    if cfg.method.model == "server":
        if cfg.server is None:
            raise ConfigError("server: fedavg_vision with model: server needs a server model")
        return cfg.server
    models = {m.model_dump_json() for m in cfg.clients.models}
    if len(models) != 1:
        raise ConfigError("clients.models: fedavg_vision needs one model shared by all clients")
    return cfg.clients.model_for(0)


def _trainable(model: nn.Module, mode: str) -> dict[str, Tensor]:
    return (head_module(model) if mode == "head" else model).state_dict()


def _load_trainable(model: nn.Module, mode: str, state: dict[str, Tensor]) -> None:
    (head_module(model) if mode == "head" else model).load_state_dict(state)


class FedAvgVisionServer(Server[FedAvgVisionConfig]):
    def setup(self) -> None:
        cfg, m = self.cfg, self.method
        torch.manual_seed(derive_seed(cfg.seed, "fedavg-vision-setup"))
        fd = self.data()
        spec = data_spec(fd)
        mcfg = _model_config(cfg)
        if m.model == "server":
            check_pretrain_source(mcfg, cfg.data.dataset, m.pretrain)
            pre, n_pre = server_pretrain_records(m.pretrain)
            model = pretrained_model(mcfg, spec, pre, m.pretrain, cfg.seed,
                                     cfg.training.precision, n_pre)
        else:
            model = build_model(mcfg, spec, derive_seed(cfg.seed, "model-init"))
        self.model = model.to(pick_device(cfg.runtime.device)).eval()
        self.theta = {k: v.clone() for k, v in _trainable(self.model, m.trainable).items()}
        self.test_images, self.test_labels = image_tensors(fd.test)
        self.test_ids = [r["id"] for r in fd.test]
        self.synced: set[int] = set()

    def round(self, rnd: int, clients) -> dict[str, float]:
        mode = self.method.trainable
        base = self.model.state_dict() if mode == "head" else None
        msgs = {}
        for cid in clients.ids:
            msg = Payload(trainable=self.theta)
            if base is not None and cid not in self.synced:
                msg["base"] = base
            msgs[cid] = msg
        replies, self.theta = clients.aggregate("train", msgs, field="trainable", like=self.theta,
                                                weighted=self.method.weighted)
        self.synced = set(replies)
        _load_trainable(self.model, mode, self.theta)
        loss = mean_number(replies, "train_loss")
        return {"train/loss": loss} if loss is not None else {}

    def evaluate(self, rnd: int) -> dict[str, float]:
        _load_trainable(self.model, self.method.trainable, self.theta)
        return evaluate_vision(self.model, self.test_images, self.test_labels,
                                   ids=self.test_ids, precision=self.cfg.training.precision)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.theta)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.theta = dict(state)
        _load_trainable(self.model, self.method.trainable, self.theta)
        self.synced = set(self.cfg.client_ids())  # resuming: clients kept the model on disk


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Train the global trainable weights on private images (task loss)."""
    cfg, mode, t = ctx.cfg, ctx.cfg.method.trainable, ctx.cfg.training
    fd = ctx.data()
    model = build_model(_model_config(cfg), data_spec(fd), ctx.seed("init"))
    model = model.to(pick_device(cfg.runtime.device))
    if mode == "head":
        if "base" in msg:
            base = msg.state("base", like=model.state_dict(), source="server")
            ctx.save_state("base", base)
        else:
            base = ctx.load_state("base")
            if base is None:
                raise RuntimeError(f"{ctx.name} has no model on disk and none was sent")
        model.load_state_dict(base)
    theta = msg.state("trainable", like=_trainable(model, mode), source="server")
    _load_trainable(model, mode, theta)
    images, labels = image_tensors(ctx.private)
    train_kw = dict(epochs=t.local_epochs, batch_size=t.batch_size, lr=t.lr,
                    weight_decay=t.weight_decay, betas=t.betas, seed=ctx.seed("train"),
                    max_steps=t.max_steps, max_grad_norm=t.max_grad_norm,
                    precision=t.precision)
    if mode == "head":
        # The backbone is frozen: train the head on its (fixed) features.
        features = extract_features(model, images, precision=t.precision)
        stats = train_vision(head_module(model), (features, labels), **train_kw)
    else:
        stats = train_vision(model, (images, labels), **train_kw)
    metrics = {"train/loss": stats["loss"], "train/steps": stats["steps"]}
    metrics.update(ctx.test_metrics(lambda: evaluate_vision(
        model, *image_tensors(fd.test), ids=[r["id"] for r in fd.test], precision=t.precision)))
    upload = ctx.privatize(_trainable(model, mode), theta)
    return Payload(trainable=upload, num_examples=stats["num_examples"],
                   train_loss=stats["loss"], metrics=metrics)


METHOD = register(Method(
    name="fedavg_vision", config=FedAvgVisionConfig, server=FedAvgVisionServer,
    handlers={"train": client_train}, aggregates=True,
    server_sees="trainable weights", clients_see="global weights",
    summary="FedAvg of an image classifier's head or whole model (KOALA's baseline)",
    paper="McMahan et al. 2017; the baseline of Chen et al. (KOALA), arXiv:2407.05268",
))
