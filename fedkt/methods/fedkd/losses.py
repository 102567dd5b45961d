"""FedKD's losses, Eqs. 1-7 (Wu et al., "Communication-efficient federated learning via
knowledge distillation", Nature Communications 13, 2032, 2022).

KL argument order as in :mod:`fedkt.train.losses`: ``kl_div(p, q) = KL(P || Q)``, the first
argument the target.  :func:`fedkd_losses` applies Eqs. 1-7 to one batch of a client's
teacher, student and ``W_h`` (:class:`~fedkt.methods.fedkd.models.FedKDModels`);
:func:`loss_magnitudes` measures how hard Eq. 5 and Eq. 3 pull the teacher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedkt.errors import ConfigError
from fedkt.infra.precision import upcast
from fedkt.train.encoder import model_inputs
from fedkt.train.losses import hidden_mse, kl_div, masked_mean
from fedkt.train.optim import grad_norm, trainable

if TYPE_CHECKING:
    from .config import FedKDConfig
    from .models import FedKDModels

__all__ = ["FedKDLosses", "check_heads", "fedkd_adaptive_kd", "fedkd_hidden_loss",
           "fedkd_losses", "fedkd_objectives", "fedkd_task_loss", "loss_magnitudes"]


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


# --------------------------------------------------------------------------- on a batch


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
        params = trainable(layer)
        task = max(grad_norm(out.teacher_task, params), 1e-30)
        terms[f"grad_ratio/hidden/layer_{i}"] = grad_norm(out.hidden, params) / task
        terms[f"grad_ratio/kd/layer_{i}"] = grad_norm(out.teacher_kd, params) / task
    return terms
