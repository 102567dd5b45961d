"""The method catalog: which methods exist, by name, and what validating a config needs
of each (its config class, its ``check``, its behaviour's flags, its summary), without
importing any method.

fedkt's own methods are read from their sources: each ``Method(name="...", config=...,
...)`` call under ``fedkt/methods/`` names its config class and check as names imported
from its ``config.py``, and only that module is imported (not the method's package,
whose ``__init__`` imports its algorithm). A method registered from elsewhere (a plugin,
a test) is here once its module has called :func:`register`.

This module imports no method by its package: :mod:`fedkt.methods.registry` does, and
the config layer reads only this catalog, so validating a config never reaches an
algorithm (and no import runs back up from a method to what loads it).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from fedkt.errors import ConfigError

if TYPE_CHECKING:
    from fedkt.config import MethodConfig
    from fedkt.methods.base import Method

__all__ = ["FLAGS", "available", "method_check", "method_config_class", "method_flag",
           "plugin_module", "register", "summaries", "unknown_method"]

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


def _module_name(path: Path) -> str:
    parts = path.relative_to(_PACKAGE).with_suffix("").parts
    return ".".join(("fedkt", "methods", *parts)).removesuffix(".__init__")


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> ``module:attribute`` (or ``module`` for a module) of the module-level
    ``from ... import`` / ``import`` statements of ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}:{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
    return names


def _reference(node: ast.expr | None, names: dict[str, str]) -> str | None:
    """``module:attribute`` of a name (``FedMKTConfig``) or a module's attribute
    (``config.FedMKTConfig``) that the module imported; None when it is defined there."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        base = names.get(node.value.id, "")
        module = base.replace(":", ".")  # `from . import config`: fedkt.methods.x.config
        return f"{module}:{node.attr}" if module else None
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    """The value of keyword ``name`` anywhere in the call (also in a nested call that
    groups arguments)."""
    return next((k.value for node in ast.walk(call) if isinstance(node, ast.Call)
                 for k in node.keywords if k.arg == name), None)


def _behaviour_call(call: ast.Call, tree: ast.Module) -> ast.Call | None | bool:
    """The ``Behaviour(...)`` call a ``Method(...)`` call passes as ``behaviour=``, directly
    or through a module-level name bound to one; False when it passes none (the defaults);
    None when the sources do not tell."""
    behaviour = _keyword(call, "behaviour")
    if behaviour is None:
        return False
    if isinstance(behaviour, ast.Name):  # _BEHAVIOUR = Behaviour(...) at module level
        bound = [n.value for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == behaviour.id for t in n.targets)]
        behaviour = bound[0] if len(bound) == 1 else None
    return behaviour if isinstance(behaviour, ast.Call) else None


# The flags of :class:`fedkt.methods.base.Behaviour` that config checks read.
FLAGS = ("aggregates", "model_lr")


def _flags(call: ast.Call, tree: ast.Module) -> dict[str, bool] | None:
    """``aggregates`` and ``model_lr`` of a ``Method(...)`` call's behaviour, where the
    sources give them as literals (an unset flag is False, its default); else None."""
    behaviour = _behaviour_call(call, tree)
    if behaviour is None:
        return None
    flags = dict.fromkeys(FLAGS, False)
    for keyword in behaviour.keywords if behaviour is not False else ():
        if keyword.arg in flags:
            if not (isinstance(keyword.value, ast.Constant)
                    and isinstance(keyword.value.value, bool)):
                return None
            flags[keyword.arg] = keyword.value.value
    return flags


def _check_reference(call: ast.Call, tree: ast.Module, names: dict[str, str]) -> str | None:
    """``module:attribute`` of the ``check`` a ``Method(...)`` call passes, directly or in
    its ``behaviour=`` (:func:`_behaviour_call`); ``""`` when it passes none (no check);
    None when the sources do not tell."""
    check = _keyword(call, "check")
    if check is not None:
        return _reference(check, names)
    behaviour = _behaviour_call(call, tree)
    if behaviour is None:
        return None
    check = None if behaviour is False else _keyword(behaviour, "check")
    return "" if check is None else _reference(check, names)


