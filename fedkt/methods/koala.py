"""KOALA: large-small model collaborative learning for resource-constrained clients.

Chen et al., "Federated Knowledge Transfer Fine-tuning Large Server Model with
Resource-Constrained IoT Clients" (KOALA, arXiv:2407.05268), Algorithm 1. Clients
only run small models; the server holds the large model and an unlabelled proxy
set and does all the distillation. Each round:

1. every client trains its small model on its private labelled images (CE) and
   uploads it with its sample count n_k;
2. soft labels on the proxy set:
   * ``homo`` (same small model everywhere): the uploaded models are averaged into
     the global small model omega (weights n_k), soft labels softmax(f(x, omega)/T)
     (Eq. 2);
   * ``hete`` (different small models): each output z_k is refined,
     z_hat = A (z - z_min) / (z_bar - z_min) (Eq. 8), integrated with weights n_k
     (Eq. 9), soft labels softmax(z_tilde / T) (Eq. 10);
3. reverse distillation (small -> large): only the large model's adapter (its
   classifier head) trains, on KL(soft labels || softmax(F(x)/T)) (Eqs. 3, 11);
4. forward distillation (large -> small), unless ``forward_distillation: false``:
   the global small model (homo) or every client's small model (hete) trains on
   KL(softmax(F(x)/T) || softmax(f(x)/T)) + lambda MSE(f_g(x) W, F_h(x)), the large
   model's first-h-block features against the small model's first-g-block features
   through a learnable bridging matrix W (Eqs. 12-14 homo, 15-17 hete);
5. the updated small models go back to their clients.

KL direction everywhere: the target distribution (the teacher's) is the first
argument, KL(P_teacher || P_student) = sum P_teacher (log P_teacher - log P_student),
at temperature T on both sides and without a T^2 factor, as the equations are written.

The large model's backbone stays frozen (the paper tunes only the adapter of a
pretrained model); see :class:`fedkt.training_vision.VisionPretrain` for the
class-disjoint labelled data that stands in for its ImageNet pretraining. The server
never reads a label of the federated task: its proxy set is the public split's images.

``teacher`` is the paper's Fig. 2 control: ``clients`` (KOALA), ``shuffled`` (the soft
labels of step 2 permuted across proxy images with a seeded permutation each round:
same label marginal and confidence, no per-image knowledge) or ``untrained`` (soft
labels from freshly initialised, untrained small models).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedkt.aggregation import fedavg
from fedkt.config import ConfigError, MethodConfig, ModelConfig, RunConfig
from fedkt.data.images import DataSpec, data_spec, image_tensors
from fedkt.losses import (
    BridgingMatrix,
    koala_feature_loss,
    koala_integrate_logits,
    koala_kd_loss,
    koala_refine_logits,
    koala_soft_labels,
)
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Method, Server, derive_seed, mean_number
from fedkt.models.vision import build_model, features_and_logits, head_module, pool_features
from fedkt.payload import Payload
from fedkt.train.optim import pick_device
from fedkt.train.pretrain import (
    VisionPretrain,
    check_pretrain_source,
    pretrained_model,
    server_pretrain_records,
    split_server_data,
)
from fedkt.train.vision import evaluate_vision, extract_features, predict_logits, train_vision

__all__ = [
    "KoalaConfig",
    "KoalaServer",
    "client_reductions",
    "forward_distillation_loss",
    "hete_soft_labels",
    "homo_soft_labels",
    "reverse_distillation_loss",
]


class KoalaConfig(MethodConfig):
    """KOALA hyper-parameters (paper defaults: Adam, T=7, lr 1e-3 / 1e-4, wd 1e-6, A=2)."""

    name: Literal["koala"] = "koala"
    # homo: every client runs the same small model (averaged into a global one);
    # hete: clients' small models differ (Eqs. 8-11, each distilled separately).
    mode: Literal["homo", "hete"] = "homo"
    forward_distillation: bool = True
    temperature: float = Field(7.0, gt=0)
    amplification: float = Field(2.0, gt=0)  # A of Eq. 8
    reverse_lr: float = Field(1e-3, gt=0)
    forward_lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(1e-6, ge=0)
    # Passes over the proxy set per round.
    reverse_epochs: float = Field(5.0, gt=0)
    forward_epochs: float = Field(1.0, gt=0)
    distill_batch_size: int = Field(64, ge=1)
    # lambda of Eqs. 14 and 17 (weight of the feature loss).
    feature_weight: float = Field(1.0, ge=0)
    # h and g: blocks of the large / small model whose output features are matched
    # (None: the whole backbone, i.e. the features the head reads).
    large_feature_layers: int | None = Field(None, ge=0)
    small_feature_layers: int | None = Field(None, ge=0)
    # Both feature maps are average-pooled to this size before W (1: vectors).
    feature_size: int = Field(1, ge=1)
    # Whose soft labels teach the large model: clients (KOALA) or a random-teacher control.
    teacher: Literal["clients", "shuffled", "untrained"] = "clients"
    pretrain: VisionPretrain = Field(default_factory=VisionPretrain)


# --------------------------------------------------------------------------- equations


def homo_soft_labels(global_logits: Tensor, temperature: float) -> Tensor:
    """Eq. 2: soft labels softmax(f(x, omega) / T) of the global small model."""
    return koala_soft_labels(global_logits, temperature)


def hete_soft_labels(logits: list[Tensor], counts: list[float], amplification: float,
                     temperature: float) -> Tensor:
    """Eqs. 8-10: refine each client's logits, integrate by sample counts, soften."""
    refined = [koala_refine_logits(z, amplification) for z in logits]  # Eq. 8
    integrated = koala_integrate_logits(refined, counts)  # Eq. 9
    return koala_soft_labels(integrated, temperature)  # Eq. 10


