"""The cross-method table of a suite: accuracy, bytes, compute and exposure per arm.

A suite with a ``comparison`` section (``fedkt/configs/suites/comparison.yaml``) gets
one row per arm in ``suite.md`` and ``comparison.json``, and two figures in ``plots/``:

* the server's and the clients' accuracy, each with its paired CI against a baseline
  arm (``server_baseline``: zero-shot; ``clients_baseline``: standalone);
* bytes each client sends and receives per round, as measured by the runtime (the
  envelope included, the evaluation's predictions not);
* compute per round: each client's handlers without their evaluation, and the server's
  round without waiting for clients or evaluating, in CPU seconds (``compute_cpu``,
  the default: what a method costs whatever else shares the cores) or wall seconds
  (``compute: compute_time``, e.g. on a GPU);
* what the server sees of each client and the clients of the server (the registered
  method's ``docs.server_sees`` / ``docs.clients_see``, as in docs/security.md).

Which participant is an arm's "server LLM" and which its "clients' model" differs by
method (FedAvg's global model is its ``server`` participant, FedCoLLM's clients hold
the ``global_slm``): ``read`` maps an arm to the groups its two columns come from, and
``null`` leaves a column empty.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedkt.config import _Strict
from fedkt.evidence.runs import Group, Run, compare, members
from fedkt.methods import get_method
from fedkt.tracking.tables import fmt_seconds, format_table

__all__ = ["COLUMNS", "ComparisonConfig", "comparison_report"]

COLUMNS = ("server", "clients")
COMPARISON_JSON = "comparison.json"


class ComparisonConfig(_Strict):
    """A suite's ``comparison`` section."""

    server_baseline: str
    clients_baseline: str
    # arm -> {"server": GROUP | None, "clients": GROUP | None}; default: the column's name
    read: dict[str, dict[str, str | None]] = Field(default_factory=dict)
    metric: str = "accuracy"
    compute: Literal["compute_cpu", "compute_time"] = "compute_cpu"


def check_comparison(cfg: ComparisonConfig, arms: list[str]) -> None:
    """Names in the section must be arms and columns (ValueError naming the key)."""
    for key in ("server_baseline", "clients_baseline"):
        if getattr(cfg, key) not in arms:
            raise ValueError(f"comparison.{key}: {getattr(cfg, key)!r} is not an arm ({arms})")
    for arm, cols in cfg.read.items():
        if arm not in arms:
            raise ValueError(f"comparison.read: {arm!r} is not an arm ({arms})")
        for col in cols:
            if col not in COLUMNS:
                raise ValueError(f"comparison.read.{arm}: unknown column {col!r}; "
                                 f"use {', '.join(COLUMNS)}")


def _source(cfg: ComparisonConfig, arm: str, column: str) -> str | None:
    return cfg.read.get(arm, {}).get(column, column)


def _has(group: Group, part: str) -> bool:
    try:
        return all(members(r, part) for r in group.runs)
    except ValueError:
        return False


def _per_round(run: Run, participants: list[str], key: str, first: bool) -> float | None:
    """Mean over ``participants`` and training rounds (``first``: round 1 only) of ``key``
    (train rows only)."""
    values = []
    for name in participants:
        per_round: dict[int, float] = {}
        for row in run.info.rows:
            rnd = row.get("round")
            if row.get("participant") == name and row.get("split") == "train" \
                    and isinstance(row.get(key), int | float) and isinstance(rnd, int) \
                    and (rnd == 1 or not first):
                per_round[rnd] = per_round.get(rnd, 0.0) + float(row[key])
        values += list(per_round.values())
    return float(np.mean(values)) if values else None


