"""The method registry: ``method.name`` in a config selects a :class:`Method`.

A method is declared in the catalog (:data:`fedkt.config.method_catalog.BUILT_IN` for fedkt's
own, :func:`register_method` for a plugin's) by ``"module:attribute"`` strings, so that
``fedkt --help`` stays fast and validating a config imports no method;
:func:`get_method` imports the ``method`` module of the method a run names, the one place
fedkt loads a method by name. A :class:`Method` registered ready-made (:func:`register`)
is used as it is, and a fresh process (a Flower client) imports the module that
registered it again (:func:`plugin_module`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedkt.config import method_catalog as catalog
from fedkt.config.method_catalog import (
    BUILT_IN,
    FLAGS,
    MethodEntry,
    available,
    method_check,
    method_config_class,
    method_flag,
    plugin_module,
    register,
    register_method,
    summaries,
)
from fedkt.errors import ConfigError

if TYPE_CHECKING:
    from fedkt.methods.base import Method

__all__ = ["BUILT_IN", "FLAGS", "MethodEntry", "available", "get_method", "method_check",
           "method_config_class", "method_flag", "plugin_module", "register",
           "register_method", "summaries"]


def _disagreements(name: str, declared: MethodEntry, method: Method) -> list[str]:
    """Where the Method ``declared.method`` names differs from its catalog entry."""
    check = None if declared.check is None else catalog.load(declared.check, name)
    want = {"name": name, "config": catalog.load(declared.config, name), "check": check,
            "aggregates": declared.aggregates, "model_lr": declared.model_lr,
            "summary": declared.summary}
    got = {"name": method.name, "config": method.config, "check": method.behaviour.check,
           "aggregates": method.behaviour.aggregates, "model_lr": method.behaviour.model_lr,
           "summary": method.docs.summary}
    return [f"{key} is {got[key]!r} there, {want[key]!r} in the entry"
            for key in want if got[key] is not want[key] and got[key] != want[key]]


def get_method(name: str | None) -> Method:
    """The method ``name``: a registered :class:`Method`, else the one its catalog entry
    names (its module imported now), checked against the entry."""
    from fedkt.methods.base import Method

    declared = catalog.entry(name)
    if declared is None:
        return catalog._REGISTRY[str(name)]
    method = catalog.load(declared.method, f"method {name!r}")
    if not isinstance(method, Method):
        raise ConfigError(f"method {name!r}: {declared.method!r} is not a Method "
                          f"but {type(method).__name__}")
    wrong = _disagreements(str(name), declared, method)
    if wrong:
        raise ConfigError(f"method {name!r}: the Method at {declared.method!r} does not "
                          "match its catalog entry: " + "; ".join(wrong))
    return method
