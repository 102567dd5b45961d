"""FedKD: adaptive mutual distillation and SVD-compressed student updates.

Wu et al., "Communication-efficient federated learning via knowledge distillation",
Nature Communications 13, 2032 (2022), Eqs. 1-9 and Algorithm 1. Reference code:
wuch15/FedKD (``model_bert.py``, ``run.py``).

Every client keeps a large local *teacher* (the model it uses for inference; it never
leaves the client) and a copy of a small *student* shared by all clients. A round:

1. on each local batch, teacher and student learn from the labels (Eqs. 1-2) and
   from each other: adaptive KL both ways (Eqs. 3-4) and an adaptive hidden loss
   between teacher states and ``W_h`` times the student's, plus their attention maps
   (Eq. 5), all divided by the sum of the two task losses; totals Eqs. 6-7;
2. the client factorises its student update ``new - received`` parameter by parameter
   with SVD, keeping the fewest singular values whose energy exceeds ``T`` (Eq. 8),
   and uploads the factors; ``T`` rises linearly from ``T_start`` to ``T_end`` over
   the rounds (Eq. 9);
3. the server reconstructs the updates, averages them (FedAvg, example-weighted),
   factorises the aggregate with the same ``T`` and sends it back ("sync"); clients
   and server reconstruct it and add it to their copy of the global student.

Biases and norms travel raw; conv or higher-rank weights are factorised as
``(out, -1)`` matrices (:mod:`fedkt.compression`). As in the official code the
embeddings are frozen in both models (``freeze_embeddings``) and so never travel.
The teacher, its optimiser-free state and the ``W_h`` maps stay on the client's disk.

Setting: ``clients.models[0]`` is the teacher (e.g. ``all-minilm-l6-v2``); the
student is its embeddings and first ``student_layers`` layers, the same on every
client (the head is seeded by ``seed``). Clients evaluate their teachers; the server
evaluates the global student.

The update exchange (:class:`GlobalModelSync`, :func:`client_global`,
:func:`client_sync`, :func:`encode_update`) is shared with the ``fedavg_encoder``
baseline (:mod:`fedkt.methods.encoder_baselines`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from fedkt.compression import (
    CompressedTensor,
    compress_state,
    compressed_nbytes,
    decompress_state,
    dense_nbytes,
    from_payload,
    threshold_schedule,
    to_payload,
)
from fedkt.config import ConfigError, MethodConfig, ModelConfig, RunConfig
from fedkt.losses import (
    FedKDLosses,
    fedkd_adaptive_kd,
    fedkd_hidden_loss,
    fedkd_objectives,
    fedkd_task_loss,
)
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Clients, Method, Server, mean_number
from fedkt.payload import Payload, PayloadError
from fedkt.precision import autocast, grad_scaler
from fedkt.train.encoder import (
    build_encoder,
    check_text_classification,
    evaluate_encoder,
    load_trainable,
    local_steps,
    model_inputs,
    num_layers,
    trainable_state,
)
from fedkt.train.loop import run_steps
from fedkt.train.optim import grad_norm, make_optimizer, step

State = dict[str, Tensor]
VERSION_KEY = "__version__"
# eta_s / eta_t of the paper's Table 6 (SMM4H: 1e-5 / 2e-6).
STUDENT_LR_RATIO = 5.0


class ExchangeSettings(MethodConfig):
    """How a global encoder's updates travel: SVD compression (Eqs. 8-9), FedAvg weights."""

    compress: bool = True
    T_start: float = Field(0.95, ge=0.0, le=1.0)
    T_end: float = Field(0.98, ge=0.0, le=1.0)
    # Eq. 9's t: "endpoints" (round 1 uses T_start, the last T_end) or "official" (run.py).
    schedule: Literal["endpoints", "official"] = "endpoints"
    # Weight each client's update by its number of training examples (FedAvg).
    weighted: bool = True
    # The embeddings neither train nor travel (official code).
    freeze_embeddings: bool = True


