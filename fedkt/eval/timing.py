"""Seconds spent evaluating, so compute can be reported without the evaluation in it.

Every evaluation function (``evaluate_lm``, the classifiers) runs inside
:func:`evaluating`; :func:`eval_seconds` is the process's running total.  A round's
*compute* is its wall time minus the evaluation seconds it contains (and, on the
server, minus the time it waited for clients): what a method costs, whatever the
``eval.every`` of the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

__all__ = ["eval_seconds", "evaluating", "timed_evaluation"]

_state = threading.local()

P = ParamSpec("P")
R = TypeVar("R")


def eval_seconds() -> float:
    """Wall seconds this thread has spent in evaluation functions so far."""
    return getattr(_state, "total", 0.0)


@contextmanager
def evaluating() -> Iterator[None]:
    """Count the block's wall time as evaluation (nested blocks count once)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _state.depth = depth
        if depth == 0:
            _state.total = eval_seconds() + time.perf_counter() - start


def timed_evaluation(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: ``fn``'s calls count as evaluation (:func:`evaluating`)."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with evaluating():
            return fn(*args, **kwargs)

    return wrapper
