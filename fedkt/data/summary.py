"""What a run's data split holds: each side's classes and record counts (``fedkt data``).

:func:`split_summary` builds a run's data exactly as the run does
(:func:`fedkt.data.splits.client_splits`, ``data.require`` checked) and describes it:
the classes of the server's side and of the clients' side (index and name), the test,
public, server and private record counts, and the per-class counts of each side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from fedkt.config import RunConfig
from fedkt.data.dataset import DataError
from fedkt.data.splits import FederatedData, client_splits, run_fold, side_classes

__all__ = ["split_summary"]


def _classes(spec: Any, fd: FederatedData, key: str) -> list[int]:
    n = len(fd.label_names) if fd.label_names is not None else None
    if spec is None:
        return list(range(n)) if n is not None else []
    return side_classes(spec, n, key, fd.class_order)


def _spread(records: Sequence[dict[str, Any]], classes: Sequence[int]) -> str:
    """``min/median/max`` records per class over ``classes``."""
    counts = Counter(r["label"] for r in records if "label" in r)
    per = sorted(counts.get(c, 0) for c in classes)
    if not per:
        return "no classes"
    return f"per class min {per[0]}, median {per[len(per) // 2]}, max {per[-1]}"


def _in(records: Sequence[dict[str, Any]], classes: Sequence[int]) -> int:
    keep = set(classes)
    return sum(1 for r in records if r.get("label") in keep)


def split_summary(cfg: RunConfig, *, names: bool = True) -> str:
    """The summary of ``cfg``'s data at its seed (a :class:`~fedkt.data.splits.
    SplitCheckError` if a ``data.require`` precondition fails)."""
    data = cfg.data
    fd = client_splits(data, cfg.clients.num_clients, cfg.seed)
    if fd.task != "classification":
        raise DataError(f"fedkt data: describes classification splits; {fd.name!r} is a "
                        f"{fd.task} task")
    split = data.split
    fold = f" (fold {run_fold(split, cfg.seed)} of {split.folds})" if split.folds else ""
    lines = [f"seed {cfg.seed}{fold}: {fd.name}, {len(fd.label_names or [])} classes"
             + (", classes drawn for this fold (data.classes.draw)" if fd.class_order else "")]
    srv = _classes(data.classes.server, fd, "data.classes.server")
    cli = _classes(data.classes.private, fd, "data.classes.private")
    for side, classes in (("server side", srv), ("clients side", cli)):
        lines.append(f"  {side}: {len(classes)} classes")
        if names:
            labels = fd.label_names or []
            lines.append("    " + ", ".join(f"{c} {labels[c]}" for c in sorted(classes)))
    pooled = [r for p in fd.private for r in p]
    lines.append(f"  test: {len(fd.test)} records ({_in(fd.test, srv)} of the server's "
                 f"classes, {_in(fd.test, cli)} of the clients'), "
                 f"{len({r['label'] for r in fd.test})} classes")
    ids = {r.get("id") for r in fd.public}
    shared = len(ids & {r.get("id") for r in pooled + fd.test + fd.server})
    lines.append(f"  public: {len(fd.public)} records"
                 + ("" if fd.public_labels else ", without labels")
                 + (f", {shared} of them also private, server or test records" if shared
                    else ", none of them a private, server or test record"))
    lines.append(f"  server: {len(fd.server)} records, {_spread(fd.server, srv)}")
    lines.append(f"  clients: {' + '.join(str(len(p)) for p in fd.private)} records, "
                 f"together {_spread(pooled, cli)}")
    req = data.require
    checks = [k for k in ("disjoint", "min_test", "min_public", "min_per_class")
              if getattr(req, k)]
    if checks:
        lines.append("  data.require: " + ", ".join(
            f"{k} {getattr(req, k)}" if k != "disjoint" else k for k in checks) + ": met")
    return "\n".join(lines)
