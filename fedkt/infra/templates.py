"""Prompt templates are data: bounded, and with no lookups into Python objects.

A template (``data.dataset.template``) is a :meth:`str.format` string whose placeholders
name record fields (``{text}``, ``{prompt}``).  Because ``str.format`` can also read
attributes and items (``{text.__class__.__mro__}``, ``{label[0]}``) and pad a value to
any width (``{text:>300000000}`` builds a 300 MB string per record, or aborts the
process), :func:`check_template` allows only plain field names, the ``!s`` / ``!r``
conversions and a format spec whose width and precision are at most ``max_width``.
Templates reach clients inside the server's config, so a client checks them too
(:func:`fedkt.data.formatting.format_prompt`, against :data:`HARD_MAX_WIDTH`).
"""

from __future__ import annotations

import re
import string
from functools import lru_cache

__all__ = ["HARD_MAX_WIDTH", "check_template"]

# No template formats a field wider than this, whatever the config says.
HARD_MAX_WIDTH = 100_000
# [[fill]align][sign][z][#][0][width][grouping][.precision][type] (the format-spec mini-language)
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d+)?[_,]?(?:\.(?P<precision>\d+))?"
                   r"[bcdeEfFgGnosxX%]?", re.DOTALL)


@lru_cache(maxsize=256)
def check_template(template: str, max_width: int = HARD_MAX_WIDTH) -> None:
    """Raise ``ValueError`` (saying what is wrong) unless ``template`` is a safe template."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"template {template[:60]!r} is malformed: {exc}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(
                f"template placeholder {{{name[:40]}}}: only plain field names are allowed "
                "(e.g. {text}); no attribute or index lookups, no positional fields")
        if conversion not in (None, "s", "r"):
            raise ValueError(f"template placeholder {{{name}!{conversion}}}: the conversion "
                             "must be !s or !r")
        if not spec:
            continue
        match = _SPEC.fullmatch(spec)
        if "{" in spec or match is None:
            raise ValueError(f"template placeholder {{{name}:{spec[:40]}}}: not a plain format "
                             "spec (no nested fields)")
        for part in ("width", "precision"):
            value = match.group(part)
            if value is not None and (len(value) > 9 or int(value) > max_width):
                which = ("fedkt's hard limit" if max_width == HARD_MAX_WIDTH
                         else "data.template_max_width")
                raise ValueError(f"template placeholder {{{name}:{spec[:40]}}}: {part} "
                                 f"{value[:20]} is above the limit {max_width} ({which})")