@functools.cache
def _declared() -> dict[str, dict[str, Any]]:
    """Method name -> ``module`` (whose import registers it) and, as ``module:attribute``,
    its ``config`` and ``check`` (None where the sources do not say; ``""`` for a check
    the call does not pass: ``Behaviour.check``'s default, no check), its behaviour's
    ``flags`` (:func:`_flags`), and its
    ``summary`` (the ``Docs(summary=...)`` literal, None if not a literal), from the
    ``Method("name", ...)`` calls of fedkt/methods/."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(_PACKAGE.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _imported_names(tree, module, path.name == "__init__.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "Method" and (name := _literal_name(node)):
                config = _keyword(node, "config")
                if config is None and len(node.args) > 1:
                    config = node.args[1]
                summary = _keyword(node, "summary")
                found.setdefault(name, {"module": module,
                                        "config": _reference(config, names),
                                        "check": _check_reference(node, tree, names),
                                        "flags": _flags(node, tree),
                                        "summary": summary.value if isinstance(summary, ast.Constant)
                                        and isinstance(summary.value, str) else None})
    return found


@functools.cache
def _built_in() -> dict[str, str]:
    """Method name -> module, from the ``Method(name="...", ...)`` calls of fedkt/methods/."""
    return {name: str(found["module"]) for name, found in _declared().items()}


def _module_alone(module: str) -> ModuleType:
    """Import one module of fedkt/methods/ without its package's ``__init__`` (which
    imports the method's algorithm) when that package is not imported yet; the package,
    imported later, finds the module in ``sys.modules`` (the same classes)."""
    if module in sys.modules:
        return sys.modules[module]
    parent = module.rpartition(".")[0]
    path = _PACKAGE.joinpath(*module.split(".")[2:]).with_suffix(".py")
    if parent in sys.modules or parent == __package__ or not path.is_file():
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded
    try:
        spec.loader.exec_module(loaded)
    except ImportError:  # e.g. a relative import that needs the package: import it whole
        del sys.modules[module]
        return importlib.import_module(module)
    except BaseException:
        del sys.modules[module]
        raise
    return loaded


def _declared_object(name: str, what: str) -> Any:
    """A built-in method's ``config``, ``check`` or ``summary`` as its sources give it,
    importing only the module that defines it (its ``config.py``)."""
    found = _declared()[name]
    reference = found[what]
    if what == "summary":
        value = reference
    elif reference == "":  # no check passed: the default, none
        return None
    elif reference is None or reference.partition(":")[0] in _built_in().values() \
            or not reference.startswith("fedkt.methods."):
        value = None  # defined in the registering module itself, or not a name
    else:
        module, _, attribute = reference.partition(":")
        value = getattr(_module_alone(module), attribute, None)
    if value is None or (what == "config" and not isinstance(value, type)):
        raise RuntimeError(
            f"method {name!r} ({found['module']}): its Method(...) call must give {what}= "
            "as a name imported from the method's config module (a summary as a string "
            "literal), so that a config validates without importing the method "
            "(fedkt.methods.catalog)")
    return value


def unknown_method(name: object) -> ConfigError:
    """The error for a ``method.name`` that no method is registered under."""
    return ConfigError(f"method.name: unknown method {name!r}; allowed: {', '.join(available())}")


def _known(name: object) -> str:
    if not isinstance(name, str) or name not in {*_REGISTRY, *_built_in()}:
        raise unknown_method(name)
    return name


def available() -> list[str]:
    return sorted({*_built_in(), *_REGISTRY})


def summaries() -> dict[str, str]:
    """Every available method's one-line summary (``docs.summary``), by name (``fedkt
    list``, the config reference)."""
    return {name: _REGISTRY[name].docs.summary if name in _REGISTRY
            else _declared_object(name, "summary") for name in available()}


def method_config_class(name: str | None) -> type[MethodConfig]:
    """The config class of method ``name``; for fedkt's own methods only its module is
    imported (``fedkt.methods.fedmkt.config``), not the method."""
    name = _known(name)
    if name in _REGISTRY:
        return _REGISTRY[name].config
    return _declared_object(name, "config")


def method_flag(name: str, flag: str) -> bool:
    """``Behaviour.<flag>`` (one of :data:`FLAGS`) of method ``name``; for fedkt's own
    methods read from the sources, importing nothing, so that a config's cross-method
    checks (SecAgg, DP, a per-model ``lr``) import no algorithm and no torch."""
    if flag not in FLAGS:
        raise ValueError(f"flag: {flag!r} is not one of {', '.join(FLAGS)}")
    name = _known(name)
    if name in _REGISTRY:
        return bool(getattr(_REGISTRY[name].behaviour, flag))
    flags = _declared()[name]["flags"]
    if not isinstance(flags, dict):
        raise RuntimeError(
            f"method {name!r}: its Behaviour(...) must give {', '.join(FLAGS)} as literals "
            "True/False, so that a config validates without importing the method "
            "(fedkt.methods.catalog)")
    return bool(flags[flag])


def method_check(name: str) -> Callable[[Any], None] | None:
    """The method's ``check`` of a whole run config (``Behaviour.check``); for fedkt's own
    methods only the module that defines it is imported."""
    name = _known(name)
    if name in _REGISTRY:
        return _REGISTRY[name].behaviour.check
    return _declared_object(name, "check")


def plugin_module(name: str) -> str | None:
    """The module a fresh process must import to have ``name`` registered, when it is not
    one of fedkt's own (those are found without it)."""
    module = _REGISTERED_BY.get(name)
    return None if module is None or name in _built_in() else module
