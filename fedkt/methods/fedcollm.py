"""FedCoLLM: federated co-tuning of a server LLM and the clients' SLM (Fan et al., 2024).

Fan, Kang, Ma, Fan, Chen, Yang, "FedCoLLM: A Parameter-Efficient Federated Co-tuning
Framework for Large and Small Language Models", arXiv:2411.11707, Algorithm 1.

Clients share one small model g (the SLM) with a LoRA adapter theta; the server holds a
large model f (the LLM) with its own LoRA adapter omega and the auxiliary set D_a (the
``public`` split).  Every round:

1. the server sends the global adapter theta to the clients;
2. client k trains theta_k on its private data with the task loss (Eq. 3);
3. the server averages theta = (1/K) sum_k theta_k (Algorithm 1 line 13; ``weighted:
   true`` weights by example counts instead; with ``secure_aggregation.enabled`` it only
   learns the sum, by SecAgg+);
4. on D_a the LLM and the global SLM co-tune by mutual distillation (Eqs. 4-6)::

       L^f = L_FT^f(omega) + lambda * L_KD^f,   L_KD^f = KL(g || f)   (LLM adapter omega)
       L^g = L_FT^g(theta) + lambda * L_KD^g,   L_KD^g = KL(f || g)   (SLM adapter theta)
       L_2 = L^f + L^g                                                 (Eq. 6)

   Each adapter descends its own loss (Algorithm 1 lines 16-17): omega by grad L^f and
   theta by grad L^g, with the other model's output a fixed (detached) target in each KD
   term, KL(target || student) as in FATE-LLM.  ``cotune_gradients: joint`` instead
   back-propagates L^f + L^g with nothing detached, so each adapter also learns from the
   other's KD term (a symmetric KL at about twice the weight).  Two AdamW optimisers step
   omega and theta, each with its own learning rate (``lr_llm``, ``lr_slm``);
5. the distilled theta goes back to the clients in the next round.

When f and g share a tokenizer (the paper's setting) the KL terms compare full
next-token distributions position by position.  When they do not, both sequences
are aligned with :mod:`fedkt.alignment` (FedMKT's token alignment) and each KL
compares the teacher side's top-K distribution, mapped into the other vocabulary
by MinED, with the student side's full distribution (:class:`TokenBridge`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedkt.data.lm_batches import IGNORE_INDEX
from fedkt.eval import predictions
from fedkt.losses import mutual_kl
from fedkt.methods import register
from fedkt.methods.base import Method, Server
from fedkt.methods.fedavg import (
    AdapterAveragingConfig,
    average_client_adapters,
    client_train,
)
from fedkt.precision import autocast, grad_scaler
from fedkt.privacy import update_norm
from fedkt.train.lm import LM, client_evaluate, client_lm, evaluate_lm, lm_batches, server_lm
from fedkt.train.loop import run_steps
from fedkt.train.optim import grad_norm, make_optimizer, step


class FedCoLLMConfig(AdapterAveragingConfig):
    """FedCoLLM hyper-parameters.

    The paper fixes the update rule (Eq. 6, Algorithm 1) and the 1/K mean (line 13) but
    gives no lambda, temperature or R: those defaults are fedkt's (docs/methods/fedcollm.md,
    "Differences from the paper").  Local client training uses ``training.*`` as in FedAvg.
    """

    name: Literal["fedcollm"] = "fedcollm"
    # Step 3: the paper's plain 1/K mean (true: weight each adapter by its example count).
    weighted: bool = False
    # lambda of Eq. 6's L^f and L^g: weight of each KD term against the fine-tuning loss.
    # The KL is a mean over the KD positions (FATE-LLM sums it over tokens instead).
    kd_lambda: float = Field(1.0, ge=0)
    # Softmax temperature of both KL terms (no T**2 factor).
    temperature: float = Field(1.0, gt=0)
    # "own": each adapter descends its own loss, the other model's output a detached target
    # (the paper); "joint": one backward of L^f + L^g with nothing detached.
    cotune_gradients: Literal["own", "joint"] = "own"
    # Co-tuning on D_a per round: epochs over the public split, optionally capped at
    # ``cotune_max_steps`` optimiser steps (R).
    cotune_epochs: float = Field(1.0, gt=0)
    cotune_max_steps: int | None = Field(None, ge=1)
    # Learning rates of the LLM adapter omega and of the global SLM adapter theta on the
    # server (None: ``training.lr``).
    lr_llm: float | None = Field(None, gt=0)
    lr_slm: float | None = Field(None, gt=0)
    # Positions the KL terms average over: the response tokens only ("target", like the
    # task loss) or every non-padding position ("all").
    kd_positions: Literal["target", "all"] = "target"
    # Different tokenizers only: logits kept per position for the aligned KL.
    top_k: int = Field(128, ge=1)


# --------------------------------------------------------------------------- losses


@dataclass
class CoTuneLosses:
    """One co-tuning batch: the parts of Eqs. 4-6 (all scalars in the graph)."""

    ft_llm: Tensor  # L_FT^f
    ft_slm: Tensor  # L_FT^g
    kd_llm: Tensor  # L_KD^f = KL(g || f): the LLM learns from the SLM
    kd_slm: Tensor  # L_KD^g = KL(f || g): the SLM learns from the LLM
    llm: Tensor  # L^f = L_FT^f + lambda * L_KD^f
    slm: Tensor  # L^g = L_FT^g + lambda * L_KD^g

    @property
    def total(self) -> Tensor:
        """Eq. 6: ``L^f + L^g``; omega appears only in L^f and theta only in L^g unless
        ``cotune_gradients: joint`` leaves the KD targets in the graph."""
        return self.llm + self.slm


def kd_mask(batch: dict[str, Tensor], positions: str) -> Tensor:
    """[B, L] bool: logits at t count when token t + 1 is a target (or any real token)."""
    nxt = batch["labels"] != IGNORE_INDEX if positions == "target" else batch["attention_mask"] > 0
    mask = torch.zeros_like(nxt, dtype=torch.bool)
    mask[:, :-1] = nxt[:, 1:]
    return mask


class TokenBridge:
    """KL between two models with different tokenizers, through :mod:`fedkt.alignment`.

    Positions are linked by :func:`~fedkt.alignment.align_sequences` (logits that
    predict the same text), vocabularies by the MinED :func:`~fedkt.alignment.vocab_mapping`.
    ``KL(t || s)`` takes the teacher side t's top-K logits at the aligned position
    (kept in the graph), maps their ids into s's vocabulary (ids that land on the same
    s token are merged, their probabilities summed) and compares that distribution
    with s's full softmax: the cross-entropy is :func:`~fedkt.alignment.sparse_kd_loss`,
    minus the entropy of the merged top-K distribution.
    """

    def __init__(self, f_tokenizer: Any, g_tokenizer: Any, top_k: int) -> None:
        from fedkt.alignment import vocab_mapping

        self.f_tok, self.g_tok = f_tokenizer, g_tokenizer
        self.f2g = torch.from_numpy(vocab_mapping(f_tokenizer, g_tokenizer))
        self.g2f = torch.from_numpy(vocab_mapping(g_tokenizer, f_tokenizer))
        self.top_k = top_k

    def position_maps(self, f_batch: dict[str, Tensor], g_batch: dict[str, Tensor]
                      ) -> tuple[Tensor, Tensor]:
        """``g_from_f`` [B, Lg] and ``f_from_g`` [B, Lf]: the other side's logit position, -1: none."""
        from fedkt.alignment import align_sequences

        f_ids, g_ids = f_batch["input_ids"].cpu(), g_batch["input_ids"].cpu()
        f_len = f_batch["attention_mask"].sum(1).tolist()
        g_len = g_batch["attention_mask"].sum(1).tolist()
        g_from_f = torch.full(g_ids.shape, -1, dtype=torch.long)
        f_from_g = torch.full(f_ids.shape, -1, dtype=torch.long)
        for b, (nf, ng) in enumerate(zip(f_len, g_len, strict=True)):
            a = align_sequences(f_ids[b, :nf], g_ids[b, :ng], self.f_tok, self.g_tok)
            g_from_f[b, :ng] = torch.from_numpy(a.logit_map.astype("int64"))
            f_from_g[b, :nf] = torch.from_numpy(a.logit_map_reverse.astype("int64"))
        return g_from_f, f_from_g

    def kl(self, t_logits: Tensor, s_logits: Tensor, pos: Tensor, vocab_map: Tensor,
           s_mask: Tensor, temperature: float) -> Tensor:
        """``KL(top-K of t, mapped || s)`` averaged over s's positions in ``s_mask``
        (detach ``t_logits`` for a fixed target)."""
        from fedkt.alignment import sparse_kd_loss

        if int(vocab_map.max()) >= s_logits.shape[-1]:
            raise ValueError(f"fedcollm: the vocabulary mapping reaches id {int(vocab_map.max())}"
                             f" but the model has {s_logits.shape[-1]} logits")
        t_logits = t_logits[..., : len(vocab_map)].float()
        k = min(self.top_k, t_logits.shape[-1])
        values, ids = torch.topk(t_logits, k, dim=-1)  # [B, Lt, K], values keep the graph
        pos = pos.to(t_logits.device)
        valid = s_mask & (pos >= 0)
        index = pos.clamp_min(0)[..., None].expand(-1, -1, k)
        tgt_values = values.gather(1, index)  # [B, Ls, K]
        tgt_ids = vocab_map.to(t_logits.device)[ids.gather(1, index)]
        dropped = tgt_ids < 0  # a special token without a counterpart: no weight
        if bool(dropped.any()):
            from fedkt.alignment import PAD_VALUE

            tgt_values = tgt_values.masked_fill(dropped, PAD_VALUE)
            tgt_ids = tgt_ids.clamp_min(0)
        ce = sparse_kd_loss(s_logits, tgt_ids, tgt_values, valid, temperature)
        p = torch.softmax(tgt_values / temperature, dim=-1)
        # Mass of the s-token each slot maps to: the merged top-K probability, through
        # a K x K comparison or a vocabulary-sized buffer, whichever is smaller.
        if k * k <= s_logits.shape[-1]:
            merged = ((tgt_ids[..., :, None] == tgt_ids[..., None, :]) * p[..., None, :]).sum(-1)
        else:
            dense = torch.zeros(s_logits.shape, dtype=p.dtype, device=p.device)
            merged = dense.scatter_add(-1, tgt_ids, p).gather(-1, tgt_ids)
        neg_entropy = (p * merged.clamp_min(torch.finfo(p.dtype).tiny).log()).sum(-1)
        m = valid.to(neg_entropy.dtype)
        return ce + (neg_entropy * m).sum() / m.sum().clamp_min(1.0)

    def mutual_kl(self, f_logits: Tensor, g_logits: Tensor, f_batch: dict[str, Tensor],
                  g_batch: dict[str, Tensor], positions: str, temperature: float, *,
                  detach_targets: bool = False) -> tuple[Tensor, Tensor]:
        """``(KL(f || g), KL(g || f))`` across tokenizers, as :func:`fedkt.losses.mutual_kl`."""
        g_from_f, f_from_g = self.position_maps(f_batch, g_batch)
        f_t, g_t = ((f_logits.detach(), g_logits.detach()) if detach_targets
                    else (f_logits, g_logits))
        kl_fg = self.kl(f_t, g_logits, g_from_f, self.f2g, kd_mask(g_batch, positions),
                        temperature)
        kl_gf = self.kl(g_t, f_logits, f_from_g, self.g2f, kd_mask(f_batch, positions),
                        temperature)
        return kl_fg, kl_gf