def reverse_distillation_loss(large_logits: Tensor, soft_labels: Tensor,
                              temperature: float) -> Tensor:
    """Eqs. 3 and 11: KL(soft labels || softmax(F(x) / T)); the large model is fitted."""
    return koala_kd_loss(large_logits, soft_labels, temperature)


def forward_distillation_loss(
    small: nn.Module,
    bridge: BridgingMatrix,
    x: Tensor,
    large_probs: Tensor,
    large_features: Tensor,
    *,
    temperature: float,
    feature_weight: float,
    small_layers: int | None,
    feature_size: int = 1,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eqs. 12-14 (homo) / 15-17 (hete): ``(total, output KL, feature MSE)``.

    ``large_probs`` = softmax(F(x)/T) of the large model, ``large_features`` its
    first-h-block features pooled to ``feature_size``. Output term: KL(large || small)
    (Eqs. 12, 15); feature term: MSE(f_g(x) W, F_h(x)) (Eqs. 13, 16); total: output
    + lambda * feature (Eqs. 14, 17).
    """
    feats, logits = features_and_logits(small, x, small_layers)
    size = feature_size if large_features.dim() == 4 else 1
    kd = koala_kd_loss(logits, large_probs, temperature)
    feat = koala_feature_loss(pool_features(feats, size), large_features, bridge)
    return kd + feature_weight * feat, kd, feat


# --------------------------------------------------------------------------- Table 2


def client_reductions(cfg: RunConfig, spec: DataSpec) -> dict[str, float]:
    """Table 2's arithmetic on counted parameters and FLOPs, as the paper states it.

    Storage: ``1 - mean_k params(small_k) / params(large)``; FLOPs: ``1 - mean_k
    FLOPs(small_k) / FLOPs(large)`` (the mean over the clients' models: one model in
    homo, each client's own in hete), at the run's input (``*_flops_reduction``) and at
    the paper's 3x64x64 counting input (``*_flops_reduction_64``), with the models built
    as configured. Logged with every server evaluation, so suite claims can test them.
    """
    from fedkt.models.vision import count_flops, count_params

    def counts(mcfg: ModelConfig, s: DataSpec) -> tuple[int, int]:
        model = build_model(mcfg, s, 0)
        return count_params(model), count_flops(model, (s.in_channels, s.image_size,
                                                        s.image_size))

    paper = DataSpec(spec.num_classes, 3, 64)
    smalls = [_small_config(cfg, c) for c in cfg.client_ids()]
    out: dict[str, float] = {}
    for tag, s in (("", spec), ("_64", paper)):
        lp, lf = counts(cfg.server, s)
        got = [counts(m, s) for m in smalls]
        mean_p = sum(p for p, _ in got) / len(got)
        out[f"client_storage_reduction{tag}"] = 1 - mean_p / lp
        out[f"client_flops_reduction{tag}"] = 1 - sum(f for _, f in got) / len(got) / lf
        if not tag:
            out.update(large_params=float(lp), client_params_mean=mean_p,
                       client_storage_reduction_min=1 - max(p for p, _ in got) / lp)
    return out


# --------------------------------------------------------------------------- server


def _small_config(cfg, cid: int) -> ModelConfig:
    return cfg.clients.model_for(cid)


class KoalaServer(Server[KoalaConfig]):
    """Algorithm 1: aggregate / integrate, reverse distillation, forward distillation."""

    def setup(self) -> None:
        cfg, m = self.cfg, self.method
        if cfg.server is None:
            raise ConfigError("server: koala needs the server's large model (e.g. vgg_small)")
        models = {c.model_dump_json() for c in cfg.clients.models}
        if not models:
            raise ConfigError("clients.models: koala needs the clients' small model(s)")
        if m.mode == "homo" and len(models) > 1:
            raise ConfigError(
                "method.mode homo: all clients must run the same small model; use mode hete "
                "for different small models"
            )
        torch.manual_seed(derive_seed(cfg.seed, "koala-setup"))
        fd = self.data()
        self.spec: DataSpec = data_spec(fd)
        self.device = pick_device(cfg.runtime.device)
        check_pretrain_source(cfg.server, cfg.data.dataset, m.pretrain)
        pre, n_pre = server_pretrain_records(m.pretrain)
        proxy = split_server_data(fd.public)  # images only: no task label is read
        prec = self.precision = cfg.training.precision
        large = pretrained_model(cfg.server, self.spec, pre, m.pretrain, cfg.seed, prec, n_pre)
        self.large = large.to(self.device).eval()
        self.head = head_module(self.large)
        head_params = {id(p) for p in self.head.parameters()}
        for p in self.large.parameters():
            p.requires_grad_(id(p) in head_params)
        self.initial_head = {k: v.clone() for k, v in self.head.state_dict().items()}
        # The backbone is frozen, so its outputs on the proxy and test sets are fixed.
        self.proxy_images = proxy
        self.proxy_features = extract_features(self.large, proxy, precision=prec)  # head inputs
        self.proxy_large_h = extract_features(self.large, proxy, m.large_feature_layers,
                                              pool=m.feature_size, precision=prec)
        test_images, self.test_labels = image_tensors(fd.test)
        self.test_ids = [r["id"] for r in fd.test]
        self.test_features = extract_features(self.large, test_images, precision=prec)
        # Small models: one global model (homo) or one per client (hete), and their W.
        keys = ["global"] if m.mode == "homo" else [str(c) for c in cfg.client_ids()]
        self.small: dict[str, nn.Module] = {}
        self.bridges: dict[str, BridgingMatrix] = {}
        for key in keys:
            mcfg = _small_config(cfg, 0 if key == "global" else int(key))
            small = build_model(mcfg, self.spec, derive_seed(cfg.seed, "small-init", key))
            self.small[key] = small.to(self.device)
            torch.manual_seed(derive_seed(cfg.seed, "bridge", key))
            self.bridges[key] = BridgingMatrix(
                small.feature_dim(m.small_feature_layers),
                self.large.feature_dim(m.large_feature_layers)).to(self.device)
        # Clients that hold their current small model (none yet in this process).
        self.synced: set[int] = set()
        self.sizes = client_reductions(cfg, self.spec)

    def key(self, cid: int) -> str:
        return "global" if self.method.mode == "homo" else str(cid)

    def template(self, cid: int) -> dict[str, Tensor]:
        return self.small[self.key(cid)].state_dict()

    # ------------------------------------------------------------------ round

    def round(self, rnd: int, clients) -> dict[str, float]:
        m = self.method
        # 1. local training on private data; a client without its model gets it first.
        msgs = {cid: Payload(model=self.template(cid)) if cid not in self.synced else Payload()
                for cid in clients.ids}
        replies = clients.call("train", msgs)
        self.synced = set(replies)
        checked = clients.validate(replies, lambda c, r: (
            r.state("model", like=self.template(c), source=f"client {c}"),
            r.number("num_examples", source=f"client {c}", low=0)), "train")
        states = {c: state for c, (state, _) in checked.items()}
        counts = {c: n for c, (_, n) in checked.items()}
        # 2. soft labels on the unlabelled proxy set
        if m.mode == "homo":
            self.small["global"].load_state_dict(fedavg(list(states.values()),
                                                        list(counts.values())))
            updated = ["global"]
            soft = homo_soft_labels(self.teacher_logits("global"), m.temperature)  # Eq. 2
        else:
            for c, state in states.items():
                self.small[str(c)].load_state_dict(state)
            updated = [str(c) for c in states]
            soft = hete_soft_labels([self.teacher_logits(k) for k in updated],
                                    [counts[int(k)] for k in updated],
                                    m.amplification, m.temperature)  # Eqs. 8-10
        if m.teacher == "shuffled":  # Fig. 2's "random selection": no per-image knowledge
            gen = torch.Generator().manual_seed(self.seed(rnd, "shuffle-teacher"))
            soft = soft[torch.randperm(len(soft), generator=gen)]
        # 3. reverse distillation: only the large model's adapter (head) learns
        rev = train_vision(
            self.head, (self.proxy_features, soft),
            loss_fn=lambda head, b: reverse_distillation_loss(head(b[0]), b[1], m.temperature),
            epochs=m.reverse_epochs, batch_size=m.distill_batch_size, lr=m.reverse_lr,
            weight_decay=m.weight_decay, betas=(0.9, 0.999), seed=self.seed(rnd, "reverse"),
            precision=self.precision)
        metrics = {"train/loss": rev["loss"], "train/reverse_kl": rev["loss"],
                   "train/client_loss": mean_number(replies, "train_loss", checked) or 0.0}
        # 4. forward distillation into the small model(s)
        if m.forward_distillation:
            large_probs = koala_soft_labels(
                predict_logits(self.head, self.proxy_features, precision=self.precision),
                m.temperature)
            fwd = [self.forward_distill(rnd, k, large_probs) for k in updated]
            metrics["train/forward_loss"] = sum(f["loss"] for f in fwd) / len(fwd)
        # 5. the updated small models go back to their clients
        if m.mode == "homo":
            back = {cid: Payload(model=self.small["global"].state_dict()) for cid in clients.ids}
        else:
            back = {c: Payload(model=self.small[str(c)].state_dict())
                    if m.forward_distillation else Payload() for c in states}
        got = clients.call("update", back)
        self.synced &= set(got)
        return metrics

    @torch.no_grad()
    def small_logits(self, key: str) -> Tensor:
        return predict_logits(self.small[key], self.proxy_images, precision=self.precision)

    @torch.no_grad()
    def teacher_logits(self, key: str) -> Tensor:
        """Proxy-set logits of the teacher: the small model, or (``teacher: untrained``)
        the same never-trained small model every round."""
        if self.method.teacher != "untrained":
            return self.small_logits(key)
        mcfg = _small_config(self.cfg, 0 if key == "global" else int(key))
        fresh = build_model(mcfg, self.spec, derive_seed(self.cfg.seed, "untrained-teacher", key))
        return predict_logits(fresh.to(self.device), self.proxy_images, precision=self.precision)

    def forward_distill(self, rnd: int, key: str, large_probs: Tensor) -> dict[str, float]:
        """Eqs. 12-17 on the proxy set: the small model and its W learn, the large is fixed."""
        m = self.method
        small, bridge = self.small[key], self.bridges[key]

        def loss_fn(model: nn.Module, batch: list[Tensor]) -> Tensor:
            x, probs, large_h = batch
            return forward_distillation_loss(
                model, bridge, x, probs, large_h, temperature=m.temperature,
                feature_weight=m.feature_weight, small_layers=m.small_feature_layers,
                feature_size=m.feature_size)[0]

        return train_vision(
            small, (self.proxy_images, large_probs, self.proxy_large_h), loss_fn=loss_fn,
            params=[*small.parameters(), *bridge.parameters()], modules=[bridge],
            epochs=m.forward_epochs, batch_size=m.distill_batch_size, lr=m.forward_lr,
            weight_decay=m.weight_decay, seed=self.seed(rnd, "forward", key),
            precision=self.precision)

    def evaluate(self, rnd: int) -> dict[str, float]:
        scores = evaluate_vision(self.head, self.test_features, self.test_labels,
                                     ids=self.test_ids, precision=self.precision)
        return {**scores, **self.sizes}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"large_head.{k}": v for k, v in self.head.state_dict().items()}
        for key, small in self.small.items():
            out.update({f"small.{key}.{k}": v for k, v in small.state_dict().items()})
            out.update({f"bridge.{key}.{k}": v for k, v in self.bridges[key].state_dict().items()})
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        def part(prefix: str) -> dict[str, Tensor]:
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

        self.head.load_state_dict(part("large_head."))
        for key, small in self.small.items():
            small.load_state_dict(part(f"small.{key}."))
            self.bridges[key].load_state_dict(part(f"bridge.{key}."))
        # Resuming: clients kept their models on their own disks (a client that lost
        # its copy fails the round once and is re-sent the model in the next one).
        self.synced = set(self.cfg.client_ids())


# --------------------------------------------------------------------------- clients


def _client_model(ctx: ClientContext) -> nn.Module:
    spec = data_spec(ctx.data())
    model = build_model(_small_config(ctx.cfg, ctx.cid), spec, ctx.seed("init"))
    return model.to(pick_device(ctx.cfg.runtime.device))


def _load_model(ctx: ClientContext, msg: Payload, model: nn.Module) -> dict[str, Tensor]:
    if "model" in msg:
        state = msg.state("model", like=model.state_dict(), source="server")
    else:
        state = ctx.load_state("small")
        if state is None:
            raise RuntimeError(f"{ctx.name} has no small model on disk and none was sent")
    model.load_state_dict(state)
    return state


def _test_metrics(ctx: ClientContext, model: nn.Module) -> dict[str, float]:
    def scores() -> dict[str, float]:
        test = ctx.data().test
        images, labels = image_tensors(test)
        return evaluate_vision(model, images, labels, ids=[r["id"] for r in test],
                                   precision=ctx.cfg.training.precision)

    return ctx.test_metrics(scores)


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Step 1: train the small model on private labelled images (CE), upload it."""
    t = ctx.cfg.training
    model = _client_model(ctx)
    _load_model(ctx, msg, model)
    images, labels = image_tensors(ctx.private)
    stats = train_vision(model, (images, labels), epochs=t.local_epochs,
                             batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                             betas=t.betas, seed=ctx.seed("train"), max_steps=t.max_steps,
                             max_grad_norm=t.max_grad_norm, precision=t.precision)
    state = model.state_dict()
    ctx.save_state("small", state)
    return Payload(model=state, num_examples=stats["num_examples"], train_loss=stats["loss"],
                   metrics={"train/loss": stats["loss"], "train/steps": stats["steps"]})


def client_update(ctx: ClientContext, msg: Payload) -> Payload:
    """Step 5: keep the small model the server sent back (if any) and evaluate it."""
    model = _client_model(ctx)
    state = _load_model(ctx, msg, model)
    if "model" in msg:
        ctx.save_state("small", state)
    return Payload(metrics=_test_metrics(ctx, model))


METHOD = register(Method(
    name="koala", config=KoalaConfig, server=KoalaServer,
    handlers={"train": client_train, "update": client_update},
    server_sees="whole small model", clients_see="updated small model",
    summary="small models -> large model's adapter (reverse KD) -> small models (forward "
            "KD); homo or hete",
    paper="Chen et al., Federated Knowledge Transfer Fine-tuning Large Server Model with "
          "Resource-Constrained IoT Clients (KOALA), arXiv:2407.05268",
))
