"""Seconds spent evaluating, so compute can be reported without the evaluation in it.

Every evaluation function (``evaluate_causal_lm``, the classifiers) runs inside
:func:`evaluating`; :func:`eval_clock` is the running total, in wall seconds and in CPU
seconds of the process.  A round's *compute* is its time minus the evaluation it
contains (and, on the server, minus the time it waited for clients): what a method
costs, whatever the run's ``eval.every``.  CPU seconds count every thread of the
process and not the time it waited for another process sharing the cores; wall seconds
count a GPU's time, which CPU seconds do not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import NamedTuple, ParamSpec, TypeVar

__all__ = ["Clock", "eval_clock", "evaluating", "now", "timed_evaluation"]

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


def eval_clock() -> Clock:
    """Seconds this thread has spent in evaluation functions so far."""
    return getattr(_state, "total", Clock())


@contextmanager
def evaluating() -> Iterator[None]:
    """Count the block's time as evaluation (nested blocks count once)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    start = now()
    try:
        yield
    finally:
        _state.depth = depth
        if depth == 0:
            _state.total = eval_clock() + (now() - start)


def timed_evaluation(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: ``fn``'s calls count as evaluation (:func:`evaluating`)."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with evaluating():
            return fn(*args, **kwargs)

    return wrapper