class EncoderHead(MethodConfig):
    """The classification head of every encoder method (FedKD and its baselines)."""

    # attention: attentive pooling + a dense layer (the paper's SMM4H head); mean: masked
    # mean pooling + a dense layer; cls: the [CLS] state through BERT's pooler (the
    # *ForSequenceClassification head). The pooling weights train and travel with the model.
    pooling: Literal["attention", "mean", "cls"] = "attention"


class FedKDConfig(ExchangeSettings, EncoderHead):
    name: Literal["fedkd"] = "fedkd"
    # The student: the teacher's embeddings and first N layers (paper: 4 or 2 of 12).
    student_layers: int = Field(2, ge=1)
    # Teacher layer (1-based) matched to student layer l = 1..N in Eq. 5; 0 leaves l
    # unmatched. None: l * L_t / N (the official mapping: last to last, evenly spaced).
    layer_map: list[int] | None = None
    hidden_loss: bool = True
    attention_loss: bool = True
    temperature: float = Field(1.0, gt=0)
    # Learning rate of the teacher and W_h (None: training.lr).
    teacher_lr: float | None = Field(None, gt=0)
    # Learning rate of the student (None: STUDENT_LR_RATIO x the teacher's, Table 6's
    # eta_s / eta_t = 1e-5 / 2e-6).
    student_lr: float | None = Field(None, gt=0)
    # 1 / (L_t^t + L_s^t) as a weight (detached) or in the graph (official code).
    detach_denominator: bool = True
    # Lower bound of L_t^t + L_s^t: the adaptive weight 1 / (L_t^t + L_s^t) of Eqs. 3-5 is
    # at most 1 / min_task_loss_sum (10 by default; about 0.72 at initialisation).
    min_task_loss_sum: float = Field(0.1, gt=0)

    def rates(self, lr: float) -> tuple[float, float]:
        """(teacher, student) learning rates given ``training.lr``."""
        teacher = self.teacher_lr or lr
        return teacher, self.student_lr or STUDENT_LR_RATIO * teacher

    @model_validator(mode="after")
    def _layer_map_length(self) -> FedKDConfig:
        if self.layer_map is not None and len(self.layer_map) != self.student_layers:
            raise ValueError(f"layer_map has {len(self.layer_map)} entries; give one teacher "
                             f"layer (or 0) per student layer ({self.student_layers})")
        return self


def round_threshold(method: ExchangeSettings, rnd: int, rounds: int) -> float | None:
    """Eq. 9 energy threshold of round ``rnd`` (1-based); None without compression."""
    if not method.compress:
        return None
    return threshold_schedule(rnd - 1, rounds, method.T_start, method.T_end,
                              convention=method.schedule)


def teacher_config(cfg: RunConfig) -> ModelConfig:
    """The one encoder of ``clients.models`` (FedKD's teacher, the baselines' model)."""
    if len({m.model_dump_json() for m in cfg.clients.models}) != 1:
        raise ConfigError(f"clients.models: {cfg.method.name} needs one encoder shared by "
                          "all clients (the teacher; the student is cut from it)")
    return cfg.clients.model_for(0)


# --------------------------------------------------------------------------- update exchange


def encode_update(update: State, T: float | None) -> State:
    """Eq. 8: the tensors that carry ``update`` (SVD factors with threshold ``T``; raw if None)."""
    if T is None:
        comp = {k: CompressedTensor(tuple(v.shape), v.dtype, raw=v.detach().clone())
                for k, v in update.items()}
    else:
        comp = compress_state(update, T)
    return to_payload(comp)


