"""FedKD, Algorithm 1: adaptive mutual distillation on the clients, SVD-compressed student updates.

Wu et al., "Communication-efficient federated learning via knowledge distillation",
Nature Communications 13, 2032 (2022), Eqs. 1-9 and Algorithm 1. Reference code:
wuch15/FedKD (``model_bert.py``, ``run.py``).

Every client keeps a large local *teacher* (the model it uses for inference; it never
leaves the client) and a copy of a small *student* shared by all clients.  Steps are cited
as "step N (Alg. 1 l. L)", by the numbered lines of the paper's Algorithm 1.  A round:

1. (Alg. 1 l. 6-7, 25-31) on each local batch, teacher and student learn from the labels (Eqs. 1-2) and from
   each other: adaptive KL both ways (Eqs. 3-4) and an adaptive hidden loss between
   teacher states and ``W_h`` times the student's, plus their attention maps (Eq. 5),
   all divided by the sum of the two task losses; totals Eqs. 6-7
   (:mod:`~fedkt.methods.fedkd.losses`);
2. (Alg. 1 l. 8-10) the client factorises its student update ``new - received`` parameter by parameter
   with SVD, keeping the fewest singular values whose energy exceeds ``T`` (Eq. 8), and
   uploads the factors; ``T`` rises linearly from ``T_start`` to ``T_end`` over the
   rounds (Eq. 9);
3. (Alg. 1 l. 11-22) the server reconstructs the updates, averages them (FedAvg, example-weighted),
   factorises the aggregate with the same ``T`` and sends it back ("adopt"); clients and
   server add its reconstruction to their copy of the global student.

The exchange of steps 2-3 is :mod:`fedkt.methods.exchange` (shared with encoder FedAvg, whose
bytes therefore compare).  Biases and norms travel raw; as in the official code the
embeddings are frozen in both models (``freeze_embeddings``) and so never travel.  The
teacher and the ``W_h`` maps stay on the client's disk.  Clients evaluate their
teachers; the server evaluates the global student.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedkt.federated.compression import from_payload
from fedkt.federated.payload import Payload
from fedkt.infra.placement import client_device, server_device
from fedkt.infra.precision import autocast, autocast_dtype, grad_scaler
from fedkt.methods.base import ClientContext, Clients, Server
from fedkt.methods.exchange import (
    GLOBAL,
    aggregate_updates,
    apply_update,
    round_threshold,
    sync_clients,
    upload_update,
)
from fedkt.train.encoder import (
    build_encoder,
    check_text_classification,
    encoder_config,
    evaluate_encoder,
    load_trainable,
    local_steps,
    trainable_state,
)
from fedkt.train.loop import run_steps
from fedkt.train.optim import make_optimizer, step, trainable

from .config import FedKDConfig
from .losses import fedkd_losses
from .models import FedKDModels

State = dict[str, Tensor]


# --------------------------------------------------------------------------- server side


class FedKDServer(Server[FedKDConfig]):
    """Algorithm 1, server: aggregate compressed student updates, send back the aggregate."""

    def global_layers(self) -> int | None:
        """The depth of the model whose updates travel: the student's."""
        return self.method.student_layers

    def setup(self) -> None:
        m = self.method
        labels = check_text_classification(self.data(), m.name)
        self.student, self.tokenizer = build_encoder(
            encoder_config(self.cfg), labels, self.cfg.seed, layers=self.global_layers(),
            freeze_embeddings=m.freeze_embeddings, pooling=m.pooling,
            device=server_device(self.cfg))
        self.global_state = trainable_state(self.student)
        self.version = 0  # the round whose aggregate the global student includes
        ids = self.cfg.client_ids()  # every party builds version 0 itself, from the seed
        self.holdings.confirm(ids, ids, GLOBAL, 0)

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        T = round_threshold(self.method, rnd, self.cfg.rounds)  # Eq. 9
        # steps 1-2 (Alg. 1 l. 6-10): clients: mutual distillation (Eqs. 1-7), student update
        # up, factorised (Eq. 8)
        replies, update, metrics = aggregate_updates(
            clients, self.holdings, "train", self.global_state, self.version, T,
            self.method.weighted)
        # step 3 (Alg. 1 l. 11-19): the server applies the aggregate, factorised with the
        # same T ...
        self.global_state = apply_update(self.global_state, from_payload(update))
        self.version = rnd
        # ... and every client applies it to its copy ("adopt"; Alg. 1 l. 20-22)
        sync_clients(clients, self.holdings, update, self.version)
        return metrics

    def evaluate(self, rnd: int) -> dict[str, float]:
        load_trainable(self.student, self.global_state)
        return evaluate_encoder(self.cfg, self.student, self.tokenizer, self.data().test)

    def state_dict(self) -> State:
        return {**{f"global.{k}": v for k, v in self.global_state.items()},
                "version": torch.tensor(self.version, dtype=torch.int64)}

    def load_state_dict(self, state: State) -> None:
        loaded = {k[len("global."):]: v for k, v in state.items() if k.startswith("global.")}
        if set(loaded) != set(self.global_state):
            raise ValueError("checkpoint does not hold this model's global state")
        self.global_state = {k: loaded[k].clone() for k in self.global_state}  # model order
        self.version = int(state["version"].item())


