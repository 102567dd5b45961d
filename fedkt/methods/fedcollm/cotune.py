"""FedCoLLM's server step: co-tuning the LLM and the global SLM on D_a (Eqs. 4-6).

Fan, Kang, Ma, Fan, Chen, Yang, "FedCoLLM: A Parameter-Efficient Federated Co-tuning
Framework for Large and Small Language Models", arXiv:2411.11707, Algorithm 1 lines 14-18::

    L^f = L_FT^f(omega) + lambda * L_KD^f,   L_KD^f = KL(g || f)   (LLM adapter omega)
    L^g = L_FT^g(theta) + lambda * L_KD^g,   L_KD^g = KL(f || g)   (SLM adapter theta)
    L_2 = L^f + L^g                                                 (Eq. 6)

(lambda is ``method.kd_weight``).  When f and g share a tokenizer the KL terms compare
full next-token distributions position by position (:func:`mutual_kl`); when they do not,
:class:`CrossTokenizerKL` aligns both sequences and compares mapped top-K distributions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedkt.alignment import receiving
from fedkt.alignment.bridge import TokenBridge
from fedkt.alignment.choices import choice_knowledge, distill_choices, sent
from fedkt.alignment.introspect import vocab_hash
from fedkt.alignment.receiving import kd_scale
from fedkt.data.lm_batches import IGNORE_INDEX
from fedkt.infra.precision import autocast, autocast_dtype, grad_scaler
from fedkt.infra.seeds import derive_seed
from fedkt.infra.timing import timed
from fedkt.train.lm import LM, lm_batches
from fedkt.train.logits import forward_kept, keeps_positions, kept_positions, target_mask
from fedkt.train.loop import run_steps
from fedkt.train.losses import kl_div
from fedkt.train.optim import grad_norm, make_optimizer, step, trainable

from .config import FedCoLLMConfig

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = ["CoTuneLosses", "CrossTokenizerKL", "cotune", "cotune_choices", "cotune_losses", "kd_gradient_ratios",
           "kd_mask", "mutual_kl", "same_tokenizer"]


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


def mutual_kl(
    f_logits: Tensor,
    g_logits: Tensor,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    *,
    detach_targets: bool = False,
) -> tuple[Tensor, Tensor]:
    """FedCoLLM's two KD terms: ``(KL(f || g), KL(g || f))``, the first argument the target.

    ``KL(f || g)`` teaches g (the SLM's term, Eq. 5) and ``KL(g || f)`` teaches f (the
    LLM's, Eq. 4).  With ``detach_targets`` each target is a constant, so each term's
    gradient reaches only its student (the paper's per-model update, Algorithm 1
    lines 16-17); without it both terms reach both models.
    """
    f_t, g_t = (f_logits.detach(), g_logits.detach()) if detach_targets else (f_logits, g_logits)
    return kl_div(f_t, g_logits, temperature, mask), kl_div(g_t, f_logits, temperature, mask)


class CrossTokenizerKL:
    """FedCoLLM's two KL terms between an LLM (f) and an SLM (g) with different tokenizers,
    through one :class:`~fedkt.alignment.bridge.TokenBridge` each way: each KL compares the
    teacher side's top-K distribution, mapped into the other vocabulary, with the student
    side's full distribution (:meth:`TokenBridge.kl <fedkt.alignment.bridge.TokenBridge.kl>`)."""

    def __init__(self, f_tokenizer: Any, g_tokenizer: Any, top_k: int) -> None:
        self.f2g = TokenBridge(f_tokenizer, g_tokenizer)
        self.g2f = TokenBridge(g_tokenizer, f_tokenizer)
        self.top_k = top_k

    def mutual_kl(self, f_logits: Tensor, g_logits: Tensor, f_batch: dict[str, Tensor],
                  g_batch: dict[str, Tensor], positions: str, temperature: float, *,
                  detach_targets: bool = False) -> tuple[Tensor, Tensor]:
        """``(KL(f || g), KL(g || f))`` across tokenizers, as :func:`mutual_kl`."""
        g_from_f, f_from_g = self.f2g.align_batch(f_batch, g_batch)
        f_t, g_t = ((f_logits.detach(), g_logits.detach()) if detach_targets
                    else (f_logits, g_logits))
        kl_fg = self.f2g.kl(f_t, g_logits, g_from_f, kd_mask(g_batch, positions), temperature,
                            self.top_k)
        kl_gf = self.g2f.kl(g_t, f_logits, f_from_g, kd_mask(f_batch, positions), temperature,
                            self.top_k)
        return kl_fg, kl_gf


def cotune_losses(llm: torch.nn.Module, slm: torch.nn.Module, f_batch: dict[str, Tensor],
                  g_batch: dict[str, Tensor], method: FedCoLLMConfig,
                  bridge: CrossTokenizerKL | None = None) -> CoTuneLosses:
    """Eqs. 4-6 on one D_a batch (``f_batch`` tokenized for the LLM, ``g_batch`` for the SLM)."""
    detach = method.cotune_gradients == "own"
    if bridge is None:
        if not torch.equal(f_batch["input_ids"], g_batch["input_ids"]):
            raise ValueError("fedcollm: the LLM and SLM batches differ; a shared tokenizer "
                             "must give identical token ids")
        mask = kd_mask(g_batch, method.kd_positions)
        if keeps_positions(llm) and keeps_positions(slm):
            # the output layers run only where the KL or the task loss reads them
            keep = kept_positions(mask | target_mask(g_batch["labels"]))
            (f_out, f_logits), (g_out, g_logits) = (forward_kept(llm, f_batch, keep),
                                                    forward_kept(slm, g_batch, keep))
            mask = mask[:, keep]
        else:
            f_out, g_out = llm(**f_batch), slm(**g_batch)
            f_logits, g_logits = f_out.logits, g_out.logits
        vocab = min(f_logits.shape[-1], g_logits.shape[-1])  # padded embeddings differ
        kl_fg, kl_gf = mutual_kl(f_logits[..., :vocab].float(), g_logits[..., :vocab].float(),
                                 method.temperature, mask, detach_targets=detach)
    else:
        f_out, g_out = llm(**f_batch), slm(**g_batch)
        kl_fg, kl_gf = bridge.mutual_kl(f_out.logits, g_out.logits, f_batch, g_batch,
                                        method.kd_positions, method.temperature,
                                        detach_targets=detach)
    # lambda, times T**2 with receiving.t_squared (an extension)
    lam = method.kd_weight * kd_scale(method.temperature, method.receiving.t_squared)
    ft = method.ft_weight
    return CoTuneLosses(ft_llm=f_out.loss, ft_slm=g_out.loss, kd_llm=kl_gf, kd_slm=kl_fg,
                        llm=ft * f_out.loss + lam * kl_gf,  # L^f (Eqs. 4-5)
                        slm=ft * g_out.loss + lam * kl_fg)  # L^g


@timed("distill")
def cotune(cfg: Any, llm: LM, slm: LM, records: list[dict], *, data: FederatedData,
           seed: int, bridge: CrossTokenizerKL | None = None) -> dict[str, float]:
    """Server step of Algorithm 1: co-tune omega and theta on D_a (Eqs. 4-6), in place;
    ``records`` are of ``data``, the run's data.

    Each step back-propagates ``L^f + L^g`` (Eq. 6) once: with the KD targets detached
    (``cotune_gradients: own``) omega receives exactly grad L^f and theta grad L^g.  The
    LLM's optimiser steps omega with ``llm_lr``, the SLM's steps theta with ``slm_lr``.
    """
    method: FedCoLLMConfig = cfg.method
    epochs = max(1, math.ceil(method.cotune_epochs))
    f_batches: list[dict[str, Tensor]] = []
    g_batches: list[dict[str, Tensor]] = []
    for epoch in range(epochs):  # same seed and records: both sides see the same examples
        g_batches += lm_batches(cfg, slm.tokenizer, records, seed=seed + epoch, data=data)
        if bridge is not None:
            f_batches += lm_batches(cfg, llm.tokenizer, records, seed=seed + epoch, data=data)
    if bridge is None:
        f_batches = g_batches
    total = max(1, math.ceil(method.cotune_epochs * len(g_batches) / epochs))
    total = min(method.cotune_max_steps or total, total, len(g_batches))
    if total == 0 or not g_batches:
        return {}
    f_params, g_params = trainable(llm.model), trainable(slm.model)
    opt_f, sched_f = make_optimizer(f_params, cfg.training, total, lr=method.llm_lr)
    opt_g, sched_g = make_optimizer(g_params, cfg.training, total, lr=method.slm_lr)
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
                      desc="fedcollm co-tune",
                      cast=autocast_dtype(cfg, f_dev) if f_dev.type == g_dev.type else None)
    # cotune_llm = L^f (the LLM's CE and its own KD term), cotune_kd_slm = KL(f || g), ...
    return ({f"cotune_{k}": v for k, v in stats.means().items()} | {"cotune_steps": total}
            | {f"cotune_{k}": v for k, v in ratios.items()})