def _cost(group: Group, key: str, side: str, first: bool = False) -> float | None:
    """Mean over seeds of a per-round cost: ``side`` ``clients`` (every client that
    logged rows) or ``server``; ``first``: round 1's (e.g. a model shipped once)."""
    vals = []
    for run in group.runs:
        names = run.logged_clients() if side == "clients" else ["server"]
        v = _per_round(run, names, key, first)
        if v is not None:
            vals.append(v)
    return float(np.mean(vals)) if vals else None


def _accuracy(group: Group, part: str, base: Group | None, base_part: str, metric: str,
              reps: int, level: float, seed: int) -> dict[str, Any] | None:
    """The arm's value with its own CI, and the paired difference to the baseline."""
    own = compare(group, group, part, metric, factor=0.0, reps=reps, level=level, seed=seed)
    if own is None:
        return None
    d, _ = own
    out: dict[str, Any] = {"value": d.estimate, "low": d.low, "high": d.high, "n": d.n,
                           "seeds": d.seeds, "delta": None}
    if base is not None and base is not group and _has(base, base_part):
        got = compare(group, base, part, metric, b_group=base_part, reps=reps, level=level,
                      seed=seed)
        if got is not None:
            diff, _ = got
            out["delta"] = {"estimate": diff.estimate, "low": diff.low, "high": diff.high}
    return out


def _fmt_acc(cell: dict[str, Any] | None) -> list[str]:
    if cell is None:
        return ["-", "-"]
    delta = cell["delta"]
    return [f"{cell['value']:.3f}",
            "-" if delta is None else
            f"{delta['estimate']:+.3f} [{delta['low']:+.3f}, {delta['high']:+.3f}]"]


def _fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def comparison_rows(cfg: ComparisonConfig, groups: dict[str, Group], *, reps: int,
                    level: float, seed: int) -> list[dict[str, Any]]:
    """One dict per arm with results: accuracies, bytes, compute and exposure."""
    rows = []
    bases = {"server": groups.get(cfg.server_baseline), "clients": groups.get(cfg.clients_baseline)}
    base_parts = {"server": _source(cfg, cfg.server_baseline, "server") or "server",
                  "clients": _source(cfg, cfg.clients_baseline, "clients") or "clients"}
    for arm, group in groups.items():
        method = get_method(str(group.runs[0].info.config.get("method", {}).get("name")))
        row: dict[str, Any] = {"arm": arm, "method": method.name}
        for col in COLUMNS:
            part = _source(cfg, arm, col)
            row[col] = None if part is None or not _has(group, part) else _accuracy(
                group, part, bases[col], base_parts[col], cfg.metric, reps, level, seed)
            row[f"{col}_group"] = part
        row["bytes_up"] = _cost(group, "bytes_sent", "clients")
        row["bytes_down"] = _cost(group, "bytes_received", "clients")
        row["bytes_down_round1"] = _cost(group, "bytes_received", "clients", first=True)
        row["client_compute"] = _cost(group, cfg.compute, "clients")
        row["server_compute"] = _cost(group, cfg.compute, "server")
        row["server_sees"], row["clients_see"] = method.docs.server_sees, method.docs.clients_see
        rows.append(row)
    return rows


