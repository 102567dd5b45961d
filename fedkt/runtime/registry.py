"""Runtimes by name: ``runtime.name`` -> the function that runs a job on that transport.

A runtime is ``start(cfg, job, *, resume, quiet) -> rows``: it builds its transport and
calls ``job(cfg, transport, resume=, quiet=)`` (:func:`fedkt.runner.run_job`) where the
server procedure must run: in this process (``local``, ``flower-sim``), or it hands the
config to a process that runs the job itself (``flower``: the SuperLink's ServerApp).
Built-in runtimes are named as ``"module:function"`` and imported on first use, so
choosing ``local`` never imports Flower.

A runtime may register its own settings, a pydantic model: the config section
``runtime.<section>`` (the name with ``-`` as ``_``: ``runtime.flower_sim``), validated by
that model when the config loads (:class:`fedkt.config.RuntimeConfig`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from fedkt.runtime.settings import FlowerSettings, FlowerSimSettings

__all__ = ["BUILT_IN", "Job", "Start", "available_runtimes", "get_runtime", "register_runtime",
           "runtime_sections", "section_of", "unknown_runtime"]

Job = Callable[..., list[dict[str, Any]]]  # (cfg, transport, *, resume, quiet) -> rows
Start = Callable[..., list[dict[str, Any]]]  # (cfg, job, *, resume, quiet) -> rows


@dataclass(frozen=True)
class _Entry:
    start: Start | str  # the function, or "module:function" until first use
    settings: type[BaseModel] | None  # the model of its section runtime.<section>


_RUNTIMES: dict[str, _Entry] = {
    "local": _Entry("fedkt.runtime.local:start", None),
    "flower-sim": _Entry("fedkt.runtime.flower_sim:run_simulation_job", FlowerSimSettings),
    "flower": _Entry("fedkt.runtime.flower_deploy:submit_job", FlowerSettings),
}
# The runtimes fedkt itself registers: their sections are in every resolved config.
BUILT_IN = tuple(_RUNTIMES)


def section_of(name: str) -> str:
    """The config section of runtime ``name``'s settings: ``flower-sim`` -> ``flower_sim``."""
    return name.replace("-", "_")


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
    clash = [other for other in _RUNTIMES if other != name
             and section_of(other) == section_of(name)]
    if clash:
        raise ValueError(f"register_runtime({name!r}): its section runtime.{section_of(name)} "
                         f"is already runtime {clash[0]!r}'s")
    if settings is None and name in _RUNTIMES:
        settings = _RUNTIMES[name].settings
    _RUNTIMES[name] = _Entry(start, settings)
    return start


def available_runtimes() -> list[str]:
    return sorted(_RUNTIMES)


def runtime_sections() -> dict[str, tuple[str, type[BaseModel]]]:
    """Section -> (runtime name, its settings model), for every runtime with settings."""
    return {section_of(name): (name, entry.settings) for name, entry in _RUNTIMES.items()
            if entry.settings is not None}


def unknown_runtime(name: object) -> str:
    """The error text for a ``runtime.name`` that no runtime is registered under."""
    return (f"unknown runtime {name!r}; registered: {', '.join(available_runtimes())} "
            "(register_runtime adds one)")


def get_runtime(name: str) -> Start:
    if name not in _RUNTIMES:
        raise ValueError(f"runtime.name: {unknown_runtime(name)}")
    entry = _RUNTIMES[name]
    if isinstance(entry.start, str):
        module, _, attr = entry.start.partition(":")
        entry = _RUNTIMES[name] = _Entry(getattr(importlib.import_module(module), attr),
                                         entry.settings)
    assert not isinstance(entry.start, str)
    return entry.start
