"""Runtimes by name: ``runtime.name`` -> the function that runs a job on that transport.

A runtime is ``start(cfg, job, *, resume, quiet) -> rows``: it builds its transport and
calls ``job(cfg, transport, resume=, quiet=)`` (:func:`fedkt.runtime.job.run_job`) where the
server procedure must run: in this process (``local``, ``flower-sim``), or it hands the
config to a process that runs the job itself (``flower``: the SuperLink's ServerApp).
Built-in runtimes are named as ``"module:function"`` and imported on first use, so
choosing ``local`` never imports Flower.

A runtime may register its own settings, a pydantic model: the config section
``runtime.<section>``. A config reads the names and the settings from
:mod:`fedkt.config.runtime_catalog`, which imports no runtime; this module loads them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from fedkt.config import runtime_catalog as catalog
from fedkt.config.runtime_catalog import (
    BUILT_IN,
    available_runtimes,
    runtime_sections,
    section_of,
    unknown_runtime,
)

__all__ = ["BUILT_IN", "Job", "Start", "available_runtimes", "get_runtime", "register_runtime",
           "runtime_sections", "section_of", "unknown_runtime"]

Job = Callable[..., list[dict[str, Any]]]  # (cfg, transport, *, resume, quiet) -> rows
Start = Callable[..., list[dict[str, Any]]]  # (cfg, job, *, resume, quiet) -> rows

# name -> the function, or "module:function" until first use (its settings: the catalog)
_STARTS: dict[str, Start | str] = {
    "local": "fedkt.runtime.local:start",
    "flower-sim": "fedkt.runtime.flower_sim:run_simulation_job",
    "flower": "fedkt.runtime.flower_deploy:submit_job",
}


def register_runtime(name: str, start: Start,
                     settings: type[BaseModel] | None = None) -> Start:
    """Make ``start`` the runtime ``name`` (a new transport, or a test double).

    ``settings``: a pydantic model, the section ``runtime.<name with - as _>`` of a config
    that names this runtime (None: no settings, or, when ``name`` is already registered,
    the settings registered with it before).
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise ValueError(f"register_runtime: name {name!r} must be a letter then letters, "
                         "digits, '-' or '_' (it is runtime.name in a config)")
    if not callable(start):
        raise TypeError(f"register_runtime({name!r}): start must be a function "
                        "start(cfg, job, *, resume, quiet), got " + type(start).__name__)
    if settings is not None and not (isinstance(settings, type)
                                     and issubclass(settings, BaseModel)):
        raise TypeError(f"register_runtime({name!r}): settings must be a pydantic model class, "
                        f"got {settings!r}")
    table = catalog._SETTINGS
    clash = [other for other in table if other != name
             and section_of(other) == section_of(name)]
    if clash:
        raise ValueError(f"register_runtime({name!r}): its section runtime.{section_of(name)} "
                         f"is already runtime {clash[0]!r}'s")
    if settings is None and name in table:
        settings = table[name]
    table[name] = settings
    _STARTS[name] = start
    return start


def get_runtime(name: str) -> Start:
    """Runtime ``name``'s start function; a built-in one's module is imported on first use."""
    if name not in _STARTS:
        raise ValueError(f"runtime.name: {unknown_runtime(name)}")
    start = _STARTS[name]
    if isinstance(start, str):
        module, _, attr = start.partition(":")
        start = _STARTS[name] = getattr(importlib.import_module(module), attr)
    return start
