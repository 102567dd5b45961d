"""Class filters: ``"0-2"``, ``"3,4,5,6"``, ``[0, 1, 2]`` or ``3`` -> class indices.

Shared by image datasets' ``fields.classes``, text datasets' ``data.classes`` and
evaluation's ``eval.class_groups``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fedkt.data.dataset import DataError

__all__ = ["filter_classes", "parse_class_spec"]


def parse_class_spec(spec: int | str | Sequence[int], num_classes: int | None,
                     key: str = "fields.classes") -> list[int]:
    """Class indices, in the order given; a :class:`DataError` naming ``key`` unless they
    are distinct and in ``0..num_classes - 1`` (any index >= 0 when ``num_classes`` is None)."""
    out: list[int] = []
    if isinstance(spec, bool):
        raise DataError(f"{key}: expected class indices, got {spec!r}")
    if isinstance(spec, int):
        out = [spec]
    elif isinstance(spec, str):
        for part in spec.split(","):
            part = part.strip()
            m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
            try:
                out += list(range(int(m[1]), int(m[2]) + 1)) if m else [int(part)]
            except ValueError:
                raise DataError(f"{key}: expected class indices like '0-4' or '5,6,7', "
                                f"got {spec!r}") from None
    else:
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in spec):
            raise DataError(f"{key}: expected a list of class indices, got {spec!r}")
        out = list(spec)
    top = num_classes - 1 if num_classes is not None else None
    bad = [c for c in out if c < 0 or (top is not None and c > top)]
    if not out or bad or len(set(out)) != len(out):
        where = f"0..{top}" if top is not None else "0 and above"
        raise DataError(f"{key}: {spec!r} must name distinct classes in {where}"
                        + (f" (out of range: {bad})" if bad else ""))
    return out


def filter_classes(records: list[dict[str, Any]], classes: Sequence[int], key: str,
                   what: str) -> list[dict[str, Any]]:
    """The records whose ``label`` is in ``classes``, in order; a :class:`DataError` naming
    ``key`` if ``records`` (``what``: "the test set", ...) has none of them."""
    keep = set(classes)
    missing = [i for i, r in enumerate(records) if "label" not in r]
    if missing:
        raise DataError(f"{key}: {what} has records without a label (record {missing[0]}, "
                        f"id {records[missing[0]].get('id')!r}); only labelled records can be "
                        "filtered by class")
    out = [r for r in records if r["label"] in keep]
    if not out:
        present = sorted({r["label"] for r in records})
        raise DataError(f"{key}: {what} has no record of classes {sorted(keep)} "
                        f"({len(records)} records, of classes {present})")
    return out
