"""Errors a user's input causes; each message names the key, file or client at fault."""

from __future__ import annotations

import contextlib

__all__ = ["CheckpointError", "ConfigError", "NonFiniteError", "short_repr"]


class ConfigError(ValueError):
    """A configuration value is missing or not allowed; the message names the key."""


class CheckpointError(ValueError):
    """A run folder cannot be resumed as it is; the message names the file at fault.

    Raised before anything in the folder is changed."""


class NonFiniteError(ValueError):
    """A training step's loss, or the weights it left, is NaN or infinite; the message names
    the training (participant and phase), the step and the loss. Raised before the
    non-finite weights are used or written."""


class _Full(Exception):
    """:func:`short_repr` has written its limit."""


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters, ending in
    ``...`` when cut.  Containers, strings and integers are written only as far as the
    limit, so a huge or shared structure (a YAML alias bomb) costs no more than the
    limit; an integer of more than 1,000 bits is shown by its size."""
    parts: list[str] = []
    left = [limit + 1]

    def put(text: str) -> None:
        parts.append(text[: left[0]])
        left[0] -= len(text)
        if left[0] <= 0:
            raise _Full

    def walk(item: object) -> None:
        if isinstance(item, dict):
            put("{")
            for i, (key, val) in enumerate(item.items()):
                put(", " if i else "")
                walk(key)
                put(": ")
                walk(val)
            put("}")
        elif isinstance(item, list | tuple | set | frozenset):
            ends = {list: "[]", tuple: "()"}.get(type(item), "{}")
            put(ends[0] if ends != "{}" or item else f"{type(item).__name__}(")
            for i, val in enumerate(item):
                put(", " if i else "")
                walk(val)
            put("," if type(item) is tuple and len(item) == 1 else "")
            put(ends[1] if ends != "{}" or item else ")")
        elif isinstance(item, str | bytes):
            put(repr(item[: left[0]]))
        elif isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 1000:
            put(f"<int of {item.bit_length()} bits>")
        else:
            try:
                put(repr(item))
            except ValueError:  # an object whose repr refuses (a huge int subclass)
                put(f"<{type(item).__name__} too long to show>")

    with contextlib.suppress(_Full):
        walk(value)
    text = "".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."
