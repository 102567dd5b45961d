"""Generic distillation losses, as pure torch functions.

Shapes: logits are ``[B, C]`` (one prediction per sample) or ``[B, L, V]`` (one per
token); ``mask`` is ``[B, L]`` (1/True = position counts) and only applies to the
sequence form.  Every per-position loss is summed over the class axis and averaged
over the counted positions ("batchmean"); a mask that counts no position gives 0
(keeping the graph), never NaN.

KL argument order, used everywhere in this module::

    kl_div(p_logits, q_logits) = KL(P || Q) = sum_v P_v (log P_v - log Q_v)
    with P = softmax(p_logits / T) and Q = softmax(q_logits / T).

The first argument is the *target* distribution (the one the expectation is taken
under); the second is the distribution being fitted. Standard distillation of a
student towards a teacher is therefore ``kl_div(teacher_logits, student_logits)``.
Nothing is detached unless a function says so: detach a target yourself when only
one side should learn.

The methods' own losses are written in their packages, by equation number, from these
pieces: FedKD's Eqs. 1-7 (``fedkt/methods/fedkd/losses.py``), KOALA's Eqs. 2-17
(``fedkt/methods/koala/losses.py``), FedCoLLM's mutual KL (``fedkt/methods/fedcollm/
cotune.py``) and FedMKT's lambda mix (``fedkt/methods/fedmkt/distill.py``); the sparse
top-K losses across tokenizers are in :mod:`fedkt.alignment.topk`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedkt.infra.precision import upcast

__all__ = [
    "check_temperature",
    "hidden_mse",
    "kl_div",
    "kl_div_from_probs",
    "masked_mean",
    "soft_cross_entropy",
]


# ---------------------------------------------------------------------------
# Generic pieces
# ---------------------------------------------------------------------------


def check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def masked_mean(values: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of per-position ``values`` ([B] or [B, L]) over the positions ``mask`` keeps.

    With no position kept the result is ``values.sum() * 0`` (0, graph intact).
    """
    if mask is None:
        return values.mean() if values.numel() else values.sum()
    if mask.shape != values.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} does not match the per-position loss "
            f"shape {tuple(values.shape)} (expected [B, L] for [B, L, V] logits)"
        )
    weights = mask.to(values.dtype)
    count = weights.sum()
    total = (values * weights).sum()
    if count.item() == 0:
        return total * 0.0
    return total / count


def _per_position_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    # KL(P || Q) = sum_v P_v (log P_v - log Q_v); log-softmax of finite logits is
    # finite, so an underflowed P_v = 0 contributes 0 * finite = 0.
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def kl_div(
    p_logits: Tensor,
    q_logits: Tensor,
    temperature: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """``KL(softmax(p/T) || softmax(q/T))``: the first argument is the target.

    Returns the mean over samples (or over the tokens ``mask`` keeps). No ``T**2``
    factor is applied; multiply by it yourself if you want Hinton's scaling.
    """
    check_temperature(temperature)
    if p_logits.shape != q_logits.shape:
        raise ValueError(f"logit shapes differ: {tuple(p_logits.shape)} vs {tuple(q_logits.shape)}")
    log_p = F.log_softmax(upcast(p_logits) / temperature, dim=-1)  # fp32 under autocast too
    log_q = F.log_softmax(upcast(q_logits) / temperature, dim=-1)
    return masked_mean(_per_position_kl(log_p, log_q), mask)


def kl_div_from_probs(
    target_probs: Tensor,
    q_logits: Tensor,
    temperature: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """``KL(target || softmax(q/T))`` for a target given as probabilities (soft labels)."""
    check_temperature(temperature)
    if target_probs.shape != q_logits.shape:
        raise ValueError(
            f"target shape {tuple(target_probs.shape)} differs from logits {tuple(q_logits.shape)}"
        )
    log_q = F.log_softmax(upcast(q_logits) / temperature, dim=-1)
    target_probs = upcast(target_probs)
    # 0 * log(0) := 0: clamping keeps the log finite where the target is exactly 0.
    log_target = target_probs.clamp_min(torch.finfo(target_probs.dtype).tiny).log()
    per_pos = (target_probs * (log_target - log_q)).sum(dim=-1)
    return masked_mean(per_pos, mask)


def soft_cross_entropy(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """``-sum_v softmax(teacher/T)_v log softmax(student/T)_v``, averaged over positions.

    Equals ``kl_div(teacher, student) + H(teacher)``; the teacher is not detached.
    """
    check_temperature(temperature)
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"logit shapes differ: {tuple(student_logits.shape)} vs {tuple(teacher_logits.shape)}"
        )
    target = F.softmax(upcast(teacher_logits) / temperature, dim=-1)
    log_q = F.log_softmax(upcast(student_logits) / temperature, dim=-1)
    return masked_mean(-(target * log_q).sum(dim=-1), mask)


def hidden_mse(a: Tensor, b: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean squared error between hidden states.

    Without a mask: the mean over every element. With ``mask`` [B, L] and states
    [B, L, D]: the mean over the kept positions and the D features.
    """
    if a.shape != b.shape:
        raise ValueError(f"hidden shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    sq = (upcast(a) - upcast(b)).pow(2)
    if mask is None:
        return sq.mean()
    if a.dim() < 3 or tuple(mask.shape) != tuple(a.shape[:2]):
        raise ValueError(
            f"mask {tuple(mask.shape)} must be [B, L] for hidden states [B, L, D], "
            f"got states {tuple(a.shape)}"
        )
    return masked_mean(sq.flatten(2).mean(dim=-1), mask)
