"""Run folders as evidence: per-example samples, seed groups, and paired comparisons.

A *run* is a folder written by ``fedkt run`` (``RUN`` or ``RUN@ROUND`` to pick an
evaluation round other than the last).  A *participant group* is ``server``,
``clients`` (the mean over clients, client k paired with client k), ``client_k``
or any other participant name (FedCoLLM's ``global_slm``).  A metric may carry a scope
prefix, as the metrics rows do (FedSP's ``aux_accuracy`` is the server's ``aux`` table).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from fedkt.eval.groups import resolve_groups
from fedkt.eval.predictions import Predictions, prediction_files, read_predictions
from fedkt.evidence.run_table import RunInfo, load_run
from fedkt.evidence.stats import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_LEVEL,
    Difference,
    Largest,
    Sample,
    bootstrap_difference,
    components,
    mcnemar_exact,
    metric_names,
    sample,
)
from fedkt.tracking.rows import is_eval

__all__ = ["Group", "Run", "compare", "fmt_mean_std", "group_runs", "open_run"]

# Config keys that do not change what a run computes (or that name the seed).
_NOT_SETTINGS = ("seed", "name", "output_dir", "runtime")


@dataclass
class Run:
    """A run folder, optionally pinned to one evaluation round (``RUN@ROUND``)."""

    info: RunInfo
    round: int | None = None

    @property
    def path(self) -> Path:
        return self.info.path

    @property
    def label(self) -> str:
        return f"{self.info.path}" + (f"@{self.round}" if self.round is not None else "")

    @property
    def seed(self) -> int:
        return int(self.info.config.get("seed", 0))

    @cached_property
    def files(self) -> dict[tuple[int, str, str], Path]:
        return prediction_files(self.path)

    def settings(self) -> dict[str, Any]:
        """The config without seed, names, folders and transport: equal for a seed group."""
        cfg = copy.deepcopy(self.info.config)
        for key in _NOT_SETTINGS:
            cfg.pop(key, None)
        return cfg

    def eval_round(self) -> int:
        """The round this run is read at: the pinned one, else its last evaluation."""
        if self.round is not None:
            return self.round
        rounds = [int(r["round"]) for r in self.info.rows
                  if is_eval(r) and isinstance(r.get("round"), int)]
        if not rounds:
            raise ValueError(f"{self.path}: no evaluation rows in metrics.jsonl")
        return max(rounds)

    def participants(self) -> list[str]:
        rnd = self.eval_round()
        names = {str(r["participant"]) for r in self.info.rows
                 if is_eval(r) and r.get("round") == rnd}
        names |= {p for (r, p, _) in self.files if r == rnd}
        return sorted(names, key=lambda n: (n != "server", _client_index(n), n))

    def clients(self) -> list[str]:
        return [p for p in self.participants() if p.startswith("client_")]

    def table(self, participant: str, scope: str = "") -> Predictions | None:
        """A participant's predictions at the evaluation round; a table without
        ``class_groups`` (image classifiers') gets the run config's ``eval.class_groups``."""
        path = self.files.get((self.eval_round(), participant, scope))
        return self.with_groups(read_predictions(path)) if path else None

    def with_groups(self, table: Predictions) -> Predictions:
        """``table`` with the run's ``eval.class_groups`` in its meta unless it has its own."""
        groups = (self.info.config.get("eval") or {}).get("class_groups")
        if groups and "class_groups" not in table.meta and "gold" in table.columns:
            table.meta["class_groups"] = resolve_groups(groups, None)
        return table

    def row_value(self, participant: str, metric: str) -> float | None:
        """The metric as logged in metrics.jsonl (evaluation rows, else the train row)."""
        rnd = self.eval_round()
        rows = [r for r in self.info.rows
                if r.get("participant") == participant and r.get("round") == rnd
                and isinstance(r.get(metric), int | float) and not isinstance(r[metric], bool)]
        pick = [r for r in rows if is_eval(r)] or rows
        return float(pick[-1][metric]) if pick else None

    def total(self, participant: str, key: str) -> float | None:
        """``key`` summed over every round (bytes, seconds); ``bytes_total`` is
        ``bytes_sent + bytes_received``."""
        keys = ("bytes_sent", "bytes_received") if key == "bytes_total" else (key,)
        values = [float(r[k]) for r in self.info.rows for k in keys
                  if r.get("participant") == participant and isinstance(r.get(k), int | float)]
        return sum(values) if values else None

    def logged_clients(self) -> list[str]:
        """Every client with a row in metrics.jsonl (evaluated or not)."""
        names = {str(r.get("participant")) for r in self.info.rows}
        return sorted((n for n in names if n.startswith("client_")), key=_client_index)


# Metrics summed over every round rather than read at the evaluation round.
TOTALS = ("bytes_sent", "bytes_received", "bytes_total", "eval_bytes", "wall_time")


def _client_index(name: str) -> int:
    m = re.fullmatch(r"client_(\d+)", name)
    return int(m.group(1)) if m else -1


def open_run(spec: str | Path, rnd: int | None = None) -> Run:
    """``RUN`` or ``RUN@ROUND`` -> :class:`Run` (the folder is checked)."""
    text = str(spec)
    m = re.fullmatch(r"(.+)@(\d+)", text)
    if m and not Path(text).exists():
        text, rnd = m.group(1), int(m.group(2))
    run = Run(load_run(text), rnd)
    if rnd is not None and not any(r.get("round") == rnd and is_eval(r) for r in run.info.rows):
        raise ValueError(f"{text}: no evaluation in round {rnd} (use eval.round0 for round 0)")
    return run


# --------------------------------------------------------------------------- what to measure


def members(run: Run, group: str) -> list[str]:
    """The participants of a group in this run (``clients``: every client)."""
    if group == "clients":
        found = run.clients()
        if not found:
            raise ValueError(f"{run.label}: no client was evaluated in round {run.eval_round()}")
        return found
    return [group]


def split_scope(run: Run, participant: str, metric: str) -> tuple[str, str]:
    """``aux_accuracy`` -> (``aux``, ``accuracy``) when the run has an ``aux`` table."""
    rnd = run.eval_round()
    for (r, p, scope) in run.files:
        if r == rnd and p == participant and scope and metric.startswith(scope + "_"):
            return scope, metric[len(scope) + 1:]
    return "", metric


def measure(run: Run, group: str, metric: str) -> Sample | float | None:
    """A group's ``metric``: a per-example :class:`Sample` when predictions exist, else
    the logged number (mean over the group's participants); ``None`` when absent.
    ``bytes_sent``, ``bytes_received``, ``bytes_total`` (their sum), ``eval_bytes`` and
    ``wall_time`` are summed over the rounds."""
    if metric in TOTALS:
        return _measure_total(run, group, metric)
    names = members(run, group)
    tables = []
    for name in names:
        scope, base = split_scope(run, name, metric)
        table = run.table(name, scope)
        if table is None:
            break
        try:
            components(table, base)
        except KeyError:
            break
        tables.append((table, base))
    if len(tables) == len(names):
        return sample([t for t, _ in tables], tables[0][1])
    values = [run.row_value(n, metric) for n in names]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _measure_total(run: Run, group: str, metric: str) -> float | None:
    """A summed-over-rounds metric (bytes, wall time): per participant, the group's mean;
    ``clients`` counts every client that logged rows, evaluated or not."""
    names = run.logged_clients() if group == "clients" else [group]
    values = [run.total(n, metric) for n in names]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def value_of(m: Sample | float | None) -> float | None:
    if m is None:
        return None
    return float(m.value()) if isinstance(m, Sample) else float(m)


def available_metrics(run: Run, group: str) -> list[str]:
    """Per-example metrics of a group, in report order (scoped ones after)."""
    out: list[str] = []
    for name in members(run, group)[:1]:
        for (r, p, scope) in sorted(run.files):
            if r == run.eval_round() and p == name:
                table = run.with_groups(read_predictions(run.files[(r, p, scope)]))
                out += [f"{scope}_{m}" if scope else m for m in metric_names(table)]
    return out


# --------------------------------------------------------------------------- groups


@dataclass
class Group:
    """Runs that differ only in seed (one run is a group of one)."""

    runs: list[Run] = field(default_factory=list)

    @property
    def label(self) -> str:
        first = self.runs[0]
        name = str(first.info.config.get("name") or first.path.name)
        name += f"@{first.round}" if first.round is not None else ""
        return name if len(self.runs) == 1 else f"{name} ({len(self.runs)} seeds)"

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    def values(self, group: str, metric: str) -> list[float]:
        return [v for v in (value_of(measure(r, group, metric)) for r in self.runs)
                if v is not None]

    def mean_std(self, group: str, metric: str) -> tuple[float, float, int] | None:
        vals = self.values(group, metric)
        if not vals:
            return None
        std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        return float(np.mean(vals)), std, len(vals)


def fmt_mean_std(ms: tuple[float, float, int] | None, digits: int = 3) -> str:
    """``mean ± std`` over seeds (the mean alone for one seed; ``-`` when absent)."""
    if ms is None:
        return "-"
    mean, std, n = ms
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Group runs whose configs differ only in seed (and name, folder, transport)."""
    groups: list[tuple[dict[str, Any], int | None, Group]] = []
    for run in runs:
        key = run.settings()
        for settings, rnd, group in groups:
            if settings == key and rnd == run.round and run.seed not in group.seeds:
                group.runs.append(run)
                break
        else:
            groups.append((key, run.round, Group([run])))
    return [g for _, _, g in groups]


# --------------------------------------------------------------------------- comparisons


def paired(a: Group, b: Group) -> tuple[list[Run], list[Run]]:
    """Pair the runs of two groups by seed (every seed both have); else a single pair."""
    by_seed = {r.seed: r for r in b.runs}
    common = [r for r in a.runs if r.seed in by_seed]
    if common:
        return common, [by_seed[r.seed] for r in common]
    if len(a.runs) == 1 and len(b.runs) == 1:
        return a.runs, b.runs
    raise ValueError(f"{a.label} and {b.label} share no seed: seeds {a.seeds} vs {b.seeds}")


def check_same_examples(a: Run, b: Run, sa: Sample, sb: Sample) -> None:
    """Refuse to pair runs evaluated on different test examples."""
    if set(sa.ids) != set(sb.ids):
        only_a = len(set(sa.ids) - set(sb.ids))
        only_b = len(set(sb.ids) - set(sa.ids))
        raise ValueError(
            f"{a.label} and {b.label} were evaluated on different test examples: {only_a} of "
            f"{len(sa.ids)} ids are only in the first and {only_b} of {len(sb.ids)} only in "
            "the second (same data and seed give the same test split)")


def compare(a: Group, b: Group | Sequence[Group], group: str, metric: str, *,
            b_group: str | None = None,
            b_metric: str | None = None, factor: float = 1.0, offset: float = 0.0,
            reps: int = DEFAULT_BOOTSTRAP, level: float = DEFAULT_LEVEL, seed: int = 0,
            units: dict[int, int] | None = None) -> tuple[Difference, float | None] | None:
    """``A.group.metric - factor * B.group.metric - offset`` with its paired CI, and
    McNemar's exact p when both sides are one run's accuracy of one participant.  ``b``
    several groups: the larger of them on each resample (``max(B1, B2)``, on their
    common seeds).  ``units``: each seed's fold, where a suite runs several seeds inside
    a fold (the fold then the unit of the bootstrap and of ``per_seed``)."""
    if isinstance(b, Group):
        runs_a, runs_b = paired(a, b)
        others: list[list[Run]] = []
    else:  # the larger of several groups (Largest), on the seeds all of them have
        first, *rest = b
        common = set.intersection(*(set(g.seeds) for g in (a, *b)))
        a = Group([r for r in a.runs if r.seed in common])
        runs_a, runs_b = paired(a, first)
        others = [paired(a, g)[1] for g in rest]
    sides_a, sides_b = [], []
    for k, (ra, rb) in enumerate(zip(runs_a, runs_b, strict=True)):
        ma = measure(ra, group, metric)
        mb = measure(rb, b_group or group, b_metric or metric)
        if ma is None or mb is None:
            return None
        if others:
            more = [(o[k], measure(o[k], b_group or group, b_metric or metric)) for o in others]
            if not isinstance(ma, Sample) or not isinstance(mb, Sample) or not all(
                    isinstance(m, Sample) for _, m in more):
                raise ValueError("max(...) compares per-example metrics of every arm")
            for run, m in [(rb, mb), *more]:
                check_same_examples(ra, run, ma, m)
            mb = Largest((mb, *(m for _, m in more)))
        elif isinstance(ma, Sample) != isinstance(mb, Sample):
            ma, mb = value_of(ma), value_of(mb)
        if isinstance(ma, Sample) and isinstance(mb, Sample):
            check_same_examples(ra, rb, ma, mb)
        sides_a.append(ma)
        sides_b.append(mb)
    diff = bootstrap_difference(sides_a, sides_b, factor=factor, offset=offset, reps=reps,
                                level=level, seed=seed,
                                units=[units[r.seed] for r in runs_a] if units else None)
    p = None
    ma, mb = sides_a[0], sides_b[0]
    if len(sides_a) == 1 and factor == 1.0 and offset == 0.0 and isinstance(ma, Sample) \
            and isinstance(mb, Sample) and ma.metric.mean_like and len(ma.parts) == 1 \
            and ma.metric.name.startswith("accuracy"):
        mb = mb.aligned(ma.ids)
        _, _, p = mcnemar_exact(ma.parts[0][:, 0] > 0, mb.parts[0][:, 0] > 0)
    return diff, p
