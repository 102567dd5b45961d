"""Per-group metrics: ``accuracy_<name>`` over the test items whose gold class is in a group.

``eval.class_groups: {srv: "0-2", cli: "3-6"}`` makes every classification and
multiple-choice evaluation (the LLM scorer, the encoder classifier) also report
``accuracy_srv`` and ``accuracy_cli``, and write the groups into its per-example
predictions' ``meta["class_groups"]``, from which the suites compute the same metric
(the paired bootstrap restricted to the group's items; :mod:`fedkt.evidence.stats`).
A group without any test item is not reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedkt.data.classes import parse_class_spec
from fedkt.eval.metrics import accuracy

__all__ = ["GROUP_PREFIX", "group_accuracies", "group_metric", "resolve_groups"]

GROUP_PREFIX = "accuracy_"


def resolve_groups(groups: Mapping[str, Any] | None, num_classes: int | None,
                   key: str = "eval.class_groups") -> dict[str, list[int]]:
    """``{name: spec}`` -> ``{name: [class, ...]}``; a ``DataError`` naming
    ``eval.class_groups.<name>`` for a class outside ``0..num_classes - 1``."""
    return {name: parse_class_spec(spec, num_classes, f"{key}.{name}")
            for name, spec in (groups or {}).items()}


def group_accuracies(preds: Sequence[int], golds: Sequence[int],
                     groups: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """``{"accuracy_<name>": accuracy over the items whose gold is in the group}``, for
    each group with at least one item."""
    out = {}
    for name, classes in groups.items():
        keep = set(classes)
        idx = [i for i, g in enumerate(golds) if g in keep]
        if idx:
            out[GROUP_PREFIX + name] = accuracy([preds[i] for i in idx], [golds[i] for i in idx])
    return out


def group_metric(metric: str, groups: Mapping[str, Sequence[int]] | None
                 ) -> tuple[str, list[int]] | None:
    """``("srv", classes)`` when ``metric`` is ``accuracy_srv`` of a declared group."""
    if not groups or not metric.startswith(GROUP_PREFIX):
        return None
    name = metric[len(GROUP_PREFIX):]
    return (name, list(groups[name])) if name in groups else None
