"""The ``runtime`` section: the transport's common settings, the reply limits, and
:func:`runtime_config_class`, which adds the registered runtimes' own sections."""

from __future__ import annotations

import functools
import warnings
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from fedkt.config.base import _Strict
from fedkt.config.model_schema import _check_device
from fedkt.config.runtime_catalog import (
    BUILT_IN,
    available_runtimes,
    runtime_sections,
    unknown_runtime,
)
from fedkt.errors import ConfigError

__all__ = ["ReplyLimits", "RuntimeConfig", "runtime_config_class"]


# The built-in runtimes' sections (runtime.flower_sim, runtime.flower) are their settings
# models, registered with their runtimes (fedkt.runtime.registry); the flat keys of before
# the sections (runtime.client_cpus, ...) move into these.
_MOVED_SECTIONS = ("flower_sim", "flower")


class ReplyLimits(_Strict):
    """Bounds on what one client may send back (``runtime.limits``); a reply over a bound
    excludes that client with the bound's key in its reason (docs/security.md)."""

    reply_bytes: int = Field(2**30, ge=1024, le=2**40, description=(
        "Largest reply in bytes, as serialised (tensors included)."))
    predictions_bytes: int = Field(2**24, ge=1024, le=2**40, description=(
        "Largest decompressed size of a reply's per-example predictions (``_predictions``); a "
        "larger table is dropped with a warning (a gzip bomb stops here)."))
    num_examples: int = Field(10**7, ge=1, le=10**12, description=(
        "Largest ``num_examples`` a client may report (its weight in example-weighted means)."))
    metrics: int = Field(256, ge=1, le=65536, description=(
        "Most metrics (``metrics`` and ``*_seconds`` timings together) in one reply."))
    norm_ratio: float = Field(1000.0, gt=1, le=1e12, description=(
        "An aggregated upload (adapter, update, prompts) whose L2 norm is more than this many "
        "times the median of the round's uploads excludes its client (a finite but huge "
        "upload would poison the mean); not checkable under secure aggregation."))


