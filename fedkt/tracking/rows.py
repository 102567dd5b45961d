"""Metrics rows: what a key means, reading ``metrics.jsonl``, and a run's totals.

A metrics row is a flat dict such as ``{"round": 3, "participant": "client_0",
"split": "train", "loss": 1.2, "bytes_sent": 1024, "bytes_received": 2048,
"wall_time": 3.5, "compute_time": 3.1, "compute_cpu": 3.0}``; any other numeric key is
a metric.  ``wall_time`` is the seconds the participant spent on that row's work;
``compute_time`` is that without evaluation (and, for the server, without waiting for
clients), ``compute_cpu`` the same in CPU seconds of its process (fedkt.eval.timing);
bytes are counted per row.  ``loss`` on the server's train row is the mean of the
clients' training losses of that round, for every method (docs/evaluation.md).
MB means 10**6 bytes.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "MB", "NON_METRIC_KEYS", "PREFERRED_METRICS", "TIMING_KEYS", "best_round", "is_eval",
    "is_number", "is_timing", "last_value", "lower_is_better", "main_metric", "mean_breakdown",
    "metric_keys", "participant_order", "plain", "read_rows", "run_wall_time",
    "time_breakdown", "total", "without_timings",
]

# Keys that measure time: they differ between two runs of the same seed and config (and so
# does any metric named ``*_seconds``, e.g. FedKD's step and SVD times; see without_timings).
TIMING_KEYS = frozenset({"wall_time", "compute_time", "compute_cpu"})
# Numeric keys that are bookkeeping, not metrics.
NON_METRIC_KEYS = frozenset({
    "round", "participant", "split", "loss", "bytes_sent", "bytes_received",
    "clients_replied", "excluded", "time", "step", "steps", "epoch", "num_examples",
    "eval_bytes",
}) | TIMING_KEYS
# Metrics shown first (and chosen as "main" metric) in this order; higher is better.
PREFERRED_METRICS = ("accuracy", "accuracy_norm", "rougeL", "f1", "macro_f1", "precision",
                     "recall")
MB = 1e6


def is_timing(key: str) -> bool:
    """Whether a metrics key measures time (it differs between identical runs)."""
    return key in TIMING_KEYS or key.endswith("_seconds")


def without_timings(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without their timing keys: what two runs of one seed and config share."""
    return [{k: v for k, v in row.items() if not is_timing(k)} for row in rows]


def is_number(value: Any) -> bool:
    """A number that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def plain(value: Any) -> Any:
    """JSON-friendly value: tensors / numpy scalars become Python numbers."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, Path):
        return str(value)
    return value


def participant_order(names: Iterable[str]) -> list[str]:
    """``server`` first, then other server-side models (``global_slm``) by name, then
    ``client_<n>`` by n."""
    def key(name: str) -> tuple[int, int, str]:
        if name == "server":
            return (0, 0, name)
        m = re.fullmatch(r"client_(\d+)", name)
        return (2, int(m.group(1)), name) if m else (1, 0, name)

    return sorted(set(names), key=key)


def is_eval(row: dict[str, Any]) -> bool:
    """Evaluation rows are those whose split is not ``train``."""
    return row.get("split", "test") != "train"