def decode_update(msg: Payload, key: str, like: State, source: str
                  ) -> dict[str, CompressedTensor]:
    """Validate an encoded update against the model it applies to (names, shapes, ranks)."""
    try:
        comp = from_payload(msg.state(key, source=source))
    except ValueError as exc:
        raise PayloadError(f"{source}: field {key!r}: {exc}") from None
    if set(comp) != set(like):
        missing, extra = sorted(set(like) - set(comp)), sorted(set(comp) - set(like))
        raise PayloadError(f"{source}: field {key!r}: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, c in comp.items():
        ref = like[name]
        if c.shape != tuple(ref.shape) or c.dtype != ref.dtype:
            raise PayloadError(f"{source}: field {key!r}[{name!r}]: shape {c.shape} {c.dtype}, "
                               f"expected {tuple(ref.shape)} {ref.dtype}")
        if c.rank is not None and c.rank > min(ref.shape[0], ref[0].numel()):
            raise PayloadError(f"{source}: field {key!r}[{name!r}]: rank {c.rank} exceeds "
                               f"the matrix {tuple(ref.shape)}")
        if c.raw is not None and tuple(c.raw.shape) != c.shape:
            raise PayloadError(f"{source}: field {key!r}[{name!r}]: raw part has shape "
                               f"{tuple(c.raw.shape)}, expected {c.shape}")
        if c.S is not None and (c.S.dim() != 1 or {c.S.dtype, c.Vh.dtype} != {c.dtype}):
            raise PayloadError(f"{source}: field {key!r}[{name!r}]: factors U, S, Vh must share "
                               f"the dtype {c.dtype} and S be a vector, got S {tuple(c.S.shape)} "
                               f"{c.S.dtype}, Vh {c.Vh.dtype}")
    return comp


def upload_update(ctx: ClientContext, update: State, T: float | None
                  ) -> tuple[State, float, float]:
    """What a client sends for its update: (tensors, dense/compressed size, seconds of Eq. 8).

    DP (when on) acts on the dense change before compression.  Under secure
    aggregation SecAgg+ masks are dense, so the client sends the low-rank
    reconstruction: Eq. 8's effect on the update, not its bandwidth saving (the
    download stays compressed).
    """
    update = ctx.privatize(update)
    t0 = time.perf_counter()
    encoded = encode_update(update, T)  # Eq. 8
    seconds = time.perf_counter() - t0
    ratio = dense_nbytes(update) / max(1, compressed_nbytes(from_payload(encoded)))
    if ctx.cfg.secure_aggregation.enabled:
        return decompress_state(from_payload(encoded)), 1.0, seconds
    return encoded, ratio, seconds


class GlobalModelSync:
    """Server side of the exchange: the global trainable state, its version, stale clients.

    ``version`` is the number of aggregates applied (the round that made it). A client
    that missed a sync (failed, timed out) is *stale* and gets the whole global state
    with its next training request instead of nothing.
    """

    def __init__(self, state: State) -> None:
        self.state = {k: v.detach().clone() for k, v in state.items()}
        self.version = 0
        self.stale: set[int] = set()

    def train_messages(self, ids: Iterable[int], **extra: Any) -> dict[int, Payload]:
        msgs = {}
        for cid in ids:
            msg = Payload(version=self.version, **extra)
            if cid in self.stale:
                msg["global"] = self.state
            msgs[cid] = msg
        return msgs

    def aggregate(self, clients: Clients, handler: str, msgs: dict[int, Payload],
                  T: float | None, weighted: bool, rnd: int
                  ) -> tuple[dict[int, Payload], State, dict[str, float]]:
        """Run ``handler``; FedAvg of the reconstructed client updates, re-encoded with ``T``.

        Applies the aggregate here and returns the replies, the encoded aggregate (what
        goes back to the clients) and traffic stats.  Under secure aggregation the
        clients upload their reconstructed (dense) updates and SecAgg+ sums them.
        """
        sent: list[int] = []

        def decode(cid: int, reply: Payload) -> State:
            comp = decode_update(reply, "update", self.state, f"client {cid}")
            sent.append(compressed_nbytes(comp))
            return decompress_state(comp)

        replies, mean = clients.aggregate(handler, msgs, field="update", like=self.state,
                                          weighted=weighted, decode=decode)
        encoded = encode_update(mean, T)  # the server compresses the aggregate the same way
        comp = from_payload(encoded)
        applied = decompress_state(comp)  # exactly what the clients will reconstruct
        self.state = {k: v + applied[k] for k, v in self.state.items()}
        self.version = rnd
        dense = dense_nbytes(self.state)
        up = sum(sent) / len(sent) if sent else dense  # secure aggregation: dense uploads
        return replies, encoded, {"train/upload_ratio": dense / max(1, up),
                                  "train/download_ratio": dense / max(1, compressed_nbytes(comp))}

    def send(self, clients: Clients, encoded: State) -> None:
        """Send the aggregate to every client; those that do not confirm become stale."""
        msg = Payload(update=encoded, version=self.version)
        replies = clients.call("sync", {cid: msg for cid in clients.ids}, evaluate=False)
        self.stale = set(clients.ids) - set(replies)

    def state_dict(self, prefix: str = "global.") -> State:
        out = {prefix + k: v for k, v in self.state.items()}
        out[VERSION_KEY] = torch.tensor(self.version, dtype=torch.int64)
        out["__stale__"] = torch.tensor(sorted(self.stale), dtype=torch.int64)
        return out

    def load_state_dict(self, state: State, prefix: str = "global.") -> None:
        loaded = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if set(loaded) != set(self.state):
            raise ValueError("checkpoint does not hold this model's global state")
        self.state = {k: v.clone() for k, v in loaded.items()}
        self.version = int(state[VERSION_KEY].item())
        self.stale = {int(c) for c in state["__stale__"].tolist()}


def client_global(ctx: ClientContext, msg: Payload, initial: State) -> State:
    """This client's copy of the global state at the server's version (saved to its disk).

    Round 1 starts from ``initial`` (built identically everywhere); later rounds from the
    copy the last sync left, or from the whole state a stale client receives.
    """
    version = int(msg.number("version", source="server", low=0))
    if "global" in msg:
        state = msg.state("global", like=initial, source="server")
    else:
        saved = ctx.load_state("global")
        have = 0 if saved is None else int(saved.pop(VERSION_KEY).item())
        if have != version:
            raise PayloadError(f"{ctx.name} holds global version {have} but the server is at "
                               f"{version}; the server resends it in full next round")
        state = initial if saved is None else saved
    ctx.save_state("global", {**state, VERSION_KEY: torch.tensor(version)})
    return state


def client_sync(ctx: ClientContext, msg: Payload) -> Payload:
    """Apply the server's aggregate to this client's copy of the global state."""
    version = int(msg.number("version", source="server", low=1))
    saved = ctx.load_state("global")
    if saved is None:
        raise PayloadError(f"{ctx.name} has no global state to update")
    have = int(saved.pop(VERSION_KEY).item())
    if have != version - 1:
        raise PayloadError(f"{ctx.name} holds global version {have}; the update is for "
                           f"{version - 1}")
    update = decompress_state(decode_update(msg, "update", saved, "server"))
    ctx.save_state("global", {**{k: v + update[k] for k, v in saved.items()},
                              VERSION_KEY: torch.tensor(version)})
    return Payload()


class SyncedEncoderServer(Server):
    """A server holding one global encoder whose updates travel as in FedKD."""

    handler = "train"

    def model_layers(self) -> int | None:
        raise NotImplementedError

    def setup(self) -> None:
        labels = check_text_classification(self.data(), self.method.name)
        self.model, self.tokenizer = build_encoder(
            teacher_config(self.cfg), labels, self.cfg.seed, layers=self.model_layers(),
            freeze_embeddings=self.method.freeze_embeddings, pooling=self.method.pooling,
            device=self.cfg.runtime.device)
        self.sync = GlobalModelSync(trainable_state(self.model))

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        T = round_threshold(self.method, rnd, self.cfg.rounds)
        extra = {} if T is None else {"T": T}
        replies, encoded, metrics = self.sync.aggregate(
            clients, self.handler, self.sync.train_messages(clients.ids, **extra), T,
            self.method.weighted, rnd)
        self.sync.send(clients, encoded)
        loss = mean_number(replies, "train_loss", [c for c, r in replies.items()
                                                   if r.get("num_examples")])
        if loss is not None:
            metrics["train/loss"] = loss
        if T is not None:
            metrics["train/T"] = T
        return metrics

    def evaluate(self, rnd: int) -> dict[str, float]:
        load_trainable(self.model, self.sync.state)
        return evaluate_encoder(self.cfg, self.model, self.tokenizer, self.data().test)

    def state_dict(self) -> State:
        return self.sync.state_dict()

    def load_state_dict(self, state: State) -> None:
        self.sync.load_state_dict(state)


# --------------------------------------------------------------------------- FedKD models


def layer_pairs(teacher_layers: int, student_layers: int, layer_map: list[int] | None
                ) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs of Eq. 5, 1-based."""
    if layer_map is None:
        return [(s, s * teacher_layers // student_layers) for s in range(1, student_layers + 1)]
    if len(layer_map) != student_layers:
        raise ConfigError(f"method.layer_map: {len(layer_map)} entries for "
                          f"{student_layers} student layers")
    for t in layer_map:
        if not 0 <= t <= teacher_layers:
            raise ConfigError(f"method.layer_map: teacher layer {t} is outside "
                              f"1..{teacher_layers} (0: unmatched)")
    return [(s, t) for s, t in enumerate(layer_map, start=1) if t]


@dataclass
class FedKDModels:
    """One client's mentor (teacher), mentee (student) and the W_h maps of Eq. 5."""

    teacher: nn.Module
    student: nn.Module
    projections: nn.ModuleList
    tokenizer: Any
    pairs: list[tuple[int, int]]

    @classmethod
    def build(cls, cfg: RunConfig, labels: int) -> FedKDModels:
        m: FedKDConfig = cfg.method
        model_cfg = teacher_config(cfg)
        kw = dict(freeze_embeddings=m.freeze_embeddings, eager_attention=m.attention_loss,
                  pooling=m.pooling, device=cfg.runtime.device)
        teacher, tokenizer = build_encoder(model_cfg, labels, cfg.seed, **kw)
        if m.student_layers > num_layers(teacher):
            raise ConfigError(f"method.student_layers: {m.student_layers} is more than the "
                              f"teacher's {num_layers(teacher)} layers")
        student, _ = build_encoder(model_cfg, labels, cfg.seed, layers=m.student_layers, **kw)
        pairs = layer_pairs(num_layers(teacher), m.student_layers, m.layer_map)
        d_t, d_s = teacher.config.hidden_size, student.config.hidden_size
        projections = nn.ModuleList()
        gen = torch.Generator().manual_seed(cfg.seed)
        for _ in pairs if m.hidden_loss else []:
            w = nn.Linear(d_s, d_t, bias=False)  # W_h: student dim -> teacher dim
            with torch.no_grad():
                if d_s == d_t:  # a truncated student starts in the teacher's space
                    w.weight.copy_(torch.eye(d_t))
                else:
                    w.weight.copy_(nn.init.xavier_uniform_(torch.empty(d_t, d_s), generator=gen))
            projections.append(w)
        device = next(teacher.parameters()).device
        return cls(teacher, student, projections.to(device), tokenizer, pairs)

    def parameters(self) -> list[nn.Parameter]:
        return [p for mod in (self.teacher, self.student, self.projections)
                for p in mod.parameters() if p.requires_grad]

    def param_groups(self, lr: float, student_lr: float) -> list[dict[str, Any]]:
        """Optimiser groups: teacher and W_h at ``lr``, the student at ``student_lr``."""
        def trainable(mod: nn.Module) -> list[nn.Parameter]:
            return [p for p in mod.parameters() if p.requires_grad]

        return [{"params": trainable(self.teacher) + trainable(self.projections), "lr": lr},
                {"params": trainable(self.student), "lr": student_lr}]


def check_heads(teacher_map: Tensor, student_map: Tensor, pair: tuple[int, int]) -> None:
    """Eq. 5 compares attention maps head by head: refuse maps of different head counts."""
    if teacher_map.shape != student_map.shape:
        s, t = pair
        raise ConfigError(
            f"method.attention_loss: student layer {s} has attention maps "
            f"{tuple(student_map.shape)} (batch, heads, query, key) and teacher layer {t} "
            f"{tuple(teacher_map.shape)}; Eq. 5 needs the same number of heads "
            "(set attention_loss: false for such a pair)")


def fedkd_losses(models: FedKDModels, method: FedKDConfig, batch: dict[str, Tensor]
                 ) -> FedKDLosses:
    """Eqs. 1-7 on one batch (both models in the graph; ``joint`` trains all of them)."""
    device = next(models.teacher.parameters()).device
    inputs = model_inputs(batch, device)
    labels = batch["labels"].to(device)
    mask = inputs.get("attention_mask")
    need_h = method.hidden_loss and bool(models.pairs)
    need_a = method.attention_loss and bool(models.pairs)
    out_t = models.teacher(**inputs, output_hidden_states=need_h, output_attentions=need_a)
    out_s = models.student(**inputs, output_hidden_states=need_h, output_attentions=need_a)
    task_t = fedkd_task_loss(out_t.logits, labels)  # Eq. 1
    task_s = fedkd_task_loss(out_s.logits, labels)  # Eq. 2
    denom = (task_t + task_s).clamp_min(method.min_task_loss_sum)
    kd_t, kd_s = fedkd_adaptive_kd(out_t.logits, out_s.logits, denom, 0.0,  # Eqs. 3-4
                                   temperature=method.temperature,
                                   detach_denominator=method.detach_denominator)
    hidden: Tensor | float = 0.0
    if need_h or need_a:
        h_t = [out_t.hidden_states[t] for _, t in models.pairs] if need_h else []
        h_s = [out_s.hidden_states[s] for s, _ in models.pairs] if need_h else []
        a_t, a_s = [], []
        if need_a:
            for s, t in models.pairs:
                at, as_ = out_t.attentions[t - 1], out_s.attentions[s - 1]
                check_heads(at, as_, (s, t))
                a_t.append(at)
                a_s.append(as_)
        w_h = list(models.projections) if need_h else []
        hidden = fedkd_hidden_loss(h_t, h_s, a_t or None, a_s or None, w_h, denom,  # Eq. 5
                                   mask=mask, detach_denominator=method.detach_denominator)
    return fedkd_objectives(task_t, task_s, kd_t, kd_s, hidden)  # Eqs. 6-7


def loss_magnitudes(models: FedKDModels, method: FedKDConfig, batch: dict[str, Tensor]
                    ) -> dict[str, float]:
    """The terms of Eqs. 1-5 on one batch, and how hard Eq. 5 and Eq. 3 pull the teacher.

    ``grad_ratio/hidden/layer_i`` and ``grad_ratio/kd/layer_i``: the norm of the gradient
    of ``L^h`` (Eq. 5) and of ``L_t^d`` (Eq. 3) on the teacher's layer ``i`` (0-based)
    over the norm of the task loss's (Eq. 1) there. Dropout follows the models' mode.
    """
    from fedkt.models.layers import layer_list

    out = fedkd_losses(models, method, batch)
    terms = {k: float(getattr(out, k).detach()) for k in
             ("teacher_task", "student_task", "teacher_kd", "student_kd", "hidden")}
    layers = layer_list(models.teacher)[2]
    for i, layer in enumerate(layers):
        params = [p for p in layer.parameters() if p.requires_grad]

        task = max(grad_norm(out.teacher_task, params), 1e-30)
        terms[f"grad_ratio/hidden/layer_{i}"] = grad_norm(out.hidden, params) / task
        terms[f"grad_ratio/kd/layer_{i}"] = grad_norm(out.teacher_kd, params) / task
    return terms


def train_fedkd(cfg: RunConfig, models: FedKDModels, records: list[dict], *, seed: int
                ) -> dict[str, float]:
    """Local mutual distillation: one optimiser step of Eqs. 6-7 per batch.

    Teacher and student gradients are clipped separately (``training.max_grad_norm``).
    """
    batches = local_steps(cfg.training, models.tokenizer, records, cfg.data.max_length, seed)
    if not batches:
        return {"loss": float("nan"), "steps": 0, "num_examples": 0, "step_seconds": 0.0}
    groups_lr = models.param_groups(*cfg.method.rates(cfg.training.lr))
    opt, sched = make_optimizer(groups_lr, cfg.training, len(batches))
    groups = [[p for p in mod.parameters() if p.requires_grad]
              for mod in (models.teacher, models.student, models.projections)]
    device = next(models.teacher.parameters()).device
    scaler = grad_scaler(cfg, device)

    def batch_loss(i: int, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        with autocast(cfg, device):  # the losses are computed in fp32 (fedkt.losses)
            out = fedkd_losses(models, cfg.method, batch)
        return out.joint, {key: getattr(out, key) for key in (
            "joint", "teacher_task", "student_task", "teacher_kd", "student_kd", "hidden")}

    # Teacher, student and W_h gradients are clipped separately.
    loop = run_steps(batches, batch_loss,
                     lambda loss: step(loss, [opt], clip=groups, scaler=scaler,
                                       max_grad_norm=cfg.training.max_grad_norm,
                                       schedules=[sched]),
                     modules=[models.teacher, models.student, models.projections], seed=seed,
                     total=len(batches), desc="fedkd train")
    n = len(batches)
    stats = loop.means()
    stats.update(loss=stats.pop("joint"), steps=n, num_examples=len(records),
                 step_seconds=loop.seconds / n)
    return stats


# --------------------------------------------------------------------------- client side


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Algorithm 1, client: mutual distillation, then upload the compressed student update."""
    cfg, m = ctx.cfg, ctx.method
    models = FedKDModels.build(cfg, check_text_classification(ctx.data(), m.name))
    teacher = ctx.load_state("teacher")
    if teacher is not None:
        load_trainable(models.teacher, teacher)
    projections = ctx.load_state("projections")
    if projections is not None:
        models.projections.load_state_dict(projections)
    received = client_global(ctx, msg, trainable_state(models.student))
    load_trainable(models.student, received)
    stats = train_fedkd(cfg, models, ctx.private, seed=ctx.seed("train"))
    update = {k: v - received[k] for k, v in trainable_state(models.student).items()}
    T = msg.number("T", source="server", low=0.0) if m.compress else None
    encoded, ratio, seconds = upload_update(ctx, update, T)
    ctx.save_state("teacher", trainable_state(models.teacher))
    ctx.save_state("projections", models.projections.state_dict())
    metrics: dict[str, float] = {f"train/{k}": v for k, v in stats.items()
                                 if k not in ("num_examples",)}
    metrics["train/compress_seconds"] = seconds
    metrics["train/upload_ratio"] = ratio
    # the teacher is the model used for inference
    metrics.update(ctx.test_metrics(lambda: evaluate_encoder(cfg, models.teacher,
                                                             models.tokenizer, ctx.data().test)))
    loss = stats["loss"] if stats["steps"] else 0.0
    return Payload(update=encoded, num_examples=stats["num_examples"], train_loss=loss,
                   metrics=metrics)


# --------------------------------------------------------------------------- server side


class FedKDServer(SyncedEncoderServer):
    """Algorithm 1, server: aggregate compressed student updates, send back the aggregate."""

    def model_layers(self) -> int:
        return self.method.student_layers


METHOD = register(Method(
    name="fedkd", config=FedKDConfig, server=FedKDServer,
    handlers={"train": client_train, "sync": client_sync}, aggregates=True,
    server_sees="SVD-compressed student update", clients_see="compressed global student update",
    summary="local teachers + shared student by adaptive mutual distillation; "
            "SVD-compressed student updates",
    paper="Wu et al., Communication-efficient federated learning via knowledge "
          "distillation, Nature Communications 2022",
))
