"""Plugins: modules outside fedkt that register methods, runtimes, data readers or drill
faults when imported (docs/architecture.md, extension points).

``FEDKT_PLUGINS=pkg.mod,other.mod:function`` names them for every fedkt process: the
``fedkt`` command imports them before it reads a config, and Flower's ServerApp and
ClientApps before their first request.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable

__all__ = ["PLUGINS_ENV", "import_plugins"]

PLUGINS_ENV = "FEDKT_PLUGINS"


def import_plugins(modules: Iterable[str] | str | None = None) -> None:
    """Import modules that register extra methods: ``"pkg.mod"`` or ``"pkg.mod:function"``.

    Items are comma-separated (or a list); with ``:function`` that function is
    called after the import (e.g. to register a method).  The ``FEDKT_PLUGINS``
    environment variable is always honoured as well.
    """
    if isinstance(modules, str):
        modules = modules.split(",")
    names = [*(modules or []), *os.environ.get(PLUGINS_ENV, "").split(",")]
    for spec in dict.fromkeys(n.strip() for n in names if n.strip()):
        module_name, _, func = spec.partition(":")
        module = importlib.import_module(module_name)
        if func:
            getattr(module, func)()
