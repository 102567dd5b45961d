"""Where a run's time goes: seconds per phase (evaluation, training, distillation, ...).

The shared pieces mark their work with :func:`phase` (or the :func:`timed` decorator):
every evaluation function is ``eval``, :func:`fedkt.train.loop.run_steps` is ``train``
(or ``distill``, as its caller says), computing what a teacher sends is ``knowledge``,
token and vocabulary alignment ``align``, (de)serialising a message ``comm`` and writing a
checkpoint ``checkpoint``.  The outermost phase takes the time: scoring done to compute
a teacher's knowledge is ``knowledge``, not ``eval``.  :func:`clocks` is the running
total per phase of this thread, in wall seconds and CPU seconds of the process; a
participant's row reports the difference over its work as ``<phase>_seconds``, and what
no phase covers is the rest of its ``wall_time``.  A result reused instead of computed
(:mod:`fedkt.eval.reuse`) spends little; :func:`saved` records the seconds its computation took,
reported as ``eval_saved_seconds`` / ``knowledge_saved_seconds``.

A round's *compute* is its time minus the evaluation it contains (and, on the server,
minus the time it waited for clients): what a method costs, whatever the run's
``eval.every``.  CPU seconds count every thread of the process and not the time it waited
for another process sharing the cores; wall seconds count a GPU's time, which CPU seconds
do not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import wraps
from typing import NamedTuple, ParamSpec, TypeVar

from fedkt.infra.memory import release_memory

__all__ = ["PHASES", "SAVED", "Clock", "clocks", "eval_clock", "evaluating", "now", "phase",
           "phase_seconds", "saved", "timed", "timed_evaluation"]

# The phases a run's time is broken into (fedkt report, suite.md, docs/performance.md).
PHASES = ("eval", "train", "distill", "knowledge", "align", "comm", "checkpoint")
# What reused results saved (fedkt.eval.reuse): the seconds their computation took when it ran,
# reported as ``<phase>_saved_seconds``; not part of the run's wall time.
SAVED = ("eval_saved", "knowledge_saved", "train_saved", "distill_saved")

_state = threading.local()

P = ParamSpec("P")
R = TypeVar("R")


class Clock(NamedTuple):
    """Wall and CPU seconds."""

    wall: float = 0.0
    cpu: float = 0.0

    def __sub__(self, other: tuple[float, ...]) -> Clock:  # type: ignore[override]
        return Clock(self.wall - other[0], self.cpu - other[1])

    def __add__(self, other: tuple[float, ...]) -> Clock:  # type: ignore[override]
        return Clock(self.wall + other[0], self.cpu + other[1])


def now() -> Clock:
    """The wall clock and the process's CPU clock."""
    return Clock(time.perf_counter(), time.process_time())


def clocks() -> dict[str, Clock]:
    """Seconds this thread has spent in each phase so far (a copy)."""
    return dict(getattr(_state, "totals", {}))


def eval_clock() -> Clock:
    """Seconds this thread has spent in evaluation so far."""
    return getattr(_state, "totals", {}).get("eval", Clock())


def phase_seconds(before: dict[str, Clock], after: dict[str, Clock]) -> dict[str, float]:
    """``{"<phase>_seconds": wall seconds}`` spent between two :func:`clocks` readings
    (phases with no time are left out), and ``<phase>_saved_seconds`` of :func:`saved`."""
    out = {}
    for name in (*PHASES, *SAVED):
        spent = (after.get(name, Clock()) - before.get(name, Clock())).wall
        if spent > 0:
            out[f"{name}_seconds"] = spent
    return out


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the block's time as phase ``name``, unless an outer phase already counts it.

    When the outermost phase ends, the heap it freed goes back to the OS
    (:func:`fedkt.infra.memory.release_memory`), outside the phase's clock."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; one of {', '.join(PHASES)}")
    if getattr(_state, "active", None) is not None:
        yield
        return
    _state.active = name
    start = now()
    try:
        yield
    finally:
        _state.active = None
        totals = getattr(_state, "totals", None)
        if totals is None:
            totals = _state.totals = {}
        totals[name] = totals.get(name, Clock()) + (now() - start)
        release_memory()


def saved(name: str, seconds: float) -> None:
    """Record that a reused result spared ``seconds`` of phase ``name`` (the seconds its
    computation took when it ran): this thread's ``<name>_saved`` clock."""
    key = f"{name}_saved"
    if key not in SAVED:
        raise ValueError(f"unknown saved phase {key!r}; one of {', '.join(SAVED)}")
    totals = getattr(_state, "totals", None)
    if totals is None:
        totals = _state.totals = {}
    totals[key] = totals.get(key, Clock()) + Clock(max(0.0, float(seconds)), 0.0)


def timed(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: the function's calls count as phase ``name`` (:func:`phase`)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with phase(name):
                return fn(*args, **kwargs)

        return wrapper

    return wrap


def evaluating() -> AbstractContextManager[None]:
    """Count the block's time as evaluation."""
    return phase("eval")


timed_evaluation = timed("eval")
