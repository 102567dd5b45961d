"""Plots of a run: a PNG per (split, metric) and the cumulative communication."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedkt.tracking.rows import (
    MB,
    NON_METRIC_KEYS,
    is_eval,
    is_number,
    is_timing,
    participant_order,
)

__all__ = ["write_plots"]


def write_plots(rows: Sequence[dict[str, Any]], plots_dir: Path) -> list[Path]:
    """Write PNG curves of ``rows`` to ``plots_dir``; returns the files written.

    One figure per (split, metric) - ``test_accuracy.png``,
    ``train_loss.png`` ... - with a line per participant (the server's
    bold), ``communication.png`` with cumulative MB sent / received, and ``time.png``:
    the seconds of each round, per phase (timings are not metrics: no figure of their own).
    """
    rows = [r for r in rows if is_number(r.get("round"))]
    if not rows:
        return []
    # Figures are made without pyplot: no global state, no GUI backend, thread-safe.
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    plots_dir.mkdir(parents=True, exist_ok=True)
    names = participant_order(r.get("participant", "?") for r in rows)
    written: list[Path] = []
    series_keys: set[tuple[str, str]] = set()
    for r in rows:
        split = "test" if is_eval(r) else "train"
        for k, v in r.items():
            if is_number(v) and (k == "loss" or k not in NON_METRIC_KEYS) and not is_timing(k):
                series_keys.add((split, k))
    for split, key in sorted(series_keys):
        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        for name in names:
            points = [(r["round"], r[key]) for r in rows
                      if r.get("participant", "?") == name and is_number(r.get(key))
                      and (is_eval(r) == (split == "test"))]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=name,
                        **_line_style(name))
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(key)
        ax.set_title(f"{split} {key}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        written.append(_save(fig, plots_dir / f"{split}_{_safe(key)}.png"))
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    drew = False
    for ax, key, label in ((axes[0], "bytes_sent", "sent"),
                           (axes[1], "bytes_received", "received")):
        for name in names:
            per_round: dict[int, float] = {}
            for r in rows:
                if r.get("participant", "?") == name and is_number(r.get(key)):
                    per_round[int(r["round"])] = per_round.get(int(r["round"]), 0) + r[key]
            if per_round:
                xs = sorted(per_round)
                ys = [sum(per_round[x] for x in xs[: i + 1]) / MB for i in range(len(xs))]
                ax.plot(xs, ys, marker="o", markersize=3, label=name, **_line_style(name))
                drew = True
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"cumulative MB {label}")
        ax.set_title(f"communication: {label}")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    if drew:
        written.append(_save(fig, plots_dir / "communication.png"))
    timing = _time_plot(rows)
    if timing is not None:
        written.append(_save(timing, plots_dir / "time.png"))
    return written


def _time_plot(rows: Sequence[dict[str, Any]]) -> Any:
    """One figure: per round, the server's wall time and each phase's seconds summed over
    every participant (:mod:`fedkt.infra.timing`); None without timings."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from fedkt.infra.timing import PHASES

    series: dict[str, dict[int, float]] = {}
    for r in rows:
        keys = [("round (server)", "wall_time")] if r.get("participant") == "server" else []
        keys += [(p, f"{p}_seconds") for p in PHASES]
        for label, key in keys:
            if is_number(r.get(key)):
                per_round = series.setdefault(label, {})
                per_round[int(r["round"])] = per_round.get(int(r["round"]), 0.0) + r[key]
    if not series:
        return None
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label, per_round in series.items():
        xs = sorted(per_round)
        style = _line_style("server") if label == "round (server)" else {"linewidth": 1.2}
        ax.plot(xs, [per_round[x] for x in xs], marker="o", markersize=3, label=label, **style)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("seconds")
    ax.set_title("time per round (phases summed over participants)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig



def _line_style(name: str) -> dict[str, Any]:
    return {"linewidth": 2.8, "color": "black", "zorder": 3} if name == "server" \
        else {"linewidth": 1.2, "alpha": 0.85}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _save(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path``; a failed write (a full disk) is an ``OSError`` naming it."""
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    return path

