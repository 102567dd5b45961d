"""Paired tables: runs against a baseline run, per participant, with paired CIs over the
same test examples (``fedkt report RUN... --baseline RUN``; round 0 -> the end,
``eval.compare_round0``), and seed groups' mean ± std, as markdown."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedkt.eval.predictions import read_predictions
from fedkt.evidence.runs import (
    Group,
    available_metrics,
    compare,
    fmt_mean_std,
    group_runs,
    open_run,
)
from fedkt.evidence.stats import DEFAULT_BOOTSTRAP, DEFAULT_LEVEL, metric_names
from fedkt.tracking.tables import format_table

__all__ = ["baseline_report", "groups_report", "round0_summary"]


def _parts(group: Group) -> list[str]:
    """``server``, other server-side participants (FedCoLLM's ``global_slm``), each client
    and the clients' mean."""
    run = group.runs[0]
    clients = run.clients()
    others = [p for p in run.participants() if p not in clients]
    return others + (clients + ["clients"] if clients else [])


def _metrics(group: Group, metric: str | None) -> list[str]:
    if metric:
        return [m.strip() for m in metric.split(",") if m.strip()]
    run = group.runs[0]
    part = "server" if "server" in run.participants() else "clients"
    return available_metrics(run, part) or ["accuracy"]


def groups_report(groups: Sequence[Group], metric: str | None = None) -> str:
    """Mean ± std over seeds of each group of runs that differ only in seed
    (:func:`fedkt.evidence.runs.group_runs`)."""
    metrics = _metrics(groups[0], metric)
    header = ["group", "seeds", "round", "participant", *metrics]
    rows = []
    for group in groups:
        for part in _parts(group):
            cells = []
            for m in metrics:
                cells.append(fmt_mean_std(group.mean_std(part, m), 4))
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


def round0_summary(run_dir: str | Path, *, reps: int = DEFAULT_BOOTSTRAP,
                   level: float = DEFAULT_LEVEL, seed: int = 0) -> str:
    """Round 0 -> final of each participant's main metric, with its paired CI.

    One row per participant (FedCoLLM's ``global_slm`` beside its ``server`` LLM) and per
    scoped table (FedSP's ``aux_accuracy``), plus the mean over clients when there are several.
    The main metric is the first one its predictions support (``accuracy``, or
    ``rougeL`` for generation).  Needs a run with ``eval.round0`` and
    ``eval.predictions`` on (``eval.compare_round0`` prints this after ``fedkt run``).
    """
    final, start = open_run(run_dir), open_run(run_dir, 0)
    a, b = Group([final]), Group([start])
    rnd = final.eval_round()
    rows: list[list[str]] = []
    n = 0
    for part in [*final.participants(), *(["clients"] if len(final.clients()) > 1 else [])]:
        name = part if part != "clients" else final.clients()[0]
        scopes = sorted(scope for (r, p, scope) in final.files if r == rnd and p == name)
        for scope in scopes:
            main = metric_names(read_predictions(final.files[(rnd, name, scope)]))[0]
            metric = f"{scope}_{main}" if scope else main
            got = compare(a, b, part, metric, reps=reps, level=level, seed=seed)
            if got is None:
                continue
            d, _ = got
            n = max(n, d.n)
            label = "clients (mean)" if part == "clients" else part
            rows.append([label + (f" ({scope})" if scope else ""), main, f"{d.b:.3f}",
                         f"{d.a:.3f}", f"{d.estimate:+.3f}", f"[{d.low:+.3f}, {d.high:+.3f}]",
                         "yes" if d.low > 0 or d.high < 0 else "no"])
    if not rows:
        raise ValueError(f"{final.label}: no participant has predictions in both round 0 and "
                         f"round {rnd} (eval.predictions must be on)")
    pct = int(round(level * 100))
    header = ["participant", "metric", "round 0", f"round {rnd}", "Δ", f"{pct}% CI",
              "CI excludes 0"]
    title = (f"Round 0 -> round {rnd}: paired bootstrap over the same {n} test examples "
             f"({reps} resamples, {pct}% CI)")
    return title + "\n" + format_table(header, rows)
