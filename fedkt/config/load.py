"""Reading a run config: YAML file, ``--set KEY=VALUE`` overrides, validation into a
:class:`~fedkt.config.schema.RunConfig` with errors that name the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fedkt.config.bounded_yaml import YamlLimitError, load_yaml
from fedkt.config.messages import _format_error, _MethodErrors, _short
from fedkt.config.schema import RunConfig, _validate_method
from fedkt.errors import ConfigError


def read_yaml(text: str, source: str) -> Any:
    """YAML text as data, within :mod:`fedkt.config.bounded_yaml`'s bounds (aliases, nesting,
    duplicate keys); a :class:`ConfigError` that starts with ``source`` beyond them."""
    try:
        return load_yaml(text)
    except YamlLimitError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = [p.strip() for p in dotted.split(".")]  # "training . lr" is training.lr
    if not all(parts):
        raise ConfigError(f"override {dotted!r}: empty key part; use dotted keys like training.lr")
    for i, part in enumerate(parts):
        if isinstance(node, list) and not (
                part.isascii() and part.isdigit() and int(part) < len(node)):
            raise ConfigError(f"override {dotted!r}: {'.'.join(parts[:i])!r} is a list of "
                              f"{len(node)}; {part!r} is not an index 0..{len(node) - 1}")
        if i == len(parts) - 1:
            break
        key: str | int = int(part) if isinstance(node, list) else part
        nxt = node[key] if isinstance(node, list) else node.get(key)
        if nxt is None:
            nxt = node[key] = {}
        if not isinstance(nxt, dict | list):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
        node = nxt
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a raw config dict."""
    if not isinstance(data, dict):
        raise ConfigError("the config's top level must be a mapping to apply overrides to")
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. rounds=5")
        key, raw = item.split("=", 1)
        if not key.strip():
            raise ConfigError(f"override {_short(item)}: no key before '='; expected KEY=VALUE")
        try:
            value = read_yaml(raw, f"override {key.strip()}")
        except ConfigError:
            raise
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. an int of 5000 digits
            raise ConfigError(f"override {key}: value {_short(raw)} is not valid YAML") from exc
        _set_dotted(data, key.strip(), value)
    return data


def parse_config(data: dict[str, Any], source: str = "<dict>", *,
                 check_installed: bool = True) -> RunConfig:
    """Validate a raw dict into a :class:`RunConfig`, with errors naming the key.

    ``check_installed=False`` (a client reading the server's config) skips the check that
    the server-side extras it names (``tracking``) are installed here.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping")
    if "method" not in data:
        raise ConfigError(f"invalid config {source}:\n  method: missing (e.g. method: fedavg)")
    try:
        data = {**data, "method": _validate_method(data["method"])}
        return RunConfig.model_validate(data, context={"check_installed": check_installed})
    except _MethodErrors as exc:
        raise ConfigError(_format_error(exc.err, source, prefix="method.")) from None
    except ConfigError as exc:
        raise ConfigError(f"invalid config {source}:\n  {exc}") from None
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config, apply CLI overrides and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = read_yaml(path.read_text(encoding="utf-8"), f"config file {path}") or {}
    except ConfigError:
        raise
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: {exc.reason} at byte "
                          f"{exc.start}") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. an int of 5000 digits
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if isinstance(data, dict) and "arms" in data and "base" in data:
        raise ConfigError(f"{path} is a suite (arms x seeds), not a run config: run it with "
                          f"`fedkt suite run {path}`")
    if overrides and isinstance(data, dict):  # else parse_config names the file and problem
        data = apply_overrides(data, overrides)
    return parse_config(data, str(path))

