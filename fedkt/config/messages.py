"""The text of config errors: one line per bad key, naming the dotted key and what is
allowed there."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from fedkt.errors import short_repr


class _MethodErrors(ValueError):
    def __init__(self, err: ValidationError) -> None:
        # Not str(err): pydantic's text holds a repr of each bad input, whole.
        super().__init__(f"{err.error_count()} errors in the method's config")
        self.err = err


def _format_error(err: ValidationError, source: str, prefix: str = "") -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = prefix + ".".join(str(p) or "''" for p in e["loc"]
                                if not str(p).startswith("function-"))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check spelling; see `fedkt run --help` and configs/)"
        elif e["type"] == "literal_error":
            msg = f"not allowed; {msg[0].lower()}{msg[1:]}"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            named, sep, rest = msg.partition(": ")  # a cross-field check naming its key
            if sep and named.replace(".", "").replace("_", "").isalnum():
                key, msg = _join(key, named, prefix), rest
        key = key.rstrip(".")
        given = e.get("input")
        shown = "" if isinstance(given, dict) or e["type"] == "missing" else f" (got {_short(given)})"
        lines.append(f"  {key or '<top>'}: {msg}{shown}")
    return "\n".join(lines)


def _join(key: str, named: str, prefix: str) -> str:
    """The key a check's message names, below the key its error sits at: once and whole,
    whether the message names it from the top (``method.receiving.take``), from the
    section's level (``receiving.take`` below ``method``) or from its own (``take``)."""
    base = key.rstrip(".")
    if not base:
        return named
    if named == base or named.startswith(base + "."):
        return named  # named from the top already
    if prefix and named.startswith(prefix):
        return named
    return f"{base}.{named}"


def _short(value: Any, limit: int = 80) -> str:
    """``repr`` for error messages, cut to ``limit`` characters; only as much of a value
    is written as the limit shows (:func:`fedkt.errors.short_repr`)."""
    return short_repr(value, limit)
