"""``fedkt configs explain KEY``: one config key's type, default, allowed values and
description, or a section's keys; an unknown key is an error naming the closest ones."""

from __future__ import annotations

import difflib
import textwrap

from fedkt.config.keys import Key, allowed_values, bounds, default_text, type_name, walk
from fedkt.config.method_catalog import available, method_config_class
from fedkt.config.method_schema import MethodConfig
from fedkt.errors import ConfigError

__all__ = ["explain", "find_key"]


def _yaml(value: object) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, str(value)) \
        if isinstance(value, bool | type(None)) else str(value)


def _keys(method: str | None) -> list[Key]:
    """Every key of a run config; under ``method.`` those of ``method``'s config class
    (only ``method.name`` without one)."""
    keys = list(walk())
    if method is not None:
        keys += list(walk(method_config_class(method), "method."))
    else:
        keys += list(walk(MethodConfig, "method."))
    return keys


def _normal(key: str) -> str:
    """``clients.models.0.name`` -> ``clients.models.name`` (a list's index is any entry)."""
    return ".".join(p for p in key.strip().split(".") if not p.isdigit())


def find_key(key: str, method: str | None = None) -> tuple[Key, list[Key]]:
    """The key and, for a section, the keys directly under it; a :class:`ConfigError`
    naming the closest valid keys when there is none."""
    wanted = _normal(key)
    keys = _keys(method)
    found = {k.key: k for k in keys}
    if wanted in found:
        under = [k for k in keys if k.key.startswith(f"{wanted}.")
                 and "." not in k.key[len(wanted) + 1:]]
        return found[wanted], under
    if wanted.startswith("method.") and method is None:
        having = [name for name in available()
                  if wanted.removeprefix("method.") in method_config_class(name).model_fields]
        hint = f"methods with it: {', '.join(having)}" if having else \
            f"no method has it; methods: {', '.join(available())}"
        raise ConfigError(f"{key}: method keys depend on the method; add --method NAME "
                          f"({hint})")
    names = list(found)
    close = difflib.get_close_matches(wanted, names, n=5, cutoff=0.6)
    last = wanted.rpartition(".")[2]
    close += [n for n in names if n.rpartition(".")[2] == last and n not in close]
    hint = f"closest: {', '.join(close[:6])}" if close else \
        f"sections: {', '.join(k.key for k in keys if k.section and '.' not in k.key)}"
    where = f" of method {method!r}" if method and wanted.startswith("method.") else ""
    raise ConfigError(f"{key}: unknown config key{where}; {hint}")


def _one_line(k: Key) -> str:
    kind = "section" if k.section is not None else type_name(k.annotation)
    limits = bounds(k.info)
    return f"{kind}{f' ({limits})' if limits else ''}, default {default_text(k.info)}"


def explain(key: str, method: str | None = None, width: int = 88) -> str:
    """The text ``fedkt configs explain KEY [--method NAME]`` prints."""
    k, under = find_key(key, method)
    wrap = lambda text, indent: textwrap.fill(  # noqa: E731
        text, width, initial_indent=indent, subsequent_indent=indent)
    lines = [k.key]
    if k.section is not None and k.key != "method":
        lines.append(f"  section ({type_name(k.annotation)}), default {default_text(k.info)}")
    elif k.section is None:
        lines.append(f"  type:     {type_name(k.annotation)}")
        if bounds(k.info):
            lines.append(f"  bounds:   {bounds(k.info)}")
        lines.append(f"  default:  {default_text(k.info)}")
        allowed = allowed_values(k.annotation)
        if k.key == "method.name" and method is None:
            allowed = available()
        if allowed:
            lines.append(f"  allowed:  {', '.join(_yaml(v) for v in allowed)}")
    lines += ["", wrap(k.description, "  ")]
    if k.key == "method" and method is None:
        lines += ["", wrap(f"Each method's keys: fedkt configs explain method --method NAME "
                           f"(NAME: {', '.join(available())}).", "  ")]
    if under:
        lines += ["", "  keys:"]
        for sub in under:
            lines += [f"    {sub.key}: {_one_line(sub)}", wrap(sub.description, "        ")]
    return "\n".join(lines)