# --------------------------------------------------------------------------- client side


def train_fedkd(cfg: Any, models: FedKDModels, records: list[dict], *, seed: int
                ) -> dict[str, float]:
    """Step 1 (Alg. 1 l. 6-7, 25-31), local mutual distillation: one optimiser step of Eqs. 6-7 per batch.

    The teacher and ``W_h`` learn at ``teacher_lr``, the student at ``student_lr``;
    their gradients are clipped separately (``training.max_grad_norm``).
    """
    batches = local_steps(cfg.training, models.tokenizer, records, cfg.data.max_length, seed)
    if not batches:
        return {"loss": float("nan"), "steps": 0, "num_examples": 0, "step_seconds": 0.0}
    opt, sched = make_optimizer(models.param_groups(*cfg.method.rates(cfg.training.lr)),
                                cfg.training, len(batches))
    modules = (models.teacher, models.student, models.projections)
    device = next(models.teacher.parameters()).device
    scaler = grad_scaler(cfg, device)

    def batch_loss(i: int, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        with autocast(cfg, device):  # the losses are computed in fp32
            out = fedkd_losses(models, cfg.method, batch)  # Eqs. 1-7
        return out.joint, {key: getattr(out, key) for key in (
            "joint", "teacher_task", "student_task", "teacher_kd", "student_kd", "hidden")}

    loop = run_steps(batches, batch_loss,
                     lambda loss: step(loss, [opt], schedules=[sched], scaler=scaler,
                                       clip=[trainable(mod) for mod in modules],
                                       max_grad_norm=cfg.training.max_grad_norm),
                     modules=modules, seed=seed, total=len(batches), desc="fedkd train",
                     cast=autocast_dtype(cfg, device))
    stats = loop.means()
    stats.update(loss=stats.pop("joint"), steps=loop.steps, num_examples=len(records),
                 step_seconds=loop.seconds / loop.steps)
    return stats


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Algorithm 1, client: mutual distillation, then upload the compressed student update."""
    cfg, m = ctx.cfg, ctx.method
    models = FedKDModels.build(cfg, check_text_classification(ctx.data(), m.name),
                               device=client_device(cfg, ctx.cid))
    teacher = ctx.load_state("teacher")  # the teacher and W_h never leave this client
    if teacher is not None:
        load_trainable(models.teacher, teacher)
    projections = ctx.load_state("projections")
    if projections is not None:
        models.projections.load_state_dict(projections)
    initial = trainable_state(models.student)  # version 0: built from the seed everywhere
    received = ctx.received(msg, GLOBAL, start=initial, like=initial)
    load_trainable(models.student, received)
    stats = train_fedkd(cfg, models, ctx.private, seed=ctx.seed("train"))  # step 1 (Alg. 1 l. 6-7)
    update = {k: v - received[k] for k, v in trainable_state(models.student).items()}
    T = msg.number("T", source="server", low=0.0) if m.compress else None
    encoded, ratio, seconds = upload_update(ctx, update, T)  # step 2 (Alg. 1 l. 8-10; Eq. 8)
    ctx.save_state("teacher", trainable_state(models.teacher))
    ctx.save_state("projections", models.projections.state_dict())
    metrics: dict[str, float] = {f"train/{k}": v for k, v in stats.items()
                                 if k not in ("num_examples",)}
    metrics["train/compress_seconds"] = seconds
    metrics["train/upload_ratio"] = ratio
    # the teacher is the model used for inference
    metrics.update(ctx.test_metrics(lambda: evaluate_encoder(cfg, models.teacher,
                                                             models.tokenizer, ctx.data().test)))
    return Payload(update=encoded, num_examples=stats["num_examples"], metrics=metrics)
