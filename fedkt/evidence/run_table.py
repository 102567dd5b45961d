"""The run table: finished runs side by side, one markdown row per run (``fedkt report
RUN_DIR ...``), and their lm-evaluation-harness results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedkt.eval.harness import load_harness_results
from fedkt.tracking.folder import CONFIG_FILE, METRICS_FILE
from fedkt.tracking.rows import (
    best_round,
    is_eval,
    lower_is_better,
    main_metric,
    metric_keys,
    read_rows,
    run_wall_time,
)
from fedkt.tracking.tables import fmt_mb, fmt_seconds, format_table

__all__ = ["RunInfo", "harness_report", "load_run", "report"]


@dataclass
class RunInfo:
    """A run folder's config and metrics rows."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.path.name)

    @property
    def method(self) -> str:
        method = self.config.get("method")
        return str(method.get("name", "?") if isinstance(method, dict) else method or "?")

    @property
    def clients(self) -> list[str]:
        return sorted({str(r["participant"]) for r in self.rows
                       if str(r.get("participant", "")).startswith("client")})

    @property
    def num_clients(self) -> int:
        clients = self.config.get("clients")
        configured = clients.get("num_clients") if isinstance(clients, dict) else None
        taking_part = clients.get("participants") if isinstance(clients, dict) else None
        if isinstance(taking_part, list) and taking_part:
            return len(taking_part)
        return int(configured) if isinstance(configured, int) else len(self.clients)


def load_run(path: Path | str) -> RunInfo:
    """Read a run folder, naming it in the error when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run folder")
    for name in (CONFIG_FILE, METRICS_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path}: no {name} here; is it a fedkt run folder (runs/<name>), and has "
                "the run completed a round?"
            )
    try:
        config = yaml.safe_load((path / CONFIG_FILE).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path / CONFIG_FILE}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path / CONFIG_FILE}: expected a mapping at the top level")
    return RunInfo(path, config, read_rows(path / METRICS_FILE))


def _final(rows: list[dict[str, Any]], participant: str, metric: str) -> float | None:
    value = None
    for row in rows:
        if row.get("participant") == participant and is_eval(row) \
                and isinstance(row.get(metric), int | float):
            value = float(row[metric])
    return value


def _client_means(run: RunInfo, metric: str) -> dict[int, float]:
    """Per round: the mean over clients of their evaluated ``metric``."""
    per_round: dict[int, list[float]] = {}
    for row in run.rows:
        if str(row.get("participant", "")).startswith("client") and is_eval(row) \
                and isinstance(row.get(metric), int | float) \
                and isinstance(row.get("round"), int):
            per_round.setdefault(row["round"], []).append(float(row[metric]))
    return {rnd: sum(v) / len(v) for rnd, v in sorted(per_round.items())}


def _client_bytes(run: RunInfo, key: str) -> str:
    """Clients' ``key`` summed over rounds, per client, as MB."""
    values = [row[key] for row in run.rows
              if str(row.get("participant", "")).startswith("client")
              and isinstance(row.get(key), int | float)]
    if not values or not run.num_clients:
        return "-"
    return fmt_mb(sum(values) / run.num_clients)


def _default_metric(runs: Sequence[RunInfo]) -> str:
    """The first metric every run has (preferred order), else the first run's main one."""
    common = None
    for run in runs:
        keys = metric_keys(run.rows)
        common = keys if common is None else [k for k in common if k in keys]
    return common[0] if common else main_metric([r for run in runs for r in run.rows])


def report(run_dirs: Sequence[Path | str], metric: str | None = None) -> str:
    """Markdown table comparing runs, one row per run.

    ``metric``: one metric or a comma-separated list (default: the first
    metric all runs report, preferring accuracy, then rougeL, f1 ...).
    Columns: each metric's final server value and final mean over clients,
    the best round (server's metric, else the clients' mean; the first
    metric decides), MB sent and received per client (summed over rounds,
    divided by the number of clients) and the wall time.
    """
    if not run_dirs:
        raise ValueError("give at least one run folder")
    runs = [load_run(d) for d in run_dirs]
    metrics = [m.strip() for m in metric.split(",") if m.strip()] if metric else []
    metrics = metrics or [_default_metric(runs)]
    header = ["run", "method", "rounds"]
    for m in metrics:
        header += [f"server {m}", f"clients {m} (mean)"]
    header += [f"best round ({metrics[0]})", "MB sent / client", "MB received / client",
               "wall time (s)"]
    table = []
    for run in runs:
        rounds = [r["round"] for r in run.rows if isinstance(r.get("round"), int)]
        line: list[Any] = [run.name, run.method, max(rounds) if rounds else 0]
        for m in metrics:
            means = _client_means(run, m)
            line += [_final(run.rows, "server", m), means[max(means)] if means else None]
        best = best_round([r for r in run.rows if r.get("participant") == "server"], metrics[0])
        if best is None:
            means = _client_means(run, metrics[0])
            if means:
                pick = min if lower_is_better(metrics[0]) else max
                best_value = pick(means.values())
                best = (next(r for r, v in means.items() if v == best_value), best_value)
        line += [best[0] if best else None, _client_bytes(run, "bytes_sent"),
                 _client_bytes(run, "bytes_received"), fmt_seconds(run_wall_time(run.rows))]
        table.append(line)
    return format_table(header, table, markdown=True)


def harness_report(run_dirs: Sequence[Path | str]) -> str | None:
    """lm-evaluation-harness results of the runs that have them (``fedkt eval --harness``,
    ``eval.harness``) as one markdown table; ``None`` when none has."""
    rows = []
    for run_dir in run_dirs:
        run = load_run(run_dir)
        for participant, tasks in load_harness_results(run.path).items():
            for task, metrics in sorted(tasks.items()):
                for metric, value in sorted(metrics.items()):
                    if not metric.endswith("_stderr"):
                        err = metrics.get(f"{metric}_stderr")
                        rows.append([run.name, participant, task, metric, value,
                                     "-" if err is None else f"{err:.4f}"])
    if not rows:
        return None
    return format_table(["run", "participant", "task", "metric", "value", "stderr"], rows,
                        markdown=True)