class RuntimeConfig(_Strict):
    """Transport: ``name`` is a registered runtime (``local``, ``flower-sim``, ``flower``,
    or one :func:`~fedkt.runtime.registry.register_runtime` adds).

    ``timeout``, ``torch_threads`` and ``device`` apply to every transport; a runtime's own
    settings are its section, ``runtime.<name with - as _>`` (``flower_sim``, ``flower``),
    validated by the model it registered.  A config's ``runtime`` is an instance of
    :func:`runtime_config_class`: this class with those sections as fields.
    """

    name: str = Field("local", description=(
        "The runtime that runs the job (fedkt.runtime.registry)."))
    timeout: float = Field(3600.0, gt=0, le=30 * 86400, description=(
        "Seconds to wait for a client's reply before excluding it (local runtime: from when "
        "the client starts; a worker past it is killed, a client in this process interrupted: "
        "docs/deployment.md)."))
    torch_threads: int | None = Field(None, ge=1, le=1024, description=(
        "torch intra-op threads for client and server work (None: one per physical core, or "
        "$OMP_NUM_THREADS when set)."))
    device: str = Field("auto", description=(
        "Where the server's work runs: auto (a CUDA GPU if there is one, else the CPU), cpu, cuda "
        "or cuda:N."))
    client_devices: list[str] | None = Field(None, min_length=1, description=(
        "local runtime: client k runs on client_devices[k % len] (round-robin over GPUs, e.g. "
        "[cuda:1, cuda:2]); None: runtime.device. A client model's own `device` wins."))
    limits: ReplyLimits = Field(default_factory=ReplyLimits, description=(
        "What a client's reply may hold at most (server side)."))
    aggregation: Literal["mean", "median"] = Field("mean", description=(
        "How the server combines the clients' uploads (adapters, updates, prompts) after the "
        "norm check (runtime.limits.norm_ratio). mean: FedAvg, weighted as the method says. "
        "median: the coordinate-wise median, unweighted, which no single client can move "
        "far (robust to a minority of poisoned uploads; not with secure_aggregation)."))
    # The runtimes' sections this class holds: section -> runtime name.
    sections: ClassVar[dict[str, str]] = {}

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in available_runtimes():
            raise ValueError(unknown_runtime(value))
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by value: a class made by :func:`runtime_config_class` has no import path."""
        return _runtime_from_dump, (self.model_dump(), type(self) is RuntimeConfig)

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        return _check_device(value) or value

    @field_validator("client_devices")
    @classmethod
    def _client_device_names(cls, value: list[str] | None) -> list[str] | None:
        for i, name in enumerate(value or []):
            _check_device(name, f"entry {i}: ")
        return value

    @model_validator(mode="after")
    def _client_devices_local(self) -> RuntimeConfig:
        if self.client_devices and self.name != "local":
            raise ValueError(f"client_devices: only the local runtime places clients itself; "
                             f"{self.name} runs each client in its own process (flower-sim: "
                             "runtime.flower_sim.client_gpus; flower: each SuperNode's "
                             "runtime.device)")
        return self

    @model_validator(mode="after")
    def _local_settings_elsewhere(self) -> RuntimeConfig:
        """``runtime.local.*`` set for another runtime: a warning naming the keys (not an
        error: a config written for ``local``, like the demo, is run on another runtime with
        ``--set runtime.name=...``, where those keys are simply not used)."""
        local = getattr(self, "local", None)
        given = sorted(local.model_fields_set) if isinstance(local, BaseModel) else []
        if self.name != "local" and given:
            keys = ", ".join(f"runtime.local.{k}" for k in given)
            warnings.warn(f"{keys}: only the local runtime reads {'it' if len(given) == 1 else 'them'}; "
                          f"ignored under runtime.name {self.name}", UserWarning, stacklevel=1)
        return self

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, values: Any) -> Any:
        """The flat keys of before the sections (``runtime.client_cpus``, ...) still work:
        each moves into its section, with a FutureWarning naming the new key."""
        if not isinstance(values, dict):
            return values
        models = {section: model for section, (_, model) in runtime_sections().items()
                  if section in _MOVED_SECTIONS and section in cls.model_fields}
        moved = {key: section for key in values if key not in cls.model_fields
                 for section, model in models.items() if key in model.model_fields}
        if not moved:
            return values
        values = dict(values)
        for key, section in moved.items():
            given = values.get(section)
            if isinstance(given, BaseModel):
                given = given.model_dump(exclude_unset=True)
            if given is None:
                given = {}
            elif not isinstance(given, dict):
                continue  # the section itself is invalid; validation names it
            new = f"runtime.{section}.{key}"
            if key in given:
                raise ValueError(f"{section}.{key}: given twice, as runtime.{key} (the old "
                                 f"key) and as {new}; keep only {new}")
            warnings.warn(f"runtime.{key} is now {new}", FutureWarning, stacklevel=1)
            values[section] = {**given, key: values.pop(key)}
        return values


def _doc(model: type[BaseModel]) -> str:
    """A settings model's description: the first paragraph of its docstring."""
    text = (model.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(text.split()) or f"The settings of {model.__name__}."


@functools.cache
def _runtime_class(sections: tuple[tuple[str, str, type[BaseModel]], ...]
                   ) -> type[RuntimeConfig]:
    if not sections:
        return RuntimeConfig
    taken = [s for s, _, _ in sections if s in RuntimeConfig.model_fields]
    if taken:
        raise ConfigError(f"runtime.{taken[0]}: a runtime's settings section may not be named "
                          "as a key every runtime has; rename the runtime")
    cls = create_model(
        "RuntimeConfig", __base__=RuntimeConfig, __module__=__name__,
        **{section: (model, Field(default_factory=model, description=_doc(model)))
           for section, _, model in sections})
    cls.sections = {section: name for section, name, _ in sections}
    return cls


def runtime_config_class(values: dict[str, Any] | None = None) -> type[RuntimeConfig]:
    """:class:`RuntimeConfig` with the sections of the runtimes registered now: every
    built-in runtime's, and that of the runtime ``values`` names or whose section it gives
    (so a config that does not use a plugin runtime never carries its section)."""
    values = values or {}
    wanted = {section for section, (name, _) in runtime_sections().items()
              if name in BUILT_IN or name == values.get("name") or section in values}
    return _runtime_class(tuple((section, name, model) for section, (name, model)
                                in runtime_sections().items() if section in wanted))


def _runtime_from_dump(data: dict[str, Any], plain: bool) -> RuntimeConfig:
    cls = RuntimeConfig if plain else runtime_config_class(data)
    return cls.model_validate(data)
