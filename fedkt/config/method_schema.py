"""The ``method`` section: :class:`MethodConfig`, the base of every method's config, and
the validation of ``method`` by the config class the named method registers."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from pydantic import Field, ValidationError, model_validator

from fedkt.config.base import _Strict
from fedkt.config.messages import _MethodErrors
from fedkt.errors import ConfigError
from fedkt.methods.registry import method_config_class

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


def _validate_method(method: str | dict[str, Any]) -> MethodConfig:
    if isinstance(method, str):
        method = {"name": method}
    if not isinstance(method, dict):
        raise ConfigError(f"method: expected a method name or a mapping with 'name', "
                          f"got {type(method).__name__}")
    if not isinstance(method.get("name"), str):
        raise ConfigError(f"method.name: expected a method name (a string), "
                          f"got {type(method.get('name')).__name__}")
    try:
        return method_config_class(method.get("name")).model_validate(method)
    except ValidationError as err:
        raise _MethodErrors(err) from None
