"""Methods: ``method.name`` in a config selects one (:mod:`fedkt.methods.registry`).

Each method lives in its own package here: ``config.py`` (its settings, torch-free),
``algorithm.py`` and ``method.py`` (its :class:`~fedkt.methods.base.Method`). The table
:data:`fedkt.config.method_catalog.BUILT_IN` names each by ``"module:attribute"`` strings (what a
config needs, importing no method); :mod:`fedkt.methods.registry` imports only the method
a run names, so ``fedkt --help`` stays fast. A plugin declares its method with
:func:`register_method` (or registers a ready one with :func:`register`).
"""

from __future__ import annotations

from fedkt.methods.registry import (
    available,
    get_method,
    method_config_class,
    plugin_module,
    register,
    register_method,
)

__all__ = ["available", "get_method", "method_config_class", "plugin_module", "register",
           "register_method"]