def cotune_losses(llm: torch.nn.Module, slm: torch.nn.Module, f_batch: dict[str, Tensor],
                  g_batch: dict[str, Tensor], method: FedCoLLMConfig,
                  bridge: TokenBridge | None = None) -> CoTuneLosses:
    """Eqs. 4-6 on one D_a batch (``f_batch`` tokenized for the LLM, ``g_batch`` for the SLM)."""
    f_out, g_out = llm(**f_batch), slm(**g_batch)
    detach = method.cotune_gradients == "own"
    if bridge is None:
        if not torch.equal(f_batch["input_ids"], g_batch["input_ids"]):
            raise ValueError("fedcollm: the LLM and SLM batches differ; a shared tokenizer "
                             "must give identical token ids")
        vocab = min(f_out.logits.shape[-1], g_out.logits.shape[-1])  # padded embeddings differ
        kl_fg, kl_gf = mutual_kl(f_out.logits[..., :vocab].float(),
                                 g_out.logits[..., :vocab].float(), method.temperature,
                                 kd_mask(g_batch, method.kd_positions), detach_targets=detach)
    else:
        kl_fg, kl_gf = bridge.mutual_kl(f_out.logits, g_out.logits, f_batch, g_batch,
                                        method.kd_positions, method.temperature,
                                        detach_targets=detach)
    lam = method.kd_lambda
    return CoTuneLosses(ft_llm=f_out.loss, ft_slm=g_out.loss, kd_llm=kl_gf, kd_slm=kl_fg,
                        llm=f_out.loss + lam * kl_gf,  # L^f (Eqs. 4-5)
                        slm=g_out.loss + lam * kl_fg)  # L^g


