"""The optimiser and the gradient step every training loop in fedkt uses.

* :func:`make_optimizer`: AdamW with linear warm-up (FedMKT's defaults), then constant or
  linearly decaying; ``done_steps`` resumes a schedule kept across rounds;
* :func:`step`: one update of one or more optimisers from one loss: zero the gradients,
  back-propagate (scaled for fp16), clip each parameter group to ``max_grad_norm``, step
  the optimisers, then their schedules;
* :func:`trainable`: the parameters of some modules that require gradients;
* :func:`grad_norm`: the norm of a loss's gradient on the retained graph (diagnostics);
* :func:`pick_device`: ``runtime.device`` -> a torch device (:mod:`fedkt.infra.placement`'s,
  re-exported).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fedkt.config import TrainingConfig
from fedkt.errors import NonFiniteError
from fedkt.federated.privacy import update_norm
from fedkt.infra.placement import pick_device as pick_device  # re-exported

__all__ = ["Accumulate", "grad_norm", "make_optimizer", "pick_device", "step", "trainable"]

# A step's loss as micro-batches: called with ``backward``, it back-propagates each part
# through it (gradients accumulate) and returns the parts' summed value.
Accumulate = Callable[[Callable[[torch.Tensor], None]], float]


def trainable(*modules: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``modules`` that require gradients, in module order."""
    return [p for module in modules for p in module.parameters() if p.requires_grad]


def make_optimizer(params: Any, cfg: TrainingConfig, total_steps: int,
                   lr: float | None = None, *, decay: bool = False,
                   done_steps: int = 0) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with linear warm-up over ``warmup_ratio`` of the steps, then constant, or with
    ``decay`` linearly down to 0 at ``total_steps``.  ``params``: parameters or parameter
    groups (each group may carry its own ``lr``).  ``done_steps``: where in the schedule
    to start (an optimiser resumed across rounds; its moments are loaded by the caller)."""
    opt = torch.optim.AdamW(params, lr=lr or cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    warmup = max(1, math.ceil(cfg.warmup_ratio * total_steps)) if cfg.warmup_ratio else 0

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup)) if decay else 1.0

    for group in opt.param_groups:
        group.setdefault("initial_lr", group["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor, last_epoch=done_steps - 1)
    return opt, sched


def step(loss: torch.Tensor | Accumulate, optimizers: Sequence[torch.optim.Optimizer], *,
         clip: Sequence[Sequence[torch.nn.Parameter]] = (), max_grad_norm: float | None = None,
         scaler: torch.amp.GradScaler | None = None, schedules: Sequence[Any] = ()) -> float:
    """One gradient step of every optimiser in ``optimizers`` from ``loss``; its value.

    Zero the gradients, back-propagate, clip the L2 norm of each parameter group in
    ``clip`` to ``max_grad_norm`` (if set; groups are clipped separately), step the
    optimisers, then the ``schedules``.  ``scaler``: fp16 loss scaling
    (:func:`fedkt.infra.precision.grad_scaler`; ``None`` or a disabled one is the plain step).
    ``loss`` may be an :data:`Accumulate`: it back-propagates its micro-batches' parts
    itself (gradient accumulation) through the function it is given, and returns the sum.

    A non-finite loss, or an update that leaves a parameter NaN or infinite, raises
    :class:`~fedkt.errors.NonFiniteError` (with fp16 loss scaling, the scaler skips an
    update whose gradients overflowed, as usual); :func:`fedkt.train.loop.run_steps` adds
    which training and step. Every training loop steps through here.
    """
    scaled = scaler is not None and scaler.is_enabled()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)

    def backward(part: torch.Tensor) -> None:
        (scaler.scale(part) if scaled else part).backward()

    if callable(loss):
        value = float(loss(backward))
        _finite_loss(value)
    else:
        value = float(loss.detach())
        _finite_loss(value)  # before back-propagating it
        backward(loss)
    if scaled:
        for opt in optimizers:
            scaler.unscale_(opt)
    if max_grad_norm:
        for group in clip:
            if group:
                torch.nn.utils.clip_grad_norm_(group, max_grad_norm)
    for opt in optimizers:
        if scaled:
            scaler.step(opt)
        else:
            opt.step()
    if scaled:
        scaler.update()
    _finite_weights(optimizers, value)
    for sched in schedules:
        if sched is not None:
            sched.step()
    return value


def _finite_loss(value: float) -> None:
    if not math.isfinite(value):
        raise NonFiniteError(f"the loss is {value}; no update was made")


def _finite_weights(optimizers: Sequence[torch.optim.Optimizer], loss: float) -> None:
    """Refuse an update that left a parameter NaN or infinite (one check per step)."""
    params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    if not params:
        return
    finite = torch.stack([torch.isfinite(p.detach()).all() for p in params])
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise NonFiniteError(f"the update left {bad} of {len(params)} trained tensors "
                             f"non-finite (NaN or infinity) at a loss of {loss:.6g}")


def grad_norm(loss: torch.Tensor | float, params: list[torch.nn.Parameter]) -> float:
    """L2 norm of ``d loss / d params`` on the retained graph (the graph stays usable for
    the update that follows); 0 when ``loss`` does not reach ``params``."""
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return 0.0
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return update_norm({str(i): g for i, g in enumerate(grads) if g is not None})
