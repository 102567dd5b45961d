"""Suite figures: each arm's curve over rounds with a band across seeds, and the final
table as bars with CI whiskers (``<suite>/plots/``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from fedkt.evidence.runs import Group, members
from fedkt.tracking.rows import is_eval

__all__ = ["curves", "suite_plots"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def curves(group: Group, part: str, metric: str) -> dict[int, list[float]]:
    """Per round, one value per seed: the group's metric as logged (clients: their mean)."""
    per_round: dict[int, list[float]] = {}
    for run in group.runs:
        try:
            names = members(run, part)
        except ValueError:
            continue
        by_round: dict[int, list[float]] = {}
        for row in run.info.rows:
            if row.get("participant") in names and is_eval(row) \
                    and isinstance(row.get(metric), int | float) \
                    and isinstance(row.get("round"), int):
                by_round.setdefault(row["round"], []).append(float(row[metric]))
        for rnd, vals in by_round.items():
            per_round.setdefault(rnd, []).append(float(np.mean(vals)))
    return dict(sorted(per_round.items()))


def suite_plots(folder: Path, groups: dict[str, Group], parts: list[str], metrics: list[str],
                baseline: str | None, table: list[dict[str, Any]]) -> list[Path]:
    """Write ``<metric>_<group>_rounds.png`` and ``<metric>_<group>_final.png`` per metric
    and participant group; returns the files."""
    from matplotlib.figure import Figure

    out_dir = folder / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for part in parts:
        for metric in metrics:
            fig = Figure(figsize=(7, 4))
            ax = fig.subplots()
            drew = False
            for arm, group in groups.items():
                series = curves(group, part, metric)
                if not series:
                    continue
                xs = np.array(list(series))
                mean = np.array([np.mean(v) for v in series.values()])
                lo = np.array([np.min(v) for v in series.values()])
                hi = np.array([np.max(v) for v in series.values()])
                line, = ax.plot(xs, mean, marker="o", markersize=3, label=arm)
                if any(len(v) > 1 for v in series.values()):
                    ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color())
                drew = True
            if drew:
                ax.set_xlabel("round")
                ax.set_ylabel(metric)
                ax.set_title(f"{part} {metric}: mean over seeds, band = min..max")
                ax.grid(alpha=0.3)
                ax.legend(fontsize="small")
                fig.tight_layout()
                path = out_dir / f"{_safe(metric)}_{part}_rounds.png"
                fig.savefig(path, dpi=100)
                written.append(path)
            rows = [r for r in table if r["group"] == part and r["metric"] == metric
                    and r.get("mean_std")]
            if not rows:
                continue
            fig = Figure(figsize=(max(5, 1.1 * len(rows) + 2), 4))
            ax = fig.subplots()
            labels = [r["arm"] for r in rows]
            means = [r["mean_std"][0] for r in rows]
            ax.bar(range(len(rows)), means, color="#9bb7d4")
            for i, r in enumerate(rows):
                ci = r.get("vs_baseline")
                base = next((x["mean_std"][0] for x in rows if x["arm"] == baseline), None)
                if ci and base is not None:  # the CI of the difference, drawn around the mean
                    ax.errorbar(i, base + ci["estimate"],
                                yerr=[[ci["estimate"] - ci["low"]], [ci["high"] - ci["estimate"]]],
                                fmt="none", ecolor="black", capsize=4)
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize="small")
            ax.set_ylabel(metric)
            ax.set_title(f"{part} {metric}" + (f"; whiskers: paired CI vs {baseline}"
                                                if baseline else ""))
            ax.grid(alpha=0.3, axis="y")
            fig.tight_layout()
            path = out_dir / f"{_safe(metric)}_{part}_final.png"
            fig.savefig(path, dpi=100)
            written.append(path)
    return written