def cotune(cfg: Any, llm: LM, slm: LM, records: list[dict], *, seed: int,
           bridge: TokenBridge | None = None) -> dict[str, float]:
    """Server step of Algorithm 1: co-tune omega and theta on D_a (Eqs. 4-6), in place.

    Each step back-propagates ``L^f + L^g`` (Eq. 6) once: with the KD targets detached
    (``cotune_gradients: own``) omega receives exactly grad L^f and theta grad L^g.  The
    LLM's optimiser steps omega with ``lr_llm``, the SLM's steps theta with ``lr_slm``.
    """
    method: FedCoLLMConfig = cfg.method
    epochs = max(1, math.ceil(method.cotune_epochs))
    f_batches: list[dict[str, Tensor]] = []
    g_batches: list[dict[str, Tensor]] = []
    for epoch in range(epochs):  # same seed and records: both sides see the same examples
        g_batches += lm_batches(cfg, slm.tokenizer, records, seed=seed + epoch)
        if bridge is not None:
            f_batches += lm_batches(cfg, llm.tokenizer, records, seed=seed + epoch)
    if bridge is None:
        f_batches = g_batches
    total = max(1, math.ceil(method.cotune_epochs * len(g_batches) / epochs))
    total = min(method.cotune_max_steps or total, total, len(g_batches))
    if total == 0 or not g_batches:
        return {}
    f_params = [p for p in llm.model.parameters() if p.requires_grad]
    g_params = [p for p in slm.model.parameters() if p.requires_grad]
    opt_f, sched_f = make_optimizer(f_params, cfg.training, total, lr=method.lr_llm)
    opt_g, sched_g = make_optimizer(g_params, cfg.training, total, lr=method.lr_slm)
    f_dev = next(llm.model.parameters()).device
    g_dev = next(slm.model.parameters()).device
    scaler = grad_scaler(cfg, f_dev)
    ratios: dict[str, float] = {}

    def batch_loss(i: int, batches: tuple[dict[str, Tensor], dict[str, Tensor]]
                   ) -> tuple[Tensor, dict[str, Tensor]]:
        f_batch = {k: v.to(f_dev) for k, v in batches[0].items()}
        g_batch = {k: v.to(g_dev) for k, v in batches[1].items()}
        with autocast(cfg, f_dev):  # the KL terms cast logits to fp32
            parts = cotune_losses(llm.model, slm.model, f_batch, g_batch, method, bridge)
        if i == 0:  # diagnostics on the round's first batch (no effect on training)
            ratios.update(kd_gradient_ratios(parts, f_params, g_params))
        return parts.total, {name: getattr(parts, name) for name in  # Eq. 6: L^f + L^g
                             ("llm", "slm", "ft_llm", "ft_slm", "kd_llm", "kd_slm")}

    # One backward of L^f + L^g; each optimiser steps its own adapter at its own rate.
    stats = run_steps(zip(f_batches[:total], g_batches[:total], strict=True), batch_loss,
                      lambda loss: step(loss, [opt_f, opt_g], clip=[f_params, g_params],
                                        max_grad_norm=cfg.training.max_grad_norm,
                                        scaler=scaler, schedules=[sched_f, sched_g]),
                      modules=[llm.model, slm.model], seed=seed, total=total,
                      desc="fedcollm co-tune")
    # cotune_llm = L^f (the LLM's CE and its own KD term), cotune_kd_slm = KL(f || g), ...
    return ({f"cotune_{k}": v for k, v in stats.means().items()} | {"cotune_steps": total}
            | {f"cotune_{k}": v for k, v in ratios.items()})


