"""``fedkt report RUN... --baseline RUN``: seed groups and paired differences as markdown."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedkt.evidence.runs import Group, available_metrics, compare, group_runs, open_run
from fedkt.evidence.stats import DEFAULT_BOOTSTRAP, DEFAULT_LEVEL
from fedkt.tracking import format_table

__all__ = ["baseline_report", "groups_report"]


def _parts(group: Group) -> list[str]:
    run = group.runs[0]
    clients = run.clients()
    return (["server"] if "server" in run.participants() else []) + \
        (clients + ["clients"] if clients else [])


def _metrics(group: Group, metric: str | None) -> list[str]:
    if metric:
        return [m.strip() for m in metric.split(",") if m.strip()]
    run = group.runs[0]
    part = "server" if "server" in run.participants() else "clients"
    return available_metrics(run, part) or ["accuracy"]


def groups_report(specs: Sequence[str | Path], metric: str | None = None) -> str:
    """Mean ± std over seeds of each group of runs that differ only in seed."""
    groups = group_runs([open_run(s) for s in specs])
    metrics = _metrics(groups[0], metric)
    header = ["group", "seeds", "round", "participant", *metrics]
    rows = []
    for group in groups:
        for part in _parts(group):
            cells = []
            for m in metrics:
                ms = group.mean_std(part, m)
                cells.append("-" if ms is None else
                             f"{ms[0]:.4f} ± {ms[1]:.4f}" if ms[2] > 1 else f"{ms[0]:.4f}")
            rows.append([group.label, ",".join(map(str, group.seeds)),
                         str(group.runs[0].eval_round()), part, *cells])
    return format_table(header, rows, markdown=True)


def baseline_report(specs: Sequence[str | Path], baseline: str | Path,
                    metric: str | None = None, *, reps: int = DEFAULT_BOOTSTRAP,
                    level: float = DEFAULT_LEVEL, seed: int = 0) -> str:
    """Each group's difference to the baseline's group, per participant and metric, with
    the paired bootstrap CI over shared test examples (and seeds), and McNemar's exact
    p for one run's accuracy.  Runs on different test examples are refused."""
    runs = [open_run(s) for s in specs]
    base_run = open_run(baseline)
    groups = group_runs([*runs, base_run])
    base = next(g for g in groups if any(r.path == base_run.path and r.round == base_run.round
                                         for r in g.runs))
    metrics = _metrics(base, metric)
    pct = int(round(level * 100))
    header = ["run", "participant", "metric", "value", "baseline", "Δ", f"{pct}% CI",
              "McNemar p", "examples", "seeds"]
    rows = []
    for group in groups:
        if group is base:
            continue
        for part in _parts(group):
            for m in metrics:
                got = compare(group, base, part, m, reps=reps, level=level, seed=seed)
                if got is None:
                    continue
                d, p = got
                rows.append([group.label, part, m, f"{d.a:.4f}", f"{d.b:.4f}",
                             f"{d.estimate:+.4f}", f"[{d.low:+.4f}, {d.high:+.4f}]",
                             "-" if p is None else f"{p:.3g}", str(d.n), str(d.seeds)])
    title = f"Paired differences to {base.label} (paired bootstrap, {reps} resamples)"
    return title + "\n\n" + format_table(header, rows, markdown=True)
