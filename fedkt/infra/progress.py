"""Progress bars for the long, quiet parts of a run: evaluation, knowledge, alignment.

Training shows a tqdm bar (:func:`fedkt.train.loop.run_steps`); evaluating a model,
computing a FedMKT knowledge set and aligning a public set's two tokenizations show one
too, through :func:`bar`: labelled with the participant doing the work (``server``,
``client_1``; the runner and the client dispatch set it with :func:`participant`) and
what it does (``eval``, ``knowledge``, ``align``), counting items with their rate
(``items/s``).  Like training's, the bars write to stderr only when it is a terminal
(tqdm's ``disable=None``): logs, CI and piped output stay clean.  Short jobs (fewer
than :data:`MIN_ITEMS` items) show none.  Loading a model shows no library bar:
:func:`quiet_libraries` holds transformers' "Loading weights" bars and its warnings back
while fedkt loads one (the models' loaders use it), so a run's console starts with fedkt's
own lines: one :func:`status` line per model loaded from disk (and per GGUF checkpoint
converted once), where loading takes seconds and has no bar.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = ["MIN_ITEMS", "bar", "counted", "current_participant", "current_scope", "participant",
           "quiet_libraries", "scope", "status"]

T = TypeVar("T")

MIN_ITEMS = 20  # fewer items than this: no bar (as training's loops of under 20 steps)

_WHO: ContextVar[str] = ContextVar("fedkt_progress_participant", default="")
# Which of a participant's models is at work (FedCoLLM's ``global_slm``): a bar's label, and
# the key of the prediction tables emitted inside (:mod:`fedkt.eval.predictions`).
_SCOPE: ContextVar[str] = ContextVar("fedkt_prediction_scope", default="")


@contextmanager
def participant(name: str) -> Iterator[None]:
    """Label the bars made inside the block with ``name`` (``server``, ``client_0``)."""
    token = _WHO.set(name)
    try:
        yield
    finally:
        _WHO.reset(token)


def current_participant() -> str:
    """The innermost :func:`participant` label (``""`` outside one)."""
    return _WHO.get()


@contextmanager
def scope(name: str) -> Iterator[None]:
    """Tables emitted inside belong to ``name`` (a metric prefix such as ``slm``); bars made
    inside show it after the participant."""
    token = _SCOPE.set(name)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_scope() -> str:
    """The innermost :func:`scope` (``""`` outside one)."""
    return _SCOPE.get()


def bar(total: int, what: str, *, unit: str = "items") -> Any:
    """A tqdm bar of ``total`` items for ``what``, labelled with the participant.

    Quiet when stderr is not a terminal or ``total`` is under :data:`MIN_ITEMS`; use it
    as a context manager and call ``update(n)`` as items finish.
    """
    model = current_scope()  # a second model of one participant (FedCoLLM's global_slm)
    label = " ".join(p for p in (current_participant(), model, what) if p)
    return tqdm(total=total, desc=label, unit=unit, leave=False, dynamic_ncols=True,
                disable=None if total >= MIN_ITEMS else True)


def status(text: str) -> None:
    """One line on stderr for a step that takes seconds and has no bar (loading a model),
    labelled with the participant; only when stderr is a terminal, as the bars."""
    stream = sys.stderr
    if not stream.isatty():
        return
    label = " ".join(p for p in (current_participant(), current_scope()) if p)
    tqdm.write(f"{label}: {text}" if label else text, file=stream)


def counted(items: Iterable[T], total: int, what: str = "align") -> Iterator[T]:
    """``items`` unchanged, ticking a :func:`bar` of ``total`` as each is consumed."""
    with bar(total, what) as shown:
        for item in items:
            yield item
            shown.update(1)


_QUIET_LOCK = threading.Lock()
_quiet_depth = 0
_saved: tuple[bool, int] | None = None


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Inside the block, transformers shows no progress bar (its "Loading weights" bars)
    and logs errors only (no advice repeated for every model loaded); outside it, its
    settings are what they were.  fedkt's own bars (:func:`bar`, training's) are untouched.
    Nested and concurrent blocks restore the settings once, when the last one ends."""
    global _quiet_depth, _saved
    from transformers.utils import logging as hf_logging

    with _QUIET_LOCK:
        if _quiet_depth == 0:
            _saved = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity())
            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        _quiet_depth += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _quiet_depth -= 1
            if _quiet_depth == 0 and _saved is not None:
                bars, verbosity = _saved
                if bars:
                    hf_logging.enable_progress_bar()
                hf_logging.set_verbosity(verbosity)
                _saved = None