def metric_keys(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Metric keys of evaluation rows: preferred ones first, then the rest by name.

    Timings (:func:`is_timing`: ``eval_seconds``, ``comm_seconds``, ...) are not metrics:
    they differ between identical runs and have their own table (summary.md) and plot."""
    found = {k for row in rows if is_eval(row) for k, v in row.items()
             if is_number(v) and k not in NON_METRIC_KEYS and not is_timing(k)}
    return [k for k in PREFERRED_METRICS if k in found] + sorted(found - set(PREFERRED_METRICS))


def main_metric(rows: Iterable[dict[str, Any]]) -> str:
    """The metric a run is judged by: the first of :func:`metric_keys`, else ``loss``."""
    keys = metric_keys(rows)
    return keys[0] if keys else "loss"


def lower_is_better(metric: str) -> bool:
    """Losses and perplexity: lower is better."""
    return metric.endswith("loss") or metric in ("perplexity", "ppl")



def last_value(rows: Iterable[dict[str, Any]], key: str, *, train: bool) -> Any:
    """The last numeric ``key`` of the train rows (``train``) or of the evaluation rows."""
    value = None
    for row in rows:
        if is_eval(row) != train and is_number(row.get(key)):
            value = row[key]
    return value


def total(rows: Iterable[dict[str, Any]], key: str) -> float | None:
    """The sum of the rows' numeric ``key`` (None when no row has one)."""
    values = [row[key] for row in rows if is_number(row.get(key))]
    return sum(values) if values else None


def best_round(rows: Iterable[dict[str, Any]], metric: str) -> tuple[int, float] | None:
    """``(round, value)`` where ``metric`` of evaluation rows was best (first on ties)."""
    best: tuple[int, float] | None = None
    low = lower_is_better(metric)
    for row in rows:
        value = row.get(metric)
        if not (is_eval(row) and is_number(value) and is_number(row.get("round"))):
            continue
        if best is None or (value < best[1] if low else value > best[1]):
            best = (int(row["round"]), float(value))
    return best


# --------------------------------------------------------------------------- recorder


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Parse a metrics.jsonl file; a truncated last line is skipped with a warning, bytes
    that are not UTF-8 are a ``ValueError`` naming the file and line."""
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path} line {line}: not UTF-8 ({exc.reason} at byte {exc.start}); "
                         "fedkt writes this file as UTF-8, so it was damaged or changed") from None
    rows = []
    for i, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            if i == len(lines):
                warnings.warn(f"{path}: skipping a half-written last line", stacklevel=2)
                continue
            raise ValueError(f"{path}:{i}: not a JSON object: {text[:80]!r}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i}: not a JSON object: {text[:80]!r}")
        rows.append(row)
    return rows


def run_wall_time(rows: Sequence[dict[str, Any]]) -> float | None:
    """Seconds the run took: the server's summed ``wall_time``.

    Without server rows: per round, the longest participant's ``wall_time``,
    summed over rounds.
    """
    server = total([r for r in rows if r.get("participant") == "server"], "wall_time")
    if server is not None:
        return float(server)
    per_round: dict[Any, float] = {}
    for r in rows:
        if is_number(r.get("wall_time")):
            key = r.get("round")
            per_round[key] = max(per_round.get(key, 0.0), float(r["wall_time"]))
    return sum(per_round.values()) if per_round else None


def time_breakdown(rows: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """Where a run's time went: ``wall`` (:func:`run_wall_time`), the seconds of each
    phase of :mod:`fedkt.infra.timing` summed over every participant's rows (``<phase>_seconds``),
    and ``other``: the wall time no phase covers (0 when the phases add up to more, as
    clients working in parallel on other machines can); ``saved``: the seconds reused
    results spared (``<phase>_saved_seconds``, :mod:`fedkt.eval.reuse`; not in the wall time).
    None without a wall time."""
    from fedkt.infra.timing import PHASES, SAVED

    wall = run_wall_time(rows)
    if wall is None:
        return None
    out = {"wall": wall}
    for name in (*PHASES, *SAVED):
        out[name] = sum(float(r[f"{name}_seconds"]) for r in rows
                        if is_number(r.get(f"{name}_seconds")))
    out["other"] = max(0.0, wall - sum(out[name] for name in PHASES))
    out["saved"] = sum(out.pop(name) for name in SAVED)
    return out


def mean_breakdown(runs: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """The mean of several runs' :func:`time_breakdown` (those that have one)."""
    total = sum_breakdown(runs)
    have = sum(r is not None for r in runs)
    return None if total is None else {k: v / have for k, v in total.items()}


def sum_breakdown(runs: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """The sum of several runs' :func:`time_breakdown` (those that have one): where a
    suite's run time went, all its runs together."""
    have = [r for r in runs if r is not None]
    if not have:
        return None
    return {k: sum(r[k] for r in have) for k in have[0]}
