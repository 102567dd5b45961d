"""The method catalog: which methods exist, by name, and what validating a config needs of
each (its config class, its ``check``, the flags config checks read, its summary), without
importing any method's algorithm.

fedkt's own methods are declared once, in :data:`BUILT_IN`, by ``"module:attribute"``
strings, as :mod:`fedkt.runtime.registry` declares its runtimes: ``config`` (the method's
config class, in its package's ``config.py``, which imports no torch), ``method`` (the
:class:`~fedkt.methods.base.Method`, in its package's ``method.py``, which imports the
algorithm), and ``check``. A method from elsewhere (a plugin) is declared the same way with
:func:`register_method`, or registers a ready :class:`Method` with :func:`register` (which
its module has already imported).

The config layer reads only this catalog, which imports a method's config module and never
its ``method`` module: :func:`fedkt.methods.registry.get_method` does that, when a run
names it.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedkt.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from fedkt.config import MethodConfig
    from fedkt.methods.base import Method

__all__ = ["BUILT_IN", "FLAGS", "MethodEntry", "available", "entry", "load", "method_check",
           "method_config_class", "method_flag", "plugin_module", "register",
           "register_method", "summaries", "unknown_method"]

# The flags of :class:`fedkt.methods.base.Behaviour` that config checks read.
FLAGS = ("aggregates", "model_lr")


@dataclass(frozen=True)
class MethodEntry:
    """A method as the catalog holds it: strings and literals, so that reading it imports
    nothing.  Each must agree with the :class:`Method` that ``method`` names (its
    ``config``, ``behaviour.check``, ``behaviour.aggregates``, ``behaviour.model_lr``,
    ``docs.summary``); :func:`fedkt.methods.registry.get_method` checks that it does."""

    config: str  # "module:ConfigClass", torch-free: what validating a config imports
    method: str  # "module:METHOD", the Method: imported only when a run names the method
    summary: str  # one line: `fedkt list`, docs/configuration.md
    check: str | None = None  # "module:function", Behaviour.check (in the config module)
    aggregates: bool = False  # Behaviour.aggregates: secure aggregation and DP apply
    model_lr: bool = False  # Behaviour.model_lr: a per-model `lr` applies


def _builtin(package: str, config: str, method: str, summary: str, *,
             check: str | None = None, aggregates: bool = False,
             model_lr: bool = False) -> MethodEntry:
    """A built-in method's entry: ``config`` and ``check`` from
    ``fedkt.methods.<package>.config``, ``method`` from ``fedkt.methods.<package>.method``."""
    where = f"fedkt.methods.{package}"
    return MethodEntry(config=f"{where}.config:{config}", method=f"{where}.method:{method}",
                       summary=summary, check=check and f"{where}.config:{check}",
                       aggregates=aggregates, model_lr=model_lr)


# fedkt's own methods, each named once. A new one: a package under fedkt/methods/ with
# config.py and method.py (docs/architecture.md), and its line here.
BUILT_IN: dict[str, MethodEntry] = {
    "fedavg": _builtin(
        "fedavg", "FedAvgConfig", "METHOD",
        "FedAvg of LoRA/prefix adapters on a shared client model",
        aggregates=True, model_lr=True),
    "fedmkt": _builtin(
        "fedmkt", "FedMKTConfig", "METHOD",
        "mutual top-K logit distillation between a server LLM and heterogeneous client SLMs "
        "(token alignment, DualMinCE)", check="check_config", model_lr=True),
    "llm2slm": _builtin(
        "fedmkt", "LLM2SLMConfig", "LLM2SLM",
        "FedMKT baseline: the server LLM stays frozen and only teaches the client SLMs",
        check="check_config", model_lr=True),
    "fedcollm": _builtin(
        "fedcollm", "FedCoLLMConfig", "METHOD",
        "FedAvg of SLM LoRA adapters + server LLM/SLM mutual distillation on public data",
        check="check_config", aggregates=True),
    "fedkd": _builtin(
        "fedkd", "FedKDConfig", "METHOD",
        "local teachers + shared student by adaptive mutual distillation; SVD-compressed "
        "student updates", aggregates=True),
    "koala": _builtin(
        "koala", "KoalaConfig", "METHOD",
        "small models -> large model's adapter (reverse KD) -> small models (forward KD); "
        "homo or hete"),
    "fedsp": _builtin(
        "fedsp", "FedSPConfig", "METHOD",
        "soft prompts between the server LLM and clients' KD-initialised cut-and-shared "
        "auxiliary models", check="check_config", aggregates=True),
    "fedprompt": _builtin(
        "fedsp", "FedPromptConfig", "FEDPROMPT",
        "FedAvg of prefix prompts; clients hold the whole LLM (FedSP baseline)",
        check="check_config", aggregates=True),
    "fedprompt_single": _builtin(
        "fedsp", "FedPromptSingleConfig", "FEDPROMPT_SINGLE",
        "prompts trained on a 1-layer model without sharing, KD or alignment, repeated up / "
        "averaged down (FedSP baseline)", check="check_config", aggregates=True),
    "zero_shot": _builtin(
        "baselines", "ZeroShotConfig", "ZERO_SHOT", "evaluate models without training",
        model_lr=True),
    "standalone": _builtin(
        "baselines", "StandaloneConfig", "STANDALONE",
        "each client trains alone on its private data", model_lr=True),
    "centralized": _builtin(
        "baselines", "CentralizedConfig", "CENTRALIZED",
        "one model trained on all data pooled (upper bound)", check="check_centralized",
        model_lr=True),
    "standalone_encoder": _builtin(
        "baselines", "StandaloneEncoderConfig", "STANDALONE_ENCODER",
        "each client fine-tunes its own encoder classifier alone"),
    "centralized_encoder": _builtin(
        "baselines", "CentralizedEncoderConfig", "CENTRALIZED_ENCODER",
        "one encoder classifier on all data pooled (upper bound)", check="check_centralized"),
    "fedavg_encoder": _builtin(
        "baselines", "FedAvgEncoderConfig", "FEDAVG_ENCODER",
        "FedAvg of an encoder classifier, teacher or student size (FedKD's baselines)",
        aggregates=True),
    "fedavg_vision": _builtin(
        "baselines", "FedAvgVisionConfig", "FEDAVG_VISION",
        "FedAvg of an image classifier's head or whole model (KOALA's baseline)",
        aggregates=True),
}

_PLUGINS: dict[str, MethodEntry] = {}  # register_method: declared by a plugin
_REGISTRY: dict[str, Method] = {}  # register: a Method object (it takes precedence)
_REGISTERED_BY: dict[str, str] = {}  # name -> the module whose import registered it
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def _caller(depth: int) -> str:
    """The module ``depth`` frames up (the one that called a registration function)."""
    return str(sys._getframe(depth + 1).f_globals.get("__name__", "__main__"))


def register(method: Method, *, module: str | None = None) -> Method:
    """Make a ready method available under ``method.name`` (a plugin, a test's probe).

    ``module``: what a fresh process (a Flower client) imports to have it registered too;
    by default the module that called ``register`` (not the server's, which may be one
    of fedkt's: a plugin variant of ``FedMKTServer``).
    """
    _PLUGINS.pop(method.name, None)  # registering a name again replaces it
    _REGISTRY[method.name] = method
    _REGISTERED_BY[method.name] = module or _caller(1)
    return method


def register_method(name: str, *, config: str, method: str, summary: str,
                    check: str | None = None, aggregates: bool = False,
                    model_lr: bool = False, module: str | None = None) -> MethodEntry:
    """Declare method ``name`` from outside fedkt as :data:`BUILT_IN` declares fedkt's own:
    ``config``, ``method`` and ``check`` as ``"module:attribute"`` strings (nothing is
    imported now; a config that names it imports only ``config``'s module and ``check``'s).

    ``module``: what a fresh process imports to have it declared too; by default the
    module that called ``register_method``.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise ValueError(f"register_method: name {name!r} must be a letter then letters, "
                         "digits, '-' or '_' (it is method.name in a config)")
    if name in BUILT_IN:
        raise ValueError(f"register_method({name!r}): a built-in method has that name")
    for field, value in (("config", config), ("method", method), ("check", check)):
        if not (value is None and field == "check") and \
                not (isinstance(value, str) and _REFERENCE.fullmatch(value)):
            raise ValueError(f"register_method({name!r}): {field} must be a "
                             f"'module:attribute' string, got {value!r}")
    if not isinstance(summary, str) or not summary.strip():
        raise ValueError(f"register_method({name!r}): summary must be a non-empty line")
    declared = MethodEntry(config=config, method=method, summary=summary, check=check,
                           aggregates=bool(aggregates), model_lr=bool(model_lr))
    _REGISTRY.pop(name, None)  # registering a name again replaces it
    _PLUGINS[name] = declared
    _REGISTERED_BY[name] = module or _caller(1)
    return declared


def load(reference: str, what: str) -> Any:
    """The attribute a ``"module:attribute"`` string names; ``what`` says whose it is in
    the error when the module or the attribute is missing."""
    module, _, attribute = reference.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise
        raise ConfigError(f"{what}: module {module!r} of {reference!r} is not found") from exc
    if not hasattr(loaded, attribute):
        raise ConfigError(f"{what}: module {module!r} has no {attribute!r} ({reference!r})")
    return getattr(loaded, attribute)


def unknown_method(name: object) -> ConfigError:
    """The error for a ``method.name`` that no method is registered under."""
    return ConfigError(f"method.name: unknown method {name!r}; allowed: {', '.join(available())}")


def entry(name: object) -> MethodEntry | None:
    """Method ``name``'s declared entry (built in or a plugin's); None for a method
    registered as a :class:`Method` (:func:`register`, which takes precedence)."""
    if not isinstance(name, str) or name not in {*_REGISTRY, *_PLUGINS, *BUILT_IN}:
        raise unknown_method(name)
    if name in _REGISTRY:
        return None
    return _PLUGINS.get(name) or BUILT_IN[name]


def available() -> list[str]:
    """Every method's name, sorted."""
    return sorted({*BUILT_IN, *_PLUGINS, *_REGISTRY})


def summaries() -> dict[str, str]:
    """Every available method's one-line summary, by name (``fedkt list``, the config
    reference)."""
    return {name: declared.summary if (declared := entry(name)) else
            _REGISTRY[name].docs.summary for name in available()}


def method_config_class(name: str | None) -> type[MethodConfig]:
    """The config class of method ``name``; for a declared method only its config module
    is imported (``fedkt.methods.fedmkt.config``), not the method."""
    declared = entry(name)
    if declared is None:
        return _REGISTRY[str(name)].config
    config = load(declared.config, f"method {name!r}'s config")
    if not isinstance(config, type):
        raise ConfigError(f"method {name!r}'s config: {declared.config!r} is not a class")
    return config


def method_flag(name: str, flag: str) -> bool:
    """``Behaviour.<flag>`` (one of :data:`FLAGS`) of method ``name``, read from its entry
    (importing nothing), so that a config's cross-method checks (SecAgg, DP, a per-model
    ``lr``) import no algorithm and no torch."""
    if flag not in FLAGS:
        raise ValueError(f"flag: {flag!r} is not one of {', '.join(FLAGS)}")
    declared = entry(name)
    if declared is None:
        return bool(getattr(_REGISTRY[name].behaviour, flag))
    return bool(getattr(declared, flag))


def method_check(name: str) -> Callable[[Any], None] | None:
    """The method's ``check`` of a whole run config (``Behaviour.check``); for a declared
    method only the module that defines it is imported."""
    declared = entry(name)
    if declared is None:
        return _REGISTRY[name].behaviour.check
    if declared.check is None:
        return None
    return load(declared.check, f"method {name!r}'s check")


def plugin_module(name: str) -> str | None:
    """The module a fresh process must import to have ``name`` registered, when it is not
    one of fedkt's own (those are in :data:`BUILT_IN`)."""
    return None if name in BUILT_IN else _REGISTERED_BY.get(name)
