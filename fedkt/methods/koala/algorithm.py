"""KOALA, Algorithm 1: small models on the clients, all distillation on the server.

Chen et al., "Federated Knowledge Transfer Fine-tuning Large Server Model with
Resource-Constrained IoT Clients" (KOALA, arXiv:2407.05268), Algorithm 1.  Clients only
run small models; the server holds the large model and an unlabelled proxy set and does
all the distillation.  Steps are cited as "step N (Alg. 1 l. L)", by the numbered
lines of the paper's Algorithm 1 (its lines 5 and 8 hold a whole homo resp. hete round
of the server).  Each round:

1. (Alg. 1 l. 3) every client trains its small model on its private labelled images (CE) and uploads
   it with its sample count n_k;
2. soft labels on the proxy set (:mod:`~fedkt.methods.koala.losses`):
   * ``homo`` (Alg. 1 l. 4-6; same small model everywhere): the uploaded models are averaged into the
     global small model omega (weights n_k), soft labels softmax(f(x, omega)/T) (Eq. 2);
   * ``hete`` (Alg. 1 l. 7-9; different small models): each output z_k is refined,
     z_hat = A (z - z_min) / (z_bar - z_min) (Eq. 8), integrated with weights n_k
     (Eq. 9), soft labels softmax(z_tilde / T) (Eq. 10);
3. (Alg. 1 l. 5, 8) reverse distillation (small -> large): only the large model's adapter (its
   classifier head) trains, on KL(soft labels || softmax(F(x)/T)) (Eqs. 3, 11);
4. (Alg. 1 l. 5, 8) forward distillation (large -> small), unless ``forward_distillation: false``: the
   global small model (homo) or every client's small model (hete) trains on
   KL(softmax(F(x)/T) || softmax(f(x)/T)) + lambda MSE(f_g(x) W, F_h(x)), the large
   model's first-h-block features against the small model's first-g-block features
   through a learnable bridging matrix W (Eqs. 12-14 homo, 15-17 hete);
5. the updated small models go back to their clients (the models the next round's
   step 1 starts from; the box has no line for it).

The server row's ``train/loss`` is the clients' mean CE of step 1 (the convention of
every method, docs/architecture.md); the server's own objective, the reverse KL of
step 3, is ``train/reverse_kl``.

The large model's backbone stays frozen (the paper tunes only the adapter of a
pretrained model); :class:`fedkt.train.pretrain.VisionPretrain` names the
class-disjoint labelled data that stands in for its ImageNet pretraining.  The server
never reads a label of the federated task: its proxy set is the public split's images.

Each client's small model, as the server last set it, is the held object ``"model"``
(:mod:`fedkt.methods.holdings`), version = the round that set it: a client is sent it
only when it does not hold that version.

``teacher`` is the paper's Fig. 2 control: ``clients`` (KOALA), ``shuffled`` (the soft
labels of step 2 permuted across proxy images, a fresh seeded permutation every reverse
pass, ``shuffle_every: epoch``, or one per round, ``round``: same label marginal and
confidence, no per-image knowledge), ``untrained`` (soft labels from freshly
initialised, untrained small models) or ``marginal`` (every proxy image gets the mean soft
label: the average over permutations).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedkt.data.images import DataSpec, data_spec, image_tensors
from fedkt.errors import ConfigError
from fedkt.eval import reuse
from fedkt.federated.aggregation import fedavg
from fedkt.federated.payload import Payload
from fedkt.infra.placement import client_device, pick_device, server_device
from fedkt.infra.timing import timed
from fedkt.methods.base import ClientContext, Clients, Server, derive_seed, mean_metric
from fedkt.models.vision import build_model, head_module
from fedkt.train.losses import kl_div_from_probs
from fedkt.train.pretrain import (
    check_pretrain_source,
    pretrained_model,
    server_pretrain_records,
    split_server_data,
)
from fedkt.train.vision import evaluate_vision, extract_features, predict_logits, train_vision

from .config import KoalaConfig
from .losses import (
    BridgingMatrix,
    forward_distillation_loss,
    hete_soft_labels,
    homo_soft_labels,
    koala_soft_labels,
)
from .reductions import client_reductions

MODEL = "model"  # the held object: a client's small model as the server last set it


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
        self.device = pick_device(server_device(cfg))
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
        self.versions: dict[str, int] = {}  # the round that last set each small model
        for key in keys:
            mcfg = cfg.clients.model_for(0 if key == "global" else int(key))
            small = build_model(mcfg, self.spec, derive_seed(cfg.seed, "small-init", key))
            self.small[key] = small.to(self.device)
            self.versions[key] = 0
            torch.manual_seed(derive_seed(cfg.seed, "bridge", key))
            self.bridges[key] = BridgingMatrix(
                small.feature_dim(m.small_feature_layers),
                self.large.feature_dim(m.large_feature_layers)).to(self.device)
        self.sizes = client_reductions(cfg, self.spec)

    def key(self, cid: int) -> str:
        return "global" if self.method.mode == "homo" else str(cid)

    def offer(self, cid: int) -> Payload:
        """A request referring to client ``cid``'s small model (sent if it lacks it)."""
        key = self.key(cid)
        return self.holdings.offer(Payload(), cid, MODEL, self.versions[key],
                                   self.small[key].state_dict())

    def confirm(self, asked: list[int], replied: dict[int, Payload]) -> None:
        """After a call that referred to each client's small model: who holds which version."""
        for cid in asked:
            self.holdings.confirm([cid], replied, MODEL, self.versions[self.key(cid)])

    # ------------------------------------------------------------------ round

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        """One round of Algorithm 1; the extensions are in the helpers it calls
        (:meth:`forward`, :meth:`reverse_targets`, :meth:`teacher_logits`)."""
        m = self.method
        # step 1 (Alg. 1 l. 3): clients train their small models on private data (CE) and
        # upload them with n_k (a client lacking its small model gets it first)
        asked = list(clients.ids)
        replies = clients.call("train", {cid: self.offer(cid) for cid in asked})
        self.confirm(asked, replies)
        checked = clients.validate(replies, lambda c, r: (
            r.state("model", like=self.small[self.key(c)].state_dict(), source=f"client {c}"),
            r.number("num_examples", source=f"client {c}", low=0)), "train")
        states = {c: state for c, (state, _) in checked.items()}
        counts = {c: n for c, (_, n) in checked.items()}
        # step 2: soft labels on the unlabelled proxy set
        if m.mode == "homo":  # Alg. 1 l. 4-6: omega = sum n_i omega_i / n, Eq. 2
            self.small["global"].load_state_dict(fedavg(list(states.values()),
                                                        list(counts.values())))
            updated = ["global"]
            soft = homo_soft_labels(self.teacher_logits("global"), m.temperature)  # Eq. 2
        else:  # Alg. 1 l. 7-9: refined (Eq. 8), integrated (Eq. 9), soft labels (Eq. 10)
            for c, state in states.items():
                self.small[str(c)].load_state_dict(state)
            updated = [str(c) for c in states]
            soft = hete_soft_labels([self.teacher_logits(k) for k in updated],
                                    [counts[int(k)] for k in updated],
                                    m.amplification, m.temperature)  # Eqs. 8-10
        for key in updated:
            self.versions[key] = rnd
        # step 3 (Alg. 1 l. 5, 8): reverse distillation, only the large model's adapter
        # (head) learns (Eqs. 3, 11)
        rev = self.reverse_distill(rnd, soft)
        metrics = {"train/loss": mean_metric(replies, "train/loss", checked) or 0.0,
                   "train/reverse_kl": rev["loss"]}
        # step 4 (Alg. 1 l. 5, 8): forward distillation into the small model(s)
        metrics.update(self.forward(rnd, updated, states))
        # step 5: the updated small models go back to their clients (each evaluates its own)
        back = list(clients.ids) if m.mode == "homo" else list(states)
        got = clients.call("adopt", {cid: self.offer(cid) for cid in back})
        self.confirm(back, got)
        return metrics

    def forward(self, rnd: int, updated: list[str], states: dict[int, dict[str, Tensor]]
                ) -> dict[str, float]:
        """Step 4 (Alg. 1 l. 5, 8; Eqs. 12-17): forward distillation into each updated small
        model; its mean loss.  ``forward_distillation: false`` (an ablation, not in the
        paper) skips it; in ``hete`` each client then keeps its upload, which is the
        server's copy of its model this round (no need to send it back)."""
        m = self.method
        if not m.forward_distillation:
            if m.mode == "hete":
                self.holdings.confirm(states, states, MODEL, rnd)
            return {}
        large_probs = koala_soft_labels(
            predict_logits(self.head, self.proxy_features, precision=self.precision),
            m.temperature)
        fwd = [self.forward_distill(rnd, k, large_probs) for k in updated]
        return {"train/forward_loss": sum(f["loss"] for f in fwd) / len(fwd)}

    @timed("distill")
    def reverse_distill(self, rnd: int, soft: Tensor) -> dict[str, float]:
        """Step 3 (Eqs. 3, 11): the head learns the soft labels of the proxy images (or a
        control's targets, :meth:`reverse_targets`)."""
        m = self.method
        data, target = self.reverse_targets(rnd, soft)

        def loss_fn(head: nn.Module, b: list[Tensor]) -> Tensor:
            logits = head(b[0])
            return kl_div_from_probs(target(b), logits, m.temperature)  # Eqs. 3, 11

        return train_vision(
            self.head, data, loss_fn=loss_fn, epochs=m.reverse_epochs,
            batch_size=m.distill_batch_size, lr=m.reverse_lr, weight_decay=m.weight_decay,
            betas=(0.9, 0.999), seed=self.seed(rnd, "reverse"), precision=self.precision)

    def reverse_targets(self, rnd: int, soft: Tensor
                        ) -> tuple[tuple[Tensor, Tensor], Callable[[list[Tensor]], Tensor]]:
        """Reverse distillation's data (proxy features, and what a batch carries) and the
        target of a batch: the soft labels (KOALA), or a control's.

        ``teacher: shuffled`` (Fig. 2's "random selection") pairs image i with the soft
        label of image perm[i]: the same rows, so the same marginal and confidence, and
        no per-image knowledge. The permutation is redrawn every pass over the proxy set
        (``shuffle_every: epoch``) or once per round (``round``); batches, steps and
        optimiser are those of the real teacher. ``teacher: marginal`` gives every image
        the mean soft label, the average over all permutations."""
        m = self.method
        n, batch = len(soft), m.distill_batch_size
        if m.teacher == "shuffled":
            perms = shuffle_permutations(
                n, 1 if m.shuffle_every == "round" else math.ceil(m.reverse_epochs),
                self.seed(rnd, "shuffle-teacher"), soft.device)
            per_epoch, steps = math.ceil(n / batch), itertools.count()

            def shuffled(b: list[Tensor]) -> Tensor:  # this pass's permutation of the labels
                return soft[perms[min(next(steps) // per_epoch, len(perms) - 1)][b[1]]]

            return (self.proxy_features, torch.arange(n, device=soft.device)), shuffled
        if m.teacher == "marginal":  # the average over permutations: one row for all
            soft = soft.mean(0, keepdim=True).expand_as(soft).contiguous()
        return (self.proxy_features, soft), lambda b: b[1]

    @timed("knowledge")
    @torch.no_grad()
    def teacher_logits(self, key: str) -> Tensor:
        """Proxy-set logits of the teacher: the small model, or (``teacher: untrained``)
        the same never-trained small model every round."""
        if self.method.teacher != "untrained":
            model = self.small[key]
        else:
            mcfg = self.cfg.clients.model_for(0 if key == "global" else int(key))
            model = build_model(mcfg, self.spec,
                                derive_seed(self.cfg.seed, "untrained-teacher", key))
            model = model.to(self.device)
        # A teacher whose weights did not change (the untrained one) is not run again.
        return reuse.tensors(
            self.cfg.eval.reuse, "logits", model, None,
            {"inputs": self.proxy_images, "precision": self.precision},
            lambda: {"logits": predict_logits(model, self.proxy_images,
                                              precision=self.precision)})["logits"]

    @timed("distill")
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
                                 ids=self.test_ids, precision=self.precision,
                                 reuse=self.cfg.eval.reuse)
        return {**scores, **self.sizes}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"large_head.{k}": v for k, v in self.head.state_dict().items()}
        for key, small in self.small.items():
            out.update({f"small.{key}.{k}": v for k, v in small.state_dict().items()})
            out.update({f"bridge.{key}.{k}": v for k, v in self.bridges[key].state_dict().items()})
            out[f"version.{key}"] = torch.tensor(self.versions[key], dtype=torch.int64)
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        def part(prefix: str) -> dict[str, Tensor]:
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

        self.head.load_state_dict(part("large_head."))
        for key, small in self.small.items():
            small.load_state_dict(part(f"small.{key}."))
            self.bridges[key].load_state_dict(part(f"bridge.{key}."))
            self.versions[key] = int(state[f"version.{key}"].item())


def shuffle_permutations(n: int, count: int, seed: int,
                         device: torch.device | str = "cpu") -> list[Tensor]:
    """``count`` seeded permutations of ``range(n)``: the first is the one a round drew
    before ``shuffle_every`` existed, so ``round`` reproduces those runs."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=gen).to(device) for _ in range(count)]


# --------------------------------------------------------------------------- clients


def _small_model(ctx: ClientContext, msg: Payload) -> nn.Module:
    """This client's small model, with the weights of the version the server refers to."""
    spec = data_spec(ctx.data())
    model = build_model(ctx.cfg.clients.model_for(ctx.cid), spec, ctx.seed("init"))
    model = model.to(pick_device(client_device(ctx.cfg, ctx.cid)))
    model.load_state_dict(ctx.received(msg, MODEL, like=model.state_dict()))
    return model


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Step 1 (Alg. 1 l. 3): train the small model on private labelled images (CE), upload
    it."""
    m, t = ctx.method, ctx.cfg.training
    model = _small_model(ctx, msg)
    images, labels = image_tensors(ctx.private)
    stats = train_vision(model, (images, labels), epochs=t.local_epochs,
                         batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                         betas=t.betas, seed=ctx.seed("train"), max_steps=t.max_steps,
                         max_grad_norm=t.max_grad_norm, precision=t.precision)
    state = model.state_dict()
    if m.mode == "hete" and not m.forward_distillation:
        ctx.keep(MODEL, ctx.rnd, state)  # the server keeps this upload as this round's model
    return Payload(model=state, num_examples=stats["num_examples"],
                   metrics={"train/loss": stats["loss"], "train/steps": stats["steps"]})


def client_adopt(ctx: ClientContext, msg: Payload) -> Payload:
    """Handler ``adopt``, step 5: keep the small model the server refers to, and evaluate it."""
    model = _small_model(ctx, msg)

    def scores() -> dict[str, float]:
        test = ctx.data().test
        images, labels = image_tensors(test)
        return evaluate_vision(model, images, labels, ids=[r["id"] for r in test],
                               precision=ctx.cfg.training.precision,
                               reuse=ctx.cfg.eval.reuse)

    return Payload(metrics=ctx.test_metrics(scores))