def kd_gradient_ratios(parts: CoTuneLosses, f_params: list[Tensor], g_params: list[Tensor]
                       ) -> dict[str, float]:
    """How much of each adapter's co-tuning gradient the distillation contributes.

    ``kd_grad_ratio_llm = ||grad_omega (L_2 - L_FT^f)|| / ||grad_omega L_FT^f||``: the norm of
    everything but the LLM's own task loss (its KD term; with ``joint`` gradients also the
    SLM's) against the task loss's; ``kd_grad_ratio_slm`` likewise for theta.  Computed on
    the retained graph, so the update that follows is unchanged.
    """
    out = {}
    for name, ft, params in (("llm", parts.ft_llm, f_params), ("slm", parts.ft_slm, g_params)):
        kd = grad_norm(parts.total - ft, params)  # 0 with lambda = 0: nothing else reaches them
        out[f"kd_grad_ratio_{name}"] = kd / max(grad_norm(ft, params), 1e-30)
    return out


def same_tokenizer(f_tok: Any, g_tok: Any, cfg: Any, records: list[dict]) -> bool:
    """Whether LLM and SLM tokenize D_a identically (then no alignment is needed)."""
    from fedkt.alignment import vocab_hash

    if vocab_hash(f_tok) != vocab_hash(g_tok):
        return False
    f = lm_batches(cfg, f_tok, records, seed=None, batch_size=1)
    g = lm_batches(cfg, g_tok, records, seed=None, batch_size=1)
    return all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(f, g, strict=True))


