"""Distillation losses of the methods in fedkt, as pure torch functions.

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

Papers and the equations implemented here:

* FedKD: Wu et al., "Communication-efficient federated learning via knowledge
  distillation", Nature Communications 13, 2032 (2022), Eqs. 1-7.
* KOALA: Chen et al., "Federated Knowledge Transfer Fine-tuning Large Server Model
  with Resource-Constrained IoT Clients" (arXiv:2407.05268), Eqs. 2-3, 8-11, 13-14.
* FedCoLLM: Fan et al., mutual KL between the server LLM and the client SLM, Eqs. 4-6.
* FedMKT: Fan et al., the lambda mix of fine-tuning and distillation losses, Eqs. 9-10.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedkt.precision import upcast

__all__ = [
    "BridgingMatrix",
    "FedKDLosses",
    "fedkd_adaptive_kd",
    "fedkd_hidden_loss",
    "fedkd_objectives",
    "fedkd_task_loss",
    "hidden_mse",
    "kl_div",
    "kl_div_from_probs",
    "koala_feature_loss",
    "koala_integrate_logits",
    "koala_kd_loss",
    "koala_refine_logits",
    "koala_soft_labels",
    "lambda_mix",
    "masked_mean",
    "mutual_kl",
    "soft_cross_entropy",
]


# ---------------------------------------------------------------------------
# Generic pieces
# ---------------------------------------------------------------------------


def _check_temperature(temperature: float) -> None:
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
    _check_temperature(temperature)
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
    _check_temperature(temperature)
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
    _check_temperature(temperature)
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


# ---------------------------------------------------------------------------
# FedKD (Wu et al. 2022)
# ---------------------------------------------------------------------------


def fedkd_task_loss(
    logits: Tensor, labels: Tensor, mask: Tensor | None = None, ignore_index: int = -100
) -> Tensor:
    """Task loss ``CE(y, y_hat)`` of FedKD Eqs. 1-2 (same function for mentor and mentee).

    ``logits`` [B, C] with ``labels`` [B], or [B, L, V] with [B, L]; positions whose
    label is ``ignore_index`` or whose mask is 0 do not count.
    """
    if logits.dim() == labels.dim() + 1 and logits.shape[:-1] == labels.shape:
        per_pos = F.cross_entropy(
            upcast(logits).reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=ignore_index,
            reduction="none",
        ).reshape(labels.shape)
    else:
        raise ValueError(f"labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")
    keep = labels != ignore_index
    if mask is not None:
        keep = keep & mask.bool()
    return masked_mean(per_pos, keep)


def _denominator(
    teacher_task_loss: Tensor | float, student_task_loss: Tensor | float, detach: bool
) -> Tensor:
    denom = torch.as_tensor(teacher_task_loss) + torch.as_tensor(student_task_loss)
    if detach:
        denom = denom.detach()
    if denom.numel() != 1:
        raise ValueError("task losses must be scalars")
    if not torch.isfinite(denom) or denom.item() <= 0:
        raise ValueError(
            f"L_t^t + L_s^t must be finite and > 0 to weight the FedKD losses, got {denom.item()}"
        )
    return denom


def fedkd_adaptive_kd(
    teacher_logits: Tensor,
    student_logits: Tensor,
    teacher_task_loss: Tensor | float,
    student_task_loss: Tensor | float,
    *,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    detach_denominator: bool = True,
    detach_targets: bool = True,
) -> tuple[Tensor, Tensor]:
    """FedKD adaptive mutual distillation losses, Eqs. 3-4. Returns ``(L_t^d, L_s^d)``.

    Eq. 3 (mentor/teacher): ``L_t^d = KL(y_s, y_t) / (L_t^t + L_s^t)``
    Eq. 4 (mentee/student): ``L_s^d = KL(y_t, y_s) / (L_t^t + L_s^t)``

    The paper defines ``KL(a, b) = sum_i a_i log(a_i / b_i)``, i.e. ``KL(a || b)``
    with the *other* model's prediction as the target, so Eq. 3 is
    ``kl_div(student, teacher)`` and Eq. 4 is ``kl_div(teacher, student)``.

    ``detach_targets``: the paper takes the mentor's gradient from ``L_t`` w.r.t.
    the mentor's parameters and the mentee's from ``L_s`` w.r.t. the mentee's, so
    the target of each KL is a constant for the model it trains; detaching it gives
    exactly those gradients even when ``L_t + L_s`` is back-propagated once.
    (The official code, wuch15/FedKD ``model_bert.py``, detaches nothing.)

    ``detach_denominator``: the paper calls ``1/(L_t^t + L_s^t)`` an "adaptive loss
    weighting" controlled by prediction correctness, so by default it is a weight
    (detached). The official code keeps it in the graph, which adds a gradient that
    pushes the task losses *up*; pass ``False`` to reproduce that.
    """
    denom = _denominator(teacher_task_loss, student_task_loss, detach_denominator)
    s_target = student_logits.detach() if detach_targets else student_logits
    t_target = teacher_logits.detach() if detach_targets else teacher_logits
    l_t_d = kl_div(s_target, teacher_logits, temperature, mask) / denom  # Eq. 3
    l_s_d = kl_div(t_target, student_logits, temperature, mask) / denom  # Eq. 4
    return l_t_d, l_s_d


def _as_list(x: Tensor | Sequence[Tensor] | None) -> list[Tensor]:
    if x is None:
        return []
    if isinstance(x, Tensor):
        return [x]
    return list(x)


def _project(h: Tensor, w: Tensor | nn.Module | None) -> Tensor:
    if w is None:
        return h
    if isinstance(w, nn.Module):
        return w(h)
    if w.dim() != 2 or w.shape[0] != h.shape[-1]:
        raise ValueError(
            f"W_h has shape {tuple(w.shape)}; expected (student dim {h.shape[-1]}, teacher dim)"
        )
    return h @ w


def fedkd_hidden_loss(
    teacher_hiddens: Tensor | Sequence[Tensor],
    student_hiddens: Tensor | Sequence[Tensor],
    teacher_attn: Tensor | Sequence[Tensor] | None,
    student_attn: Tensor | Sequence[Tensor] | None,
    W_h: Tensor | nn.Module | Sequence[Tensor | nn.Module] | None,
    task_losses_sum: Tensor | float,
    *,
    mask: Tensor | None = None,
    detach_denominator: bool = True,
) -> Tensor:
    """FedKD adaptive hidden loss, Eq. 5 (``L_t^h = L_s^h``).

    ``(MSE(H_t, H_s W_h) + MSE(A_t, A_s)) / (L_t^t + L_s^t)``.

    The paper writes ``W_h H^s`` (column vectors); with row-major ``[.., d_s]``
    states this is ``H_s @ W_h`` with ``W_h`` of shape ``(d_s, d_t)``, or any module
    mapping ``d_s -> d_t`` (e.g. ``nn.Linear``). ``None`` means identity. Several
    layer pairs may be given as sequences (one ``W_h`` each, or one shared); their
    MSEs are summed, as the official code does. Attention maps are optional ("if
    available", per the paper); with ``mask`` [B, L] an attention map
    [B, heads, L, L] only counts entries whose query and key are both kept.
    """
    hs_t, hs_s = _as_list(teacher_hiddens), _as_list(student_hiddens)
    if len(hs_t) != len(hs_s):
        raise ValueError(f"{len(hs_t)} teacher hidden states vs {len(hs_s)} student ones")
    if W_h is None or isinstance(W_h, (Tensor, nn.Module)):
        ws: list[Tensor | nn.Module | None] = [W_h] * len(hs_t)
    else:
        ws = list(W_h)
        if len(ws) != len(hs_t):
            raise ValueError(f"{len(ws)} W_h matrices for {len(hs_t)} hidden-state pairs")
    at_t, at_s = _as_list(teacher_attn), _as_list(student_attn)
    if len(at_t) != len(at_s):
        raise ValueError(f"{len(at_t)} teacher attention maps vs {len(at_s)} student ones")
    denom = _denominator(task_losses_sum, 0.0, detach_denominator)
    total: Tensor | None = None
    for h_t, h_s, w in zip(hs_t, hs_s, ws, strict=True):
        term = hidden_mse(h_t, _project(h_s, w), mask if h_t.dim() >= 3 else None)
        total = term if total is None else total + term
    for a_t, a_s in zip(at_t, at_s, strict=True):
        a_t, a_s = upcast(a_t), upcast(a_s)
        if mask is not None and a_t.dim() == 4:
            m = mask.to(a_t.dtype)
            pair = m[:, None, :, None] * m[:, None, None, :]
            sq = (a_t - a_s).pow(2) * pair
            count = pair.expand_as(sq).sum()
            term = sq.sum() / count if count.item() > 0 else sq.sum() * 0.0
        else:
            term = hidden_mse(a_t, a_s)
        total = term if total is None else total + term
    if total is None:
        raise ValueError("fedkd_hidden_loss needs at least one hidden-state pair")
    return total / denom  # Eq. 5


@dataclass
class FedKDLosses:
    """Eqs. 6-7 totals and their parts.

    ``teacher`` (Eq. 6) = ``L_t^d + L_t^h + L_t^t``; ``student`` (Eq. 7) =
    ``L_s^d + L_s^h + L_s^t``. ``joint`` is one scalar whose single backward gives
    each model the gradient of its own total: the hidden term counted once because
    ``L_t^h = L_s^h`` is one expression both models read. It is exact when the KL
    targets and the denominators are detached (the defaults of this module).
    """

    teacher: Tensor
    student: Tensor
    joint: Tensor
    teacher_task: Tensor
    student_task: Tensor
    teacher_kd: Tensor
    student_kd: Tensor
    hidden: Tensor


def fedkd_objectives(
    teacher_task: Tensor,
    student_task: Tensor,
    teacher_kd: Tensor,
    student_kd: Tensor,
    hidden: Tensor | float = 0.0,
) -> FedKDLosses:
    """Assemble FedKD Eqs. 6-7 from the task (Eqs. 1-2), KD (3-4) and hidden (5) terms."""
    hidden_t = torch.as_tensor(hidden, dtype=teacher_task.dtype, device=teacher_task.device)
    teacher = teacher_kd + hidden_t + teacher_task  # Eq. 6
    student = student_kd + hidden_t + student_task  # Eq. 7
    joint = teacher_task + student_task + teacher_kd + student_kd + hidden_t
    return FedKDLosses(
        teacher=teacher,
        student=student,
        joint=joint,
        teacher_task=teacher_task,
        student_task=student_task,
        teacher_kd=teacher_kd,
        student_kd=student_kd,
        hidden=hidden_t,
    )


# ---------------------------------------------------------------------------
# KOALA (Chen et al. 2024)
# ---------------------------------------------------------------------------


def koala_refine_logits(logits: Tensor, amplification: float = 1.0) -> Tensor:
    """KOALA Eq. 8: ``z_hat = A (z - z_min) / (z_bar - z_min)`` per sample.

    ``z_min`` and ``z_bar`` are the minimum and the mean over the class (last) axis,
    so each refined row has minimum 0 and mean ``A``: logits of models with
    different scales become comparable before Eq. 9 mixes them.

    Degenerate rows (all logits equal within floating-point tolerance, so
    ``z_bar == z_min``) carry no preference; they are returned as all zeros, which
    is the uniform distribution after Eq. 10's softmax, instead of dividing by 0.
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits need a class axis, got shape {tuple(logits.shape)}")
    z = logits if logits.is_floating_point() else logits.float()
    z_min = z.amin(dim=-1, keepdim=True)
    z_max = z.amax(dim=-1, keepdim=True)
    z_bar = z.mean(dim=-1, keepdim=True)
    scale = z.detach().abs().amax(dim=-1, keepdim=True).clamp_min(1.0)
    tol = 8 * torch.finfo(z.dtype).eps * scale
    degenerate = (z_max - z_min) <= tol
    # When a row is not degenerate, z_bar - z_min >= (z_max - z_min) / C > 0.
    denom = torch.where(degenerate, torch.ones_like(z_bar), z_bar - z_min)
    refined = amplification * (z - z_min) / denom
    return torch.where(degenerate, torch.zeros_like(refined), refined)


def koala_integrate_logits(
    refined_logits: Sequence[Tensor], sample_counts: Sequence[float]
) -> Tensor:
    """KOALA Eq. 9: ``z_tilde = sum_k n_k z_hat_k / sum_k n_k`` (weights = local data sizes)."""
    zs = list(refined_logits)
    if not zs:
        raise ValueError("koala_integrate_logits needs at least one client's logits")
    if len(zs) != len(sample_counts):
        raise ValueError(f"{len(zs)} logit tensors but {len(sample_counts)} sample counts")
    for k, z in enumerate(zs):
        if z.shape != zs[0].shape:
            raise ValueError(
                f"client {k} logits have shape {tuple(z.shape)}, client 0 {tuple(zs[0].shape)}"
            )
    counts = [float(n) for n in sample_counts]
    if any(n < 0 for n in counts) or sum(counts) <= 0:
        raise ValueError(f"sample counts must be >= 0 with a positive sum, got {counts}")
    total = sum(counts)
    out = zs[0] * (counts[0] / total)
    for z, n in zip(zs[1:], counts[1:], strict=True):
        out = out + z * (n / total)
    return out


def koala_soft_labels(integrated_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KOALA Eq. 10: soft labels ``softmax(z_tilde / T)``."""
    _check_temperature(temperature)
    return F.softmax(upcast(integrated_logits) / temperature, dim=-1)


def koala_kd_loss(
    student_logits: Tensor,
    soft_labels: Tensor,
    temperature: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """KOALA distillation loss (Eqs. 2-3 and 11): ``KL(soft_labels || softmax(z_s / T))``.

    The model being trained (the large model in reverse distillation, a small model
    in forward distillation) is the second argument of the KL, the soft labels the
    first, as in Hinton-style distillation.
    """
    return kl_div_from_probs(soft_labels, student_logits, temperature, mask)


class BridgingMatrix(nn.Module):
    """KOALA's bridging matrix ``W`` of shape (small feature dim, large feature dim).

    ``forward(f_small)`` returns ``f_small @ W`` in the large model's feature space:
    on ``[..., d_small]`` it maps the last axis; on conv maps ``[B, d_small, H, W]``
    it maps the channel axis (a bias-free 1x1 convolution).
    """

    def __init__(self, small_dim: int, large_dim: int) -> None:
        super().__init__()
        if small_dim < 1 or large_dim < 1:
            raise ValueError(f"feature dims must be >= 1, got ({small_dim}, {large_dim})")
        self.small_dim = small_dim
        self.large_dim = large_dim
        self.weight = nn.Parameter(torch.empty(small_dim, large_dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() == 4:
            if features.shape[1] != self.small_dim:
                raise ValueError(f"expected {self.small_dim} channels, got {features.shape[1]}")
            return torch.einsum("bchw,cd->bdhw", features, self.weight)
        if features.shape[-1] != self.small_dim:
            raise ValueError(
                f"expected last dim {self.small_dim}, got shape {tuple(features.shape)}"
            )
        return features @ self.weight

    def extra_repr(self) -> str:
        return f"small_dim={self.small_dim}, large_dim={self.large_dim}"


def koala_feature_loss(
    small_features: Tensor,
    large_features: Tensor,
    bridge: BridgingMatrix | Tensor,
    mask: Tensor | None = None,
) -> Tensor:
    """KOALA Eqs. 13-14: ``MSE(F_small W, F_large)`` through the bridging matrix ``W``.

    Neither side is detached: the same expression trains the large model (reverse
    distillation) or the small one (forward), depending on whose parameters step.
    """
    mapped = bridge(small_features) if isinstance(bridge, nn.Module) else small_features @ bridge
    return hidden_mse(mapped, large_features, mask)


# ---------------------------------------------------------------------------
# FedCoLLM and FedMKT
# ---------------------------------------------------------------------------


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


def lambda_mix(l_ft: Tensor | float, l_kd: Tensor | float, lam: float) -> Tensor | float:
    """FedMKT Eqs. 9-10: ``lam * L_FT + (1 - lam) * L_KD`` with ``0 <= lam <= 1``."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must lie in [0, 1], got {lam}")
    return lam * l_ft + (1.0 - lam) * l_kd