def comparison_report(folder: Path, cfg: ComparisonConfig, groups: dict[str, Group], *,
                      reps: int, level: float, seed: int) -> str:
    """The markdown section for ``suite.md``; writes ``comparison.json`` and the plots."""
    rows = comparison_rows(cfg, groups, reps=reps, level=level, seed=seed)
    pct = int(round(level * 100))
    metric = cfg.metric
    unit = "CPU s" if cfg.compute == "compute_cpu" else "s"
    header = ["arm", f"server {metric}", f"Δ vs {cfg.server_baseline} [{pct}% CI]",
              f"clients {metric}", f"Δ vs {cfg.clients_baseline} [{pct}% CI]",
              "up / client / round", "down / client / round", "down in round 1",
              f"client {unit} / round",
              f"server {unit} / round", "server sees", "clients see"]
    table = []
    for r in rows:
        table.append([r["arm"], *_fmt_acc(r["server"]), *_fmt_acc(r["clients"]),
                      _fmt_bytes(r["bytes_up"]), _fmt_bytes(r["bytes_down"]),
                      _fmt_bytes(r["bytes_down_round1"]),
                      fmt_seconds(r["client_compute"]), fmt_seconds(r["server_compute"]),
                      r["server_sees"], r["clients_see"]])
    (folder / COMPARISON_JSON).write_text(json.dumps(rows, indent=2, default=float) + "\n")
    comparison_plots(folder / "plots", rows, metric, level, unit)
    read = "; ".join(f"{arm}: " + ", ".join(f"{c} = {g or '-'}" for c, g in cols.items())
                     for arm, cols in cfg.read.items())
    notes = [
        f"- {metric}: the final evaluation, mean over seeds; Δ: paired bootstrap ({reps} "
        f"resamples over test examples and seeds) against {cfg.server_baseline} (server) "
        f"and {cfg.clients_baseline} (clients)",
        "- bytes: measured per client, mean over rounds (up: client -> server), envelopes "
        "included, evaluation predictions not; round 1 alone beside them (what is sent "
        "once: FedSP's auxiliary model, LLM2SLM's frozen LLM's logits); "
        f"{unit}: compute per round "
        f"({cfg.compute}) without evaluation, the server's also without waiting for its "
        "clients",
    ]
    if read:
        notes.append(f"- columns read from other participants: {read}")
    return "\n".join(["## Comparison", "", *notes, "",
                      format_table(header, table, markdown=True), ""])


def comparison_plots(out_dir: Path, rows: list[dict[str, Any]], metric: str, level: float,
                     unit: str = "CPU s") -> list[Path]:
    """``comparison_bytes.png`` and ``comparison_compute.png``: the server's and the
    clients' accuracy against bytes / client compute per round, one point per arm with
    its own CI as whiskers; an arm without clients (centralized) is a dashed line."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    axes_spec = [("bytes", "bytes per client per round (up + down, log)",
                  lambda r: None if r["bytes_up"] is None or r["bytes_down"] is None
                  else r["bytes_up"] + r["bytes_down"], True),
                 ("compute", f"client compute per round ({unit}, log)",
                  lambda r: r["client_compute"], True)]
    for name, xlabel, xof, log_x in axes_spec:
        fig = Figure(figsize=(11, 4.5))
        panels = fig.subplots(1, 2)
        for ax, col in zip(panels, COLUMNS, strict=True):
            drew = False
            placed: list[tuple[float, float]] = []
            for r in rows:
                x, cell = xof(r), r[col]
                if cell is not None and x is None:  # no clients (centralized): a reference line
                    ax.axhline(cell["value"], ls="--", lw=1, color="grey")
                    ax.annotate(f"{r['arm']} (no clients)", (0.01, cell["value"]),
                                xycoords=("axes fraction", "data"), textcoords="offset points",
                                xytext=(0, 3), fontsize="small", color="grey")
                    continue
                if x is None or cell is None or (log_x and x <= 0):
                    continue
                y = cell["value"]
                drawn = ax.errorbar(x, y, yerr=[[y - cell["low"]], [cell["high"] - y]],
                                    fmt="o", capsize=4)
                # Labels of points close together are stacked downwards, not overprinted.
                near = sum(abs(math.log10(x) - math.log10(px)) < 0.25 and abs(y - py) < 0.05
                           for px, py in placed) if log_x else 0
                placed.append((x, y))
                ax.annotate(r["arm"], (x, y), textcoords="offset points",
                            xytext=(5, 4 - 11 * near), fontsize="small",
                            color=drawn[0].get_color())
                drew = True
            if log_x and drew:
                ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{col} {metric}")
            ax.set_title(f"{'server LLM' if col == 'server' else 'clients'}: "
                         f"whiskers = {int(round(level * 100))}% CI")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"comparison_{name}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written

