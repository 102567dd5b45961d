"""The ``method`` section: :class:`MethodConfig`, the base of every method's config (a
method's ``config.py`` builds on it; :mod:`fedkt.config.schema` validates ``method`` by
the config class the named method declares)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from pydantic import Field, model_validator

from fedkt.config.base import _Strict

__all__ = ["MethodConfig"]


class MethodConfig(_Strict):
    """Base of every method's hyper-parameters; ``name`` selects the method."""

    name: str = Field(description=(
        "The method that runs (`fedkt list` shows the registered ones); the other method.* keys "
        "are its hyper-parameters."))
    # Settings that were renamed, old key -> new key: a config with the old key still
    # loads, with a FutureWarning naming the new one (docs/architecture.md, vocabulary).
    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        for old, new in cls.renamed.items():
            if old not in values:
                continue
            if new in values:
                raise ValueError(f"{old}: it was renamed {new}, which is also given; "
                                 f"keep only {new}")
            warnings.warn(f"method.{old} is now method.{new}", FutureWarning, stacklevel=1)
            values = {k if k != old else new: v for k, v in values.items()}
        return values
