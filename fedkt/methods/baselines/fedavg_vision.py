"""FedAvg of an image classifier: KOALA's baseline, and plain vision FedAvg.

KOALA (Chen et al., arXiv:2407.05268) compares against the conventional approach: every
client runs the server's large pretrained model and FedAvg trains its adapter (the
classifier head) on the clients' private labelled images.  That is this method with
``model: server`` and ``trainable: head`` (the defaults); the large model's backbone is
pretrained exactly as KOALA's server does it (:mod:`fedkt.train.pretrain`: same
class-disjoint data, same cache), so both start from the same weights.  ``model: client``
/ ``trainable: full`` give ordinary FedAvg of a whole (small) model.  Each round:

1. the server sends the global trainable weights theta (and the frozen rest of the
   model, ``base``, to a client that does not hold it: clients keep the whole model);
2. client k trains theta on its private images (CE, Adam, the ``training`` settings);
3. the server sets theta = sum_k n_k theta_k / sum_k n_k.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedkt.config import ModelConfig, RunConfig
from fedkt.data.images import data_spec, image_tensors
from fedkt.errors import ConfigError
from fedkt.federated.payload import Payload
from fedkt.infra.placement import client_device, pick_device, server_device
from fedkt.methods.base import ClientContext, Clients, Server, derive_seed, mean_metric
from fedkt.models.vision import build_model, head_module
from fedkt.train.pretrain import check_pretrain_source, pretrained_model, server_pretrain_records
from fedkt.train.vision import evaluate_vision, extract_features, train_vision

from .config import FedAvgVisionConfig

BASE = "base"  # the held object: the server's model as a client runs it (one version)


def model_config(cfg: RunConfig) -> ModelConfig:
    """The model every client runs: the server's (``model: server``) or the clients' one."""
    if cfg.method.model == "server":
        if cfg.server is None:
            raise ConfigError("server: fedavg_vision with model: server needs a server model")
        return cfg.server
    models = {m.model_dump_json() for m in cfg.clients.models}
    if len(models) != 1:
        raise ConfigError("clients.models: fedavg_vision needs one model shared by all clients")
    return cfg.clients.model_for(0)


def _part(model: nn.Module, mode: str) -> nn.Module:
    """What trains and travels: the head (``trainable: head``) or the whole model."""
    return head_module(model) if mode == "head" else model


class FedAvgVisionServer(Server[FedAvgVisionConfig]):
    def setup(self) -> None:
        cfg, m = self.cfg, self.method
        torch.manual_seed(derive_seed(cfg.seed, "fedavg-vision-setup"))
        fd = self.data()
        spec = data_spec(fd)
        mcfg = model_config(cfg)
        if m.model == "server":
            check_pretrain_source(mcfg, cfg.data.dataset, m.pretrain)
            pre, n_pre = server_pretrain_records(m.pretrain)
            model = pretrained_model(mcfg, spec, pre, m.pretrain, cfg.seed,
                                     cfg.training.precision, n_pre)
        else:
            model = build_model(mcfg, spec, derive_seed(cfg.seed, "model-init"))
        self.model = model.to(pick_device(server_device(cfg))).eval()
        self.theta = {k: v.clone() for k, v in _part(self.model, m.trainable).state_dict().items()}
        self.test_images, self.test_labels = image_tensors(fd.test)
        self.test_ids = [r["id"] for r in fd.test]

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        mode = self.method.trainable
        base = self.model.state_dict() if mode == "head" else None
        asked = list(clients.ids)
        msgs = {cid: Payload(trainable=self.theta) for cid in asked}
        if base is not None:  # step 1: the frozen model, to the clients lacking it
            for cid, msg in msgs.items():
                self.holdings.offer(msg, cid, BASE, 0, base)
        # step 2: clients train theta; step 3: the (secure) weighted average
        replies, self.theta = clients.aggregate("train", msgs, field="trainable",
                                                like=self.theta, weighted=self.method.weighted)
        if base is not None:
            self.holdings.confirm(asked, replies, BASE, 0)
        _part(self.model, mode).load_state_dict(self.theta)
        loss = mean_metric(replies, "train/loss")
        return {"train/loss": loss} if loss is not None else {}

    def evaluate(self, rnd: int) -> dict[str, float]:
        _part(self.model, self.method.trainable).load_state_dict(self.theta)
        return evaluate_vision(self.model, self.test_images, self.test_labels,
                               ids=self.test_ids, precision=self.cfg.training.precision,
                               reuse=self.cfg.eval.reuse)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.theta)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.theta = dict(state)
        _part(self.model, self.method.trainable).load_state_dict(self.theta)


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Train the global trainable weights on private images (task loss)."""
    cfg, mode, t = ctx.cfg, ctx.cfg.method.trainable, ctx.cfg.training
    fd = ctx.data()
    model = build_model(model_config(cfg), data_spec(fd), ctx.seed("init"))
    model = model.to(pick_device(client_device(cfg, ctx.cid)))
    if mode == "head":
        model.load_state_dict(ctx.received(msg, BASE, like=model.state_dict()))
    theta = msg.state("trainable", like=_part(model, mode).state_dict(), source="server")
    _part(model, mode).load_state_dict(theta)
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
        model, *image_tensors(fd.test), ids=[r["id"] for r in fd.test], precision=t.precision,
        reuse=ctx.cfg.eval.reuse)))
    upload = ctx.privatize(_part(model, mode).state_dict(), theta)
    return Payload(trainable=upload, num_examples=stats["num_examples"], metrics=metrics)
