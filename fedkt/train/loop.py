"""The training loop every fedkt trainer runs: seed, train mode, one step per batch, eval mode.

:func:`run_steps` is the loop and nothing else: the caller builds the batches, the loss
of a batch (where the paper's equations are written) and the step
(:func:`fedkt.train.optim.step` with its optimisers).  The loop seeds torch's global
generator (dropout) with ``seed``, puts ``modules`` in train mode, and for every batch
computes the loss, steps, and keeps the loss value and any named parts of it. A step
whose loss or update is not finite stops the loop with a
:class:`~fedkt.errors.NonFiniteError` naming ``desc`` (the participant and phase), the
step and the loss's parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from fedkt.errors import NonFiniteError
from fedkt.infra.memory import release_memory
from fedkt.infra.precision import frozen_linears_as
from fedkt.infra.timing import timed

__all__ = ["LoopStats", "run_steps"]

B = TypeVar("B")
# (step index, batch) -> the loss, or (the loss, {part name: scalar}) to average parts too
BatchLoss = Callable[[int, Any], "Tensor | tuple[Tensor, dict[str, Tensor | float]]"]


@dataclass
class LoopStats:
    """What a loop did: the value of every step's loss, the summed parts, the seconds."""

    losses: list[float] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def loss(self) -> float:
        """Mean loss over the steps (NaN without any)."""
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")

    def means(self) -> dict[str, float]:
        """Each part averaged over the steps."""
        return {k: v / max(1, self.steps) for k, v in self.parts.items()}


def _where(desc: str, i: int, total: int | None, parts: dict[str, Tensor | float]) -> str:
    """``"<desc>: step 3 of 5 (kd_loss=inf): "``: the training, the step and its loss's parts."""
    of = f" of {total}" if total is not None else ""
    shown = ", ".join(f"{name}={float(p.detach() if isinstance(p, Tensor) else p):.6g}"
                      for name, p in parts.items())
    return f"{desc}: step {i + 1}{of}" + (f" ({shown})" if shown else "") + ": "


@timed("train")
def run_steps(batches: Iterable[B], loss: BatchLoss, step: Callable[[Tensor], float], *,
              modules: Sequence[nn.Module], seed: int, total: int | None = None,
              desc: str = "train", cast: torch.dtype | None) -> LoopStats:
    """Train on ``batches``: ``step(loss(i, batch))`` for each, ``modules`` in train mode.

    ``total`` (the number of batches, when known) shows a progress bar for loops of 20
    steps or more.  ``modules`` are left in eval mode.  Its time is the ``train`` phase
    unless the caller's phase (``distill``) already counts it (:mod:`fedkt.infra.timing`).
    After each step the heap it freed goes back to the OS (:mod:`fedkt.infra.memory`).
    ``cast`` (required, so no loop forgets it): the autocast type the steps run under
    (None: fp32, :func:`fedkt.infra.precision.autocast_dtype`); the frozen linear
    weights of ``modules`` are held in it meanwhile
    (:func:`fedkt.infra.precision.frozen_linears_as`: the same numbers, less memory).
    """
    stats = LoopStats()
    torch.manual_seed(seed)  # dropout and any other in-model randomness
    for module in modules:
        module.train()
    show = total is not None and total >= 20
    started = time.perf_counter()
    with frozen_linears_as(modules, cast):
        for i, batch in enumerate(tqdm(batches, desc=desc, total=total, leave=False,
                                       disable=None if show else True)):
            out = loss(i, batch)
            value, parts = out if isinstance(out, tuple) else (out, {})
            try:
                stats.losses.append(step(value))
            except NonFiniteError as exc:
                raise NonFiniteError(_where(desc, i, total, parts) + str(exc)) from None
            for name, part in parts.items():
                stats.parts[name] = stats.parts.get(name, 0.0) + float(
                    part.detach() if isinstance(part, Tensor) else part)
            release_memory()  # the step's activations: each step's shapes differ
    stats.seconds = time.perf_counter() - started
    for module in modules:
        module.eval()
    return stats