# --------------------------------------------------------------------------- server


class FedCoLLMServer(Server[FedCoLLMConfig]):
    """Algorithm 1: FedAvg of the SLM adapter, then LLM <-> SLM co-tuning on D_a."""

    def setup(self) -> None:
        cfg = self.cfg
        models = {m.model_dump_json() for m in cfg.clients.models}
        if len(models) != 1:
            raise ValueError("clients.models: fedcollm needs one SLM shared by all clients")
        if cfg.server is None:
            raise ValueError("server: fedcollm needs a server LLM (server: {name: ...})")
        if cfg.server.model_dump_json() in models:
            raise ValueError("server: fedcollm co-tunes a server LLM with the clients' SLM; "
                             "give the server a different (larger) model than clients.models")
        public = self.data().public
        if not public:
            raise ValueError("data.split: fedcollm co-tunes on the auxiliary set D_a, the public "
                             "split, which is empty; set data.split.public_fraction > 0 (or "
                             "scheme: fedmkt)")
        self.llm = server_lm(cfg)
        self.slm = client_lm(cfg, 0)
        self.omega = self.llm.trainable()
        self.theta = self.slm.trainable()
        shared = same_tokenizer(self.llm.tokenizer, self.slm.tokenizer, cfg, public)
        self.bridge = None if shared else TokenBridge(self.llm.tokenizer, self.slm.tokenizer,
                                                       self.method.top_k)

    def round(self, rnd: int, clients) -> dict[str, float]:
        sent = self.theta
        # 1-3. broadcast theta; clients train theta_k (Eq. 3); (secure) FedAvg into theta
        self.theta, metrics = average_client_adapters(self, clients, self.theta)
        averaged = self.theta
        # 4. co-tune LLM (omega) and global SLM (theta) on D_a (Eqs. 4-6)
        stats = cotune(self.cfg, self.llm.reset(self.omega), self.slm.reset(self.theta),
                       self.data().public, seed=self.seed(rnd, "cotune"), bridge=self.bridge)
        self.omega, self.theta = self.llm.trainable(), self.slm.trainable()
        # How far co-tuning moved theta, against how far the clients' round moved it.
        stats["theta_shift_local"] = update_norm({k: averaged[k] - sent[k] for k in sent})
        stats["theta_shift_cotune"] = update_norm({k: self.theta[k] - averaged[k]
                                                   for k in averaged})
        # 5. theta goes back to the clients at the start of the next round
        return {**metrics, **{f"train/{k}": v for k, v in stats.items()}}

    def evaluate(self, rnd: int) -> dict[str, dict[str, float]]:
        """Two participants: ``server`` is the LLM (omega), ``global_slm`` the co-tuned
        global SLM (theta), which the clients receive next round."""
        test = self.data().test
        llm = evaluate_lm(self.cfg, self.llm.reset(self.omega), test)
        with predictions.scope("global_slm"):  # its own per-example table
            slm = evaluate_lm(self.cfg, self.slm.reset(self.theta), test)
        return {"server": llm, "global_slm": slm}

    def server_model(self) -> LM:
        """The LLM (omega); the global SLM is what every client holds."""
        return self.llm.reset(self.omega)

    def state_dict(self) -> dict[str, Tensor]:
        return {**{f"llm.{k}": v for k, v in self.omega.items()},
                **{f"slm.{k}": v for k, v in self.theta.items()}}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.omega = {k[4:]: v for k, v in state.items() if k.startswith("llm.")}
        self.theta = {k[4:]: v for k, v in state.items() if k.startswith("slm.")}


METHOD = register(Method(
    name="fedcollm", config=FedCoLLMConfig, server=FedCoLLMServer,
    handlers={"train": client_train, "evaluate": client_evaluate}, aggregates=True,
    server_sees="SLM adapter", clients_see="global SLM adapter",
    summary="FedAvg of SLM LoRA adapters + server LLM/SLM mutual distillation on public data",
    paper="Fan et al., FedCoLLM: A Parameter-Efficient Federated Co-tuning Framework for "
          "Large and Small Language Models, arXiv:2411.11707",
))
