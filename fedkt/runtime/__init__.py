"""Runtimes move payloads between the server procedure and client handlers.

``local`` runs everything in this process; ``flower-sim`` runs the same job in
Flower's simulation engine; ``flower`` submits it to a Flower SuperLink; more register
with :func:`fedkt.runtime.registry.register_runtime`.  The method code is the same in all.

The names below are imported on first use, so that :mod:`fedkt.config` can read the
runtimes' settings (:mod:`fedkt.config.runtime_settings`) without importing the transports.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RoundError", "RuntimeClients", "Transport", "handle_request"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("fedkt.runtime.base"), name)
    raise AttributeError(f"module 'fedkt.runtime' has no attribute {name!r}")
