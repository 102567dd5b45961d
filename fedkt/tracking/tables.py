"""Console tables: fixed-width or markdown tables, a round's table, time breakdowns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fedkt.tracking.rows import (
    MB,
    is_eval,
    is_number,
    last_value,
    metric_keys,
    participant_order,
    total,
)

__all__ = ["breakdown_table", "fmt", "fmt_mb", "fmt_seconds", "format_table", "round_table"]


def fmt(value: Any) -> str:
    """A table cell: floats to 4 decimals, ``-`` for None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4f}"
    return str(value)


def fmt_mb(value: float | None) -> str:
    """Bytes as MB (10**6 bytes), 3 decimals; ``-`` when unknown."""
    return "-" if value is None else f"{value / MB:.3f}"


def fmt_seconds(value: float | None) -> str:
    """Seconds, 1 decimal; ``-`` when unknown."""
    return "-" if value is None else f"{value:.1f}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *,
                 markdown: bool = False) -> str:
    """A fixed-width text table (first column left-aligned) or a markdown table."""
    cells = [[fmt(v) if not isinstance(v, str) else v for v in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

    return "\n".join([line(header)] + [line(r) for r in cells])



def round_table(rows: Sequence[dict[str, Any]], round: int) -> str:
    """Fixed-width table of one round of ``rows``: one line per participant."""
    rows = [r for r in rows if r.get("round") == round]
    if not rows:
        return f"round {round}: no metrics"
    keys = metric_keys(rows)
    has_train_loss = any(not is_eval(r) and is_number(r.get("loss")) for r in rows)
    has_test_loss = any(is_eval(r) and is_number(r.get("loss")) for r in rows)
    header = ["participant"]
    header += ["train loss"] if has_train_loss else []
    header += ["test loss"] if has_test_loss else []
    header += keys
    header += ["MB sent", "MB recv", "time (s)"]
    table = []
    for name in participant_order(r.get("participant", "?") for r in rows):
        mine = [r for r in rows if r.get("participant", "?") == name]
        line: list[Any] = [name]
        if has_train_loss:
            line.append(last_value(mine, "loss", train=True))
        if has_test_loss:
            line.append(last_value(mine, "loss", train=False))
        line += [last_value(mine, k, train=False) for k in keys]
        line += [fmt_mb(total(mine, "bytes_sent")), fmt_mb(total(mine, "bytes_received")),
                 fmt_seconds(total(mine, "wall_time"))]
        table.append(line)
    return f"round {round}\n" + format_table(header, table)


def breakdown_table(named: Sequence[tuple[str, dict[str, float] | None]]) -> str:
    """A markdown table of :func:`time_breakdown` results: seconds and share of the wall
    time per phase, one line per name, and the seconds reused results spared."""
    from fedkt.infra.timing import PHASES

    cols = [*PHASES, "other"]
    header = ["", "wall (s)", *(f"{c} (s, %)" for c in cols), "spared by reuse (s)"]
    lines = []
    for name, spent in named:
        if spent is None:
            lines.append([name, "-", *("-" for _ in cols), "-"])
            continue
        wall = spent["wall"] or 1.0
        lines.append([name, f"{spent['wall']:.1f}",
                      *(f"{spent[c]:.1f} ({100 * spent[c] / wall:.0f}%)" for c in cols),
                      f"{spent.get('saved', 0.0):.1f}"])
    return format_table(header, lines, markdown=True)

