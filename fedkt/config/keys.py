"""The config's keys as a flat list: each dotted key with its field, type, default, allowed
values and description (read from ``Field(description=...)``), for the reference and
``fedkt configs explain``."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from fedkt.config.method_schema import MethodConfig
from fedkt.config.runtime_catalog import available_runtimes
from fedkt.config.runtime_schema import RuntimeConfig, runtime_config_class
from fedkt.config.schema import RunConfig

__all__ = ["Key", "allowed_values", "bounds", "default_text", "section_model", "type_name",
           "walk"]


@dataclass(frozen=True)
class Key:
    """One key of the config tree: ``section`` when it holds keys of its own."""

    key: str
    info: FieldInfo
    annotation: Any
    section: type[BaseModel] | None = None

    @property
    def description(self) -> str:
        return self.info.description or ""


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field's annotation holds (``ModelConfig | None``, ``list[ModelConfig]``),
    if any; ``runtime`` is the class with the built-in runtimes' sections."""
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return runtime_config_class() if arg is RuntimeConfig else arg
    return None


def _annotation(key: str, info: FieldInfo) -> Any:
    if key == "runtime.name":  # a registered runtime: the built-in ones, or a plugin's
        return Literal[tuple(available_runtimes())]
    return info.annotation


def walk(model: type[BaseModel] = RunConfig, prefix: str = "") -> Iterator[Key]:
    """Every key under ``model``, depth first, a section before its keys; ``method`` is a
    section of :class:`MethodConfig`'s keys only (each method's own: walk its config)."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = section_model(info.annotation)
        if sub is not None and issubclass(sub, MethodConfig):
            yield Key(key, info, info.annotation, section=MethodConfig)
            continue
        yield Key(key, info, _annotation(key, info), section=sub)
        if sub is not None:
            yield from walk(sub, f"{key}.")


# The module paths a type's text drops: the config's own modules and the settings models.
_MODULE_PATH = re.compile(r"\bfedkt\.(?:config\.\w+|runtime\.settings|train\.pretrain)\.")


def type_name(annotation: Any) -> str:
    """A short type: ``float | None``, ``'lora' | 'prefix'``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a bounded type (fedkt.config.bounds): its bounds are shown apart
        return type_name(typing.get_args(annotation)[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    args = typing.get_args(annotation)
    if origin is not None and any(typing.get_origin(a) is typing.Annotated for a in args):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    return _MODULE_PATH.sub("", text)


_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
           (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
           (annotated_types.MinLen, "min_length", "length >="),
           (annotated_types.MaxLen, "max_length", "length <="))


def _metadata(info: FieldInfo) -> list[Any]:
    """The field's constraints, and those of a bounded type in its union (``Steps | None``)."""
    found = list(info.metadata)
    for arg in typing.get_args(info.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            found += [m for m in arg.__metadata__ if m not in found]
    return found


def bounds(info: FieldInfo) -> str:
    """The field's numeric or length bounds, e.g. ``> 0, <= 1``."""
    out = []
    for meta in _metadata(info):
        for kind, attr, sign in _BOUNDS:
            if isinstance(meta, kind):
                out.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(out)


def allowed_values(annotation: Any) -> list[Any] | None:
    """The values a field takes when they are finitely many (a Literal, a bool, or one
    of those or None), else None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is not Literal \
        else (annotation,)
    if not args:
        args = (annotation,)
    values: list[Any] = []
    for arg in args:
        if arg is type(None):
            values.append(None)
        elif typing.get_origin(arg) is Literal:
            values += typing.get_args(arg)
        elif arg is bool:
            values += [True, False]
        else:
            return None
    return values


def default_text(info: FieldInfo) -> str:
    """The default as YAML would spell it; ``required`` when there is none."""
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if isinstance(value, BaseModel):
        return "(its keys' defaults)"
    return repr(value)