@timed("distill")
def cotune_choices(cfg: Any, llm: LM, slm: LM, records: list[dict], *, data: FederatedData,
                   seed: int, rehearse: Sequence[dict] = ()) -> dict[str, float]:
    """Step 4 with ``knowledge: choices`` (an extension, for an unlabelled D_a): each model's
    posteriors over the task's choices on D_a, computed once, are the other's target:
    omega descends ``ft_weight L_FT^f + lambda KL(g || f)``, theta ``ft_weight L_FT^g +
    lambda KL(f || g)`` (L_FT: CE on the gold choice; with ``ft_weight: 0`` no label is
    read).  ``teacher: shuffled`` permutes each target across D_a's samples, ``marginal``
    makes it the other's mean posterior on every sample, ``self`` makes each model its own
    target (the controls); ``llm_kd: false`` skips the LLM's side.  The receiving options
    (``receiving``) narrow the samples each model takes, anchor each to its own posteriors
    of the round's start, scale by T**2, and let the LLM rehearse on ``rehearse``, the
    server's own records (the SLM has none on the server)."""
    m: FedCoLLMConfig = cfg.method
    p_f = choice_knowledge(cfg, llm, records, data=data, temperature=m.temperature)
    p_g = choice_knowledge(cfg, slm, records, data=data, temperature=m.temperature)
    if m.teacher == "self":
        t_f, t_g = p_f, p_g
    else:  # L_KD^f = KL(g || f): the LLM learns from the SLM, and back
        t_f = sent(p_g, m.teacher, derive_seed(seed, "g"))
        t_g = sent(p_f, m.teacher, derive_seed(seed, "f"))
    every = torch.ones(len(records), dtype=torch.bool)
    common = {"data": data, "epochs": m.cotune_epochs, "seed": seed, "kd_weight": m.kd_weight,
              "ft_weight": m.ft_weight, "temperature": m.temperature,
              "max_steps": m.cotune_max_steps}
    f: dict[str, float] = {}  # llm_kd: false: the LLM's side skipped
    if m.llm_kd:
        f = distill_choices(cfg, llm, records, t_f,
                            receiving.taken(m.receiving, t_f, p_f, every),
                            lr=m.llm_lr or cfg.training.lr, desc="fedcollm kd llm", **common,
                            **receiving.distill_options(m.receiving, m.temperature, p_f,
                                                        rehearse, client=False))
    g = distill_choices(cfg, slm, records, t_g, receiving.taken(m.receiving, t_g, p_g, every),
                        lr=m.slm_lr or cfg.training.lr, desc="fedcollm kd slm", **common,
                        **receiving.distill_options(m.receiving, m.temperature, p_g, (),
                                                    client=True))
    # how often each model's choice agreed with the other's before co-tuning
    agree = float((p_f.argmax(-1) == p_g.argmax(-1)).float().mean()) if len(records) else 0.0
    out = {"cotune_slm": g["loss"], "cotune_kd_slm": g["kd_loss"],
           "cotune_steps": f.get("steps", g["steps"]), "cotune_agreement": agree}
    if f:
        out.update(cotune_llm=f["loss"], cotune_kd_llm=f["kd_loss"])
    for side, stats in (("llm", f), ("slm", g)):  # the receiving options that ran
        out.update({f"cotune_{k}_{side}": stats[k] for k in
                    ("kd_taken", "kd_steps", "rehearsal_steps", "rehearsal_loss", "anchor_loss")
                    if k in stats and (k != "kd_taken" or m.receiving.take != "all")})
    return out


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


def same_tokenizer(f_tok: Any, g_tok: Any, cfg: Any, records: list[dict], *,
                   data: FederatedData) -> bool:
    """Whether LLM and SLM tokenize D_a (``records`` of ``data``, the run's data)
    identically (then no alignment is needed)."""
    if vocab_hash(f_tok) != vocab_hash(g_tok):
        return False
    f = lm_batches(cfg, f_tok, records, seed=None, batch_size=1, data=data)
    g = lm_batches(cfg, g_tok, records, seed=None, batch_size=1, data=data)
    return all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(f, g, strict=True))
