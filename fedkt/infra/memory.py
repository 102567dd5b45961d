"""Giving freed heap back to the operating system between phases of a run.

On CPU, torch allocates a forward's and a backward's activations with ``malloc``. glibc
serves blocks under its mmap threshold (which rises to 32 MB once such a block is freed)
from its heap, and freed heap stays with the process unless it is at the heap's top. Each
phase leaves a differently shaped hole, so a FedMKT run on CLINC150 grew by 0.2-0.6 GB for
every model it trained, none given back (docs/records/testbed.md).
:func:`release_memory`, called after each training step (:func:`fedkt.train.loop.run_steps`)
and when an outermost phase ends (:func:`fedkt.infra.timing.phase`), returns the free pages
with glibc's ``malloc_trim(0)``: about 1 GB less held between steps in that run, its peak
unchanged (one distillation step of the LLM sets it; docs/records/performance.md). It
changes no number a run computes (``benchmarks/memory_release.py``).
Elsewhere (macOS, musl, Windows) it does nothing; ``FEDKT_MALLOC_TRIM=0`` turns it off.
:func:`peak_rss_mb` is the process's high-water mark, which each run records.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Callable

__all__ = ["peak_rss_mb", "release_memory", "trim_available"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux") or os.environ.get("FEDKT_MALLOC_TRIM") == "0":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_available() -> bool:
    """Whether :func:`release_memory` can give memory back here (glibc on Linux, and
    ``FEDKT_MALLOC_TRIM`` is not ``0``)."""
    return _malloc_trim() is not None


def release_memory() -> bool:
    """Return the heap's free pages to the OS; True when something was given back."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far, in MB (10**6 bytes); None where the
    platform does not report it (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak * (1 if sys.platform == "darwin" else 1024) / 1e6, 1)
