"""The method registry: ``method.name`` in a config selects a registered :class:`Method`.

Registering is enough: ``register(Method(name="...", ...))`` in a package's
``__init__.py`` under ``fedkt/methods/`` is found by reading the sources (no import, so
``fedkt --help`` stays fast and only the method a run names is imported); a method
defined elsewhere (a plugin, a test) is available once its module is imported, and a
fresh process (a Flower client) imports that module again (:func:`plugin_module`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedkt.errors import ConfigError

if TYPE_CHECKING:
    from fedkt.config import MethodConfig
    from fedkt.methods.base import Method

__all__ = ["available", "get_method", "method_config_class", "plugin_module", "register"]

_REGISTRY: dict[str, Method] = {}
_REGISTERED_BY: dict[str, str] = {}  # name -> the module whose import registered it
_PACKAGE = Path(__file__).resolve().parent


def register(method: Method, *, module: str | None = None) -> Method:
    """Make a method available under ``method.name``.

    ``module``: what a fresh process (a Flower client) imports to have it registered too;
    by default the module that called ``register`` (not the server's, which may be one
    of fedkt's: a plugin variant of ``FedMKTServer``).
    """
    if module is None:
        module = sys._getframe(1).f_globals.get("__name__", "__main__")
    _REGISTRY[method.name] = method
    _REGISTERED_BY[method.name] = module
    return method


def _literal_name(call: ast.Call) -> str | None:
    args = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "name")]
    return next((a.value for a in args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str)), None)


@functools.cache
def _built_in() -> dict[str, str]:
    """Method name -> module, from the ``Method(name="...", ...)`` calls of fedkt/methods/."""
    found: dict[str, str] = {}
    for path in sorted(_PACKAGE.rglob("*.py")):
        parts = path.relative_to(_PACKAGE).with_suffix("").parts
        module = ".".join(("fedkt", "methods", *parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "Method" and (name := _literal_name(node)):
                found.setdefault(name, module)
    return found


def available() -> list[str]:
    return sorted({*_built_in(), *_REGISTRY})


def get_method(name: str | None) -> Method:
    if name not in _REGISTRY and name in _built_in():
        importlib.import_module(_built_in()[name])
    if name not in _REGISTRY:
        raise ConfigError(
            f"method.name: unknown method {name!r}; allowed: {', '.join(available())}")
    return _REGISTRY[name]


def method_config_class(name: str | None) -> type[MethodConfig]:
    return get_method(name).config


def plugin_module(name: str) -> str | None:
    """The module a fresh process must import to have ``name`` registered, when it is not
    one of fedkt's own (those are found without it)."""
    module = _REGISTERED_BY.get(name)
    return None if module is None or name in _built_in() else module
