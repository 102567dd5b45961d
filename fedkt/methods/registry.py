"""The method registry: ``method.name`` in a config selects a registered :class:`Method`.

Registering is enough: ``register(Method(name="...", ...))`` in a package's
``__init__.py`` under ``fedkt/methods/`` is found by reading the sources
(:mod:`fedkt.methods.catalog`, no import, so ``fedkt --help`` stays fast and validating a
config imports no method); :func:`get_method` imports the package of the method a run
names, the one place fedkt loads a method by name. A method defined elsewhere (a plugin,
a test) is available once its module is imported, and a fresh process (a Flower client)
imports that module again (:func:`plugin_module`).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from fedkt.methods import catalog
from fedkt.methods.catalog import (
    FLAGS,
    _built_in,
    available,
    method_check,
    method_config_class,
    method_flag,
    plugin_module,
    register,
    summaries,
    unknown_method,
)

if TYPE_CHECKING:
    from fedkt.methods.base import Method

__all__ = ["FLAGS", "available", "get_method", "method_check", "method_config_class",
           "method_flag", "plugin_module", "register", "summaries"]


def get_method(name: str | None) -> Method:
    """The registered method ``name``; a built-in one is imported (its package) first."""
    if name not in catalog._REGISTRY and name in _built_in():
        module = importlib.import_module(_built_in()[name])
        for child, loaded in list(sys.modules.items()):  # a module imported alone before
            head, _, attribute = child.rpartition(".")
            if head == module.__name__ and not hasattr(module, attribute):
                setattr(module, attribute, loaded)
    if name not in catalog._REGISTRY:
        raise unknown_method(name)
    return catalog._REGISTRY[name]
