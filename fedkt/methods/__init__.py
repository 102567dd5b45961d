"""Methods: ``method.name`` in a config selects one (:mod:`fedkt.methods.registry`).

Each method lives in its own package here, whose ``__init__.py`` registers it at module
level: ``METHOD = register(Method(name="...", config=..., ...))`` (docs/architecture.md);
nothing else lists it. :mod:`fedkt.methods.catalog` reads those calls from the sources
(what a config needs, importing no method); :mod:`fedkt.methods.registry` imports only
the method a run names, so ``fedkt --help`` stays fast.
"""

from __future__ import annotations

from fedkt.methods.registry import (
    available,
    get_method,
    method_config_class,
    plugin_module,
    register,
)

__all__ = ["available", "get_method", "method_config_class", "plugin_module", "register"]
