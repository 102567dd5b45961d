"""``summary.md``: a run's final and best values per participant, as markdown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedkt.infra.environment import ENVIRONMENT_FILE, describe
from fedkt.tracking.rows import (
    best_round,
    is_eval,
    is_number,
    is_timing,
    last_value,
    main_metric,
    metric_keys,
    participant_order,
    run_wall_time,
    total,
)
from fedkt.tracking.tables import fmt, fmt_mb, fmt_seconds, format_table

__all__ = ["environment_facts", "read_environment", "summary_markdown", "timing_table"]


def read_environment(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``environment.json`` entries (none for a run made before fedkt kept it)."""
    path = run_dir / ENVIRONMENT_FILE
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def environment_facts(run_dir: Path) -> list[str]:
    """``- environment: ...`` lines of summary.md (one per entry of a run resumed elsewhere)."""
    entries = read_environment(run_dir)
    if len(entries) == 1:
        return [f"- environment: {describe(entries[0])}", *_peak(entries[0], "")]
    return [line for e in entries for line in (
        f"- environment from round {e.get('from_round')}: {describe(e)}",
        *_peak(e, f" from round {e.get('from_round')}"))]


def _peak(entry: dict[str, Any], where: str) -> list[str]:
    """The peak-memory line of one ``environment.json`` entry (none if it kept none)."""
    peak = entry.get("peak_rss_mb")
    return [f"- peak memory{where}: {peak:,.0f} MB resident (the largest process that "
            "computed these rounds)"] if is_number(peak) else []


def summary_markdown(rows: Sequence[dict[str, Any]], cfg: dict[str, Any], run_dir: Path) -> str:
    """Markdown summary of a run's ``rows`` (final and best values) under its saved config
    ``cfg`` (a dict, for the name and method) and folder ``run_dir``."""
    method = cfg.get("method")
    method = method.get("name") if isinstance(method, dict) else method
    rounds = [int(r["round"]) for r in rows if is_number(r.get("round"))]
    title = f"# Run summary: {cfg.get('name', run_dir.name)}"
    facts = [f"- folder: `{run_dir}`"]
    if method:
        facts.append(f"- method: {method}")
    facts.append(f"- rounds completed: {max(rounds) if rounds else 0}")
    wall = run_wall_time(rows)
    if wall is not None:
        facts.append(f"- wall time: {wall:.1f} s")
    facts += environment_facts(run_dir)
    keys = metric_keys(rows)
    main = main_metric(rows)
    header = ["participant", "last eval round", "train loss", "test loss", *keys,
              f"best {main} (round)", "MB sent", "MB received", "time (s)"]
    table = []
    for name in participant_order(r.get("participant", "?") for r in rows):
        mine = [r for r in rows if r.get("participant", "?") == name]
        eval_rounds = [r.get("round") for r in mine if is_eval(r)]
        best = best_round(mine, main)
        table.append([
            name, eval_rounds[-1] if eval_rounds else None,
            last_value(mine, "loss", train=True), last_value(mine, "loss", train=False),
            *[last_value(mine, k, train=False) for k in keys],
            f"{fmt(best[1])} ({best[0]})" if best else "-",
            fmt_mb(total(mine, "bytes_sent")), fmt_mb(total(mine, "bytes_received")),
            fmt_seconds(total(mine, "wall_time")),
        ])
    text = "\n".join([title, "", *facts, "", ""])
    text += format_table(header, table, markdown=True) + "\n" if table else "No metrics.\n"
    timings = timing_table(rows)
    return text + ("\n## Where the time went\n\n" + timings + "\n" if timings else "")


def timing_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of each participant's seconds, summed over the run: its
    ``wall_time``, ``compute_time`` and each phase (``<phase>_seconds``,
    :mod:`fedkt.infra.timing`), and what reused results spared (``*_saved_seconds``);
    ``""`` when no row has a timing.  Other ``*_seconds`` keys (FedKD's step time) are
    summed as they are."""
    from fedkt.infra.timing import PHASES, SAVED

    found = {k for r in rows for k, v in r.items() if is_timing(k) and is_number(v)}
    if not found:
        return ""
    saved = {f"{name}_seconds" for name in SAVED}
    phases = [f"{p}_seconds" for p in PHASES if f"{p}_seconds" in found]
    others = sorted(found - saved - set(phases) - {"wall_time", "compute_time", "compute_cpu"})
    cols = [k for k in ("wall_time", "compute_time") if k in found] + phases + others
    header = ["participant", *(_timing_label(k) for k in cols)]
    if found & saved:
        header.append("spared by reuse (s)")
    table = []
    for name in participant_order(r.get("participant", "?") for r in rows):
        mine = [r for r in rows if r.get("participant", "?") == name]
        if not any(total(mine, k) is not None for k in found):
            continue  # a model timed with its participant (FedCoLLM's global_slm)
        line = [name, *(fmt_seconds(total(mine, k)) for k in cols)]
        if found & saved:
            line.append(fmt_seconds(sum(total(mine, k) or 0.0 for k in saved)))
        table.append(line)
    return format_table(header, table, markdown=True)


def _timing_label(key: str) -> str:
    """``wall_time`` -> ``time (s)``, ``eval_seconds`` -> ``eval (s)``."""
    return {"wall_time": "time (s)", "compute_time": "compute (s)"}.get(
        key, key.removesuffix("_seconds") + " (s)")
