"""Deprecated: the bounded YAML loader is :mod:`fedkt.config.bounded_yaml`; this module
re-exports it and warns on import."""

from __future__ import annotations

import warnings

from fedkt.config.bounded_yaml import MAX_DEPTH, MAX_EXPANDED, YamlLimitError, load_yaml

__all__ = ["MAX_DEPTH", "MAX_EXPANDED", "YamlLimitError", "load_yaml"]

warnings.warn("fedkt.bounded_yaml is now fedkt.config.bounded_yaml; import it from there",
              DeprecationWarning, stacklevel=2)
