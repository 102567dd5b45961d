"""Runtimes by name: ``runtime.name`` -> the function that runs a job on that transport.

A runtime is ``start(cfg, job, *, resume, quiet) -> rows``: it builds its transport and
calls ``job(cfg, transport, resume=, quiet=)`` (:func:`fedkt.runner.run_job`) where the
server procedure must run: in this process (``local``, ``flower-sim``), or it hands the
config to a process that runs the job itself (``flower``: the SuperLink's ServerApp).
Built-in runtimes are named as ``"module:function"`` and imported on first use, so
choosing ``local`` never imports Flower.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["Job", "Start", "available_runtimes", "get_runtime", "register_runtime"]

Job = Callable[..., list[dict[str, Any]]]  # (cfg, transport, *, resume, quiet) -> rows
Start = Callable[..., list[dict[str, Any]]]  # (cfg, job, *, resume, quiet) -> rows

_RUNTIMES: dict[str, Start | str] = {
    "local": "fedkt.runtime.local:start",
    "flower-sim": "fedkt.runtime.flower_sim:run_simulation_job",
    "flower": "fedkt.runtime.flower_deploy:submit_job",
}


def register_runtime(name: str, start: Start) -> Start:
    """Make ``start`` the runtime ``name`` (a new transport, or a test double)."""
    _RUNTIMES[name] = start
    return start


def available_runtimes() -> list[str]:
    return sorted(_RUNTIMES)


def get_runtime(name: str) -> Start:
    if name not in _RUNTIMES:
        raise ValueError(f"runtime.name: unknown runtime {name!r}; allowed: "
                         f"{', '.join(available_runtimes())}")
    start = _RUNTIMES[name]
    if isinstance(start, str):
        module, _, attr = start.partition(":")
        start = _RUNTIMES[name] = getattr(importlib.import_module(module), attr)
    return start
