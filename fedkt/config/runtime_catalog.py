"""The runtime catalog: which runtimes exist, by name, and the settings model of each
one's config section, as a config reads them (importing no transport; the registry,
:mod:`fedkt.runtime.registry`, loads a runtime's code when a run starts).

A runtime's section is ``runtime.<section>`` (the name with ``-`` as ``_``:
``runtime.flower_sim``), validated by its model when the config loads
(:class:`fedkt.config.RuntimeConfig`).
"""

from __future__ import annotations

from pydantic import BaseModel

from fedkt.config.runtime_settings import FlowerSettings, FlowerSimSettings, LocalSettings

__all__ = ["BUILT_IN", "available_runtimes", "runtime_sections", "section_of",
           "unknown_runtime"]

# name -> the model of its section (None: no settings); register_runtime adds rows.
_SETTINGS: dict[str, type[BaseModel] | None] = {
    "local": LocalSettings,
    "flower-sim": FlowerSimSettings,
    "flower": FlowerSettings,
}
# The runtimes fedkt itself registers: their sections are in every resolved config.
BUILT_IN = tuple(_SETTINGS)


def section_of(name: str) -> str:
    """The config section of runtime ``name``'s settings: ``flower-sim`` -> ``flower_sim``."""
    return name.replace("-", "_")


def available_runtimes() -> list[str]:
    return sorted(_SETTINGS)


def runtime_sections() -> dict[str, tuple[str, type[BaseModel]]]:
    """Section -> (runtime name, its settings model), for every runtime with settings."""
    return {section_of(name): (name, settings) for name, settings in _SETTINGS.items()
            if settings is not None}


def unknown_runtime(name: object) -> str:
    """The error text for a ``runtime.name`` that no runtime is registered under."""
    return (f"unknown runtime {name!r}; registered: {', '.join(available_runtimes())} "
            "(register_runtime adds one)")
