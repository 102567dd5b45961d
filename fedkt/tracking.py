"""The run folder: config, per-round metrics, terminal tables, plots and checkpoints.

Layout of ``run_dir``::

    config.yaml              the validated run config
    metrics.jsonl            one JSON object per (round, participant, split)
    summary.md               final summary table (written by ``summary()``)
    plots/*.png              metric and communication curves (``plot()``)
    checkpoints/round_0007/  the server's state after round 7 (server.safetensors) and
                             what each client held then (holdings.json)
    checkpoints/latest.json  {"round": 7, "time": ..., ...}: the last completed round
    .fedkt.lock              held (flock) by the one process writing the folder
    predictions/round_0007/  per-example predictions of each participant evaluated in
                             round 7 (server.json.gz, client_0.json.gz, ...; see
                             fedkt.eval.predictions); round_0000 with ``eval.round0``

A metrics row is a flat dict such as ``{"round": 3, "participant": "client_0",
"split": "train", "loss": 1.2, "bytes_sent": 1024, "bytes_received": 2048,
"wall_time": 3.5, "compute_time": 3.1, "compute_cpu": 3.0}``; any other numeric key is
a metric.  ``wall_time`` is the seconds the participant spent on that row's work;
``compute_time`` is that without evaluation (and, for the server, without waiting for
clients), ``compute_cpu`` the same in CPU seconds of its process (fedkt.eval.timing);
bytes are counted per row.
MB means 10**6 bytes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "LOCK_FILE", "TIMING_KEYS", "RunFolderBusy", "RunRecorder", "atomic_write", "clear_run_dir",
    "run_lock", "best_round", "fmt_mb", "fmt_seconds",
    "format_table", "is_eval", "is_timing", "lower_is_better", "main_metric", "without_timings",
    "metric_keys", "participant_order", "read_rows", "run_wall_time", "time_breakdown",
    "breakdown_table", "mean_breakdown",
]

METRICS_FILE = "metrics.jsonl"
PREDICTIONS_DIR = "predictions"  # per-example tables (fedkt.eval.predictions)
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.md"
LATEST_FILE = "latest.json"
SERVER_STATE = "server.safetensors"  # the server's state in each checkpoint folder
HOLDINGS = "holdings.json"  # ... and what each client held (fedkt.methods.holdings)
LOCK_FILE = ".fedkt.lock"  # the run folder's lock (run_lock)

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
_ROUND_DIR = re.compile(r"^round_(\d+)$")
MB = 1e6


# --------------------------------------------------------------------------- row helpers


def is_timing(key: str) -> bool:
    """Whether a metrics key measures time (it differs between identical runs)."""
    return key in TIMING_KEYS or key.endswith("_seconds")


def without_timings(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without their timing keys: what two runs of one seed and config share."""
    return [{k: v for k, v in row.items() if not is_timing(k)} for row in rows]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
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
    """Metric keys of evaluation rows: preferred ones first, then the rest by name."""
    found = {k for row in rows if is_eval(row) for k, v in row.items()
             if _is_number(v) and k not in NON_METRIC_KEYS}
    return [k for k in PREFERRED_METRICS if k in found] + sorted(found - set(PREFERRED_METRICS))


def main_metric(rows: Iterable[dict[str, Any]]) -> str:
    """The metric a run is judged by: the first of :func:`metric_keys`, else ``loss``."""
    keys = metric_keys(rows)
    return keys[0] if keys else "loss"


def lower_is_better(metric: str) -> bool:
    return metric.endswith("loss") or metric in ("perplexity", "ppl")


def _fmt(value: Any) -> str:
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
    return "-" if value is None else f"{value:.1f}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *,
                 markdown: bool = False) -> str:
    """A fixed-width text table (first column left-aligned) or a markdown table."""
    cells = [[_fmt(v) if not isinstance(v, str) else v for v in row] for row in rows]
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


def _last_value(rows: Iterable[dict[str, Any]], key: str, *, train: bool) -> Any:
    value = None
    for row in rows:
        if is_eval(row) != train and _is_number(row.get(key)):
            value = row[key]
    return value


def _total(rows: Iterable[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if _is_number(row.get(key))]
    return sum(values) if values else None


def best_round(rows: Iterable[dict[str, Any]], metric: str) -> tuple[int, float] | None:
    """``(round, value)`` where ``metric`` of evaluation rows was best (first on ties)."""
    best: tuple[int, float] | None = None
    low = lower_is_better(metric)
    for row in rows:
        value = row.get(metric)
        if not (is_eval(row) and _is_number(value) and _is_number(row.get("round"))):
            continue
        if best is None or (value < best[1] if low else value > best[1]):
            best = (int(row["round"]), float(value))
    return best


# --------------------------------------------------------------------------- recorder


class RunRecorder:
    """Reads and writes one run folder (see the module docstring for its layout).

    ``resume=False`` starts a fresh record: with ``overwrite=True`` (default) a
    previous run's metrics, summary, plots and checkpoints in the folder are
    removed; with ``overwrite=False`` that raises :class:`FileExistsError`.
    ``resume=True`` keeps them (call :meth:`truncate_after` with
    :meth:`last_complete_round` to drop rows of an unfinished round).
    """

    def __init__(self, run_dir: Path | str, resume: bool = False, *, overwrite: bool = True,
                 repair: bool = True):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.checkpoints = self.run_dir / "checkpoints"
        self.plots_dir = self.run_dir / "plots"
        # Called with each row :meth:`log` writes (the run's experiment trackers).
        self.mirrors: list[Callable[[dict[str, Any]], None]] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            if repair:
                self.repair_tail()
        elif self.metrics_path.exists() or (self.checkpoints / LATEST_FILE).exists():
            if not overwrite:
                raise FileExistsError(
                    f"{self.run_dir} already holds a run; resume it or choose another "
                    "output folder"
                )
            self._clear()

    # ------------------------------------------------------------------ files

    def _clear(self) -> None:
        for name in (METRICS_FILE, SUMMARY_FILE, "trackers.json"):
            (self.run_dir / name).unlink(missing_ok=True)
        if self.plots_dir.is_dir():
            for png in self.plots_dir.glob("*.png"):
                png.unlink()
        for _, folder in self.round_dirs():
            shutil.rmtree(folder)
        (self.checkpoints / LATEST_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.run_dir / PREDICTIONS_DIR, ignore_errors=True)

    def repair_tail(self, done: int | None = None) -> None:
        """Drop a half-written last line (a crash during ``log``), with a warning that
        names the file and says whether the row belonged to a completed round (``done``:
        the last one), whose data is then lost."""
        if not self.metrics_path.exists():
            return
        data = self.metrics_path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            torn = data[cut:].decode(errors="replace")
            m = re.match(r'\{"round": (\d+)', torn)
            lost = (f"a row of completed round {m.group(1)} is lost"
                    if m and done is not None and int(m.group(1)) <= done
                    else "the round it belonged to is run again")
            warnings.warn(f"{self.metrics_path}: dropping a half-written last line "
                          f"({len(torn)} bytes: {torn[:60]!r}); {lost}", stacklevel=2)
            atomic_write(self.metrics_path, data[:cut].decode())

    def save_config(self, yaml_text: str) -> Path:
        """Write ``config.yaml``."""
        path = self.run_dir / CONFIG_FILE
        atomic_write(path, yaml_text)
        return path

    def config(self) -> dict[str, Any]:
        """The saved config as a dict (empty if none was saved)."""
        path = self.run_dir / CONFIG_FILE
        if not path.exists():
            return {}
        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ metrics

    def log(self, row: dict[str, Any]) -> None:
        """Append one row to ``metrics.jsonl`` (and hand it to each of :attr:`mirrors`)."""
        if not isinstance(row, dict):
            raise TypeError(f"a metrics row must be a dict, got {type(row).__name__}")
        line = json.dumps({str(k): _plain(v) for k, v in row.items()}, default=str)
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        for mirror in self.mirrors:
            mirror(json.loads(line))

    def rows(self) -> list[dict[str, Any]]:
        """All logged rows, in order."""
        if not self.metrics_path.exists():
            return []
        return read_rows(self.metrics_path)

    def truncate_after(self, round: int) -> None:
        """Drop rows whose round is greater than ``round`` (rows without a round stay)."""
        kept = [row for row in self.rows()
                if not (_is_number(row.get("round")) and row["round"] > round)]
        atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        for folder in (self.run_dir / PREDICTIONS_DIR).glob("round_*"):
            m = _ROUND_DIR.match(folder.name)
            if m and int(m.group(1)) > round:
                shutil.rmtree(folder)

    # ------------------------------------------------------------------ tables

    def round_table(self, round: int) -> str:
        """Fixed-width table of one round: one line per participant."""
        rows = [r for r in self.rows() if r.get("round") == round]
        if not rows:
            return f"round {round}: no metrics"
        keys = metric_keys(rows)
        has_train_loss = any(not is_eval(r) and _is_number(r.get("loss")) for r in rows)
        has_test_loss = any(is_eval(r) and _is_number(r.get("loss")) for r in rows)
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
                line.append(_last_value(mine, "loss", train=True))
            if has_test_loss:
                line.append(_last_value(mine, "loss", train=False))
            line += [_last_value(mine, k, train=False) for k in keys]
            line += [fmt_mb(_total(mine, "bytes_sent")), fmt_mb(_total(mine, "bytes_received")),
                     fmt_seconds(_total(mine, "wall_time"))]
            table.append(line)
        return f"round {round}\n" + format_table(header, table)

    def summary(self) -> str:
        """Markdown summary of the run (final and best values); also written to summary.md."""
        rows = self.rows()
        cfg = self.config()
        method = cfg.get("method")
        method = method.get("name") if isinstance(method, dict) else method
        rounds = [int(r["round"]) for r in rows if _is_number(r.get("round"))]
        title = f"# Run summary: {cfg.get('name', self.run_dir.name)}"
        facts = [f"- folder: `{self.run_dir}`"]
        if method:
            facts.append(f"- method: {method}")
        facts.append(f"- rounds completed: {max(rounds) if rounds else 0}")
        wall = run_wall_time(rows)
        if wall is not None:
            facts.append(f"- wall time: {wall:.1f} s")
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
                _last_value(mine, "loss", train=True), _last_value(mine, "loss", train=False),
                *[_last_value(mine, k, train=False) for k in keys],
                f"{_fmt(best[1])} ({best[0]})" if best else "-",
                fmt_mb(_total(mine, "bytes_sent")), fmt_mb(_total(mine, "bytes_received")),
                fmt_seconds(_total(mine, "wall_time")),
            ])
        text = "\n".join([title, "", *facts, "", ""])
        text += format_table(header, table, markdown=True) + "\n" if table else "No metrics.\n"
        atomic_write(self.run_dir / SUMMARY_FILE, text)
        return text

    # ------------------------------------------------------------------ plots

    def plot(self) -> list[Path]:
        """Write PNG curves to ``plots/``; returns the files written.

        One figure per (split, metric) - ``test_accuracy.png``,
        ``train_loss.png`` ... - with a line per participant (the server's
        bold), and ``communication.png`` with cumulative MB sent / received.
        """
        rows = [r for r in self.rows() if _is_number(r.get("round"))]
        if not rows:
            return []
        # Figures are made without pyplot: no global state, no GUI backend, thread-safe.
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self.plots_dir.mkdir(parents=True, exist_ok=True)
        names = participant_order(r.get("participant", "?") for r in rows)
        written: list[Path] = []
        series_keys: set[tuple[str, str]] = set()
        for r in rows:
            split = "test" if is_eval(r) else "train"
            for k, v in r.items():
                if _is_number(v) and (k == "loss" or k not in NON_METRIC_KEYS):
                    series_keys.add((split, k))
        for split, key in sorted(series_keys):
            fig = Figure(figsize=(6, 4))
            ax = fig.subplots()
            for name in names:
                points = [(r["round"], r[key]) for r in rows
                          if r.get("participant", "?") == name and _is_number(r.get(key))
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
            written.append(_save(fig, self.plots_dir / f"{split}_{_safe(key)}.png"))
        fig = Figure(figsize=(11, 4))
        axes = fig.subplots(1, 2)
        drew = False
        for ax, key, label in ((axes[0], "bytes_sent", "sent"),
                               (axes[1], "bytes_received", "received")):
            for name in names:
                per_round: dict[int, float] = {}
                for r in rows:
                    if r.get("participant", "?") == name and _is_number(r.get(key)):
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
            written.append(_save(fig, self.plots_dir / "communication.png"))
        return written

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_dir(self, round: int) -> Path:
        """``checkpoints/round_{round:04d}`` (created if missing)."""
        folder = self.checkpoints / f"round_{round:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def mark_complete(self, round: int, extra: dict[str, Any] | None = None) -> None:
        """Record ``round`` as completed in ``checkpoints/latest.json`` (atomically)."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        info = {"round": int(round), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "checkpoint": f"round_{round:04d}", **{k: _plain(v) for k, v in
                                                        (extra or {}).items()}}
        atomic_write(self.checkpoints / LATEST_FILE, json.dumps(info, indent=2) + "\n")

    def latest(self) -> dict[str, Any] | None:
        """Contents of ``latest.json`` (None if no round was completed)."""
        path = self.checkpoints / LATEST_FILE
        if not path.exists():
            return None
        try:
            info = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); delete it to start over") from None
        if not isinstance(info, dict) or not isinstance(info.get("round"), int):
            raise ValueError(f"{path} has no integer 'round'; delete it to start over")
        return info

    def last_complete_round(self) -> int:
        """The last round marked complete (0 if none)."""
        info = self.latest()
        return int(info["round"]) if info else 0

    def round_dirs(self) -> list[tuple[int, Path]]:
        """``(round, folder)`` of every ``checkpoints/round_NNNN``, by round."""
        if not self.checkpoints.is_dir():
            return []
        found = []
        for child in self.checkpoints.iterdir():
            m = _ROUND_DIR.match(child.name)
            if m and child.is_dir():
                found.append((int(m.group(1)), child))
        return sorted(found)

    def prune_checkpoints(self, keep: int = 2) -> None:
        """Delete all but the ``keep`` newest completed rounds' checkpoint folders.

        Folders of rounds after the last completed one (an interrupted round)
        are left alone; the last completed round's folder is always kept.
        """
        keep = max(1, keep)
        done = self.last_complete_round()
        complete = [(rnd, path) for rnd, path in self.round_dirs() if rnd <= done]
        for _, path in complete[:-keep]:
            shutil.rmtree(path)


# --------------------------------------------------------------------------- module helpers


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Parse a metrics.jsonl file; a truncated last line is skipped with a warning."""
    lines = path.read_text(encoding="utf-8").splitlines()
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
    server = _total([r for r in rows if r.get("participant") == "server"], "wall_time")
    if server is not None:
        return float(server)
    per_round: dict[Any, float] = {}
    for r in rows:
        if _is_number(r.get("wall_time")):
            key = r.get("round")
            per_round[key] = max(per_round.get(key, 0.0), float(r["wall_time"]))
    return sum(per_round.values()) if per_round else None


def time_breakdown(rows: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """Where a run's time went: ``wall`` (:func:`run_wall_time`), the seconds of each
    phase of :mod:`fedkt.timing` summed over every participant's rows (``<phase>_seconds``),
    and ``other``: the wall time no phase covers (0 when the phases add up to more, as
    clients working in parallel on other machines can); ``saved``: the seconds reused
    results spared (``<phase>_saved_seconds``, :mod:`fedkt.reuse`; not in the wall time).
    None without a wall time."""
    from fedkt.timing import PHASES, SAVED

    wall = run_wall_time(rows)
    if wall is None:
        return None
    out = {"wall": wall}
    for name in (*PHASES, *SAVED):
        out[name] = sum(float(r[f"{name}_seconds"]) for r in rows
                        if _is_number(r.get(f"{name}_seconds")))
    out["other"] = max(0.0, wall - sum(out[name] for name in PHASES))
    out["saved"] = sum(out.pop(name) for name in SAVED)
    return out


def mean_breakdown(runs: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """The mean of several runs' :func:`time_breakdown` (those that have one)."""
    have = [r for r in runs if r is not None]
    if not have:
        return None
    return {k: sum(r[k] for r in have) / len(have) for k in have[0]}


def breakdown_table(named: Sequence[tuple[str, dict[str, float] | None]]) -> str:
    """A markdown table of :func:`time_breakdown` results: seconds and share of the wall
    time per phase, one line per name, and the seconds reused results spared."""
    from fedkt.timing import PHASES

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


def _line_style(name: str) -> dict[str, Any]:
    return {"linewidth": 2.8, "color": "black", "zorder": 3} if name == "server" \
        else {"linewidth": 1.2, "alpha": 0.85}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def atomic_write(path: Path, data: str | bytes | Callable[[Path], object], *,
                 mode: int | None = None, durable: bool = True) -> None:
    """Write ``path`` via a temporary file beside it and ``os.replace``: a reader sees the
    old file or the whole new one, never a part; a failed write leaves no temporary file.

    ``data``: text (UTF-8), bytes, or a function that writes the file at the path it is
    given (``lambda tmp: save_file(tensors, str(tmp))``).  ``mode``: the new file's
    permissions (``0o600``: a private key; text and bytes have them from the file's
    creation on, less the umask); None: the default.
    ``durable``: fsync before the rename, so that the new file survives a power loss too.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if callable(data):
            data(tmp)
            if mode is not None:  # the writer may create the file its own way
                os.chmod(tmp, mode)
            if durable:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        else:
            raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o666 if mode is None else mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- the lock


class RunFolderBusy(FileExistsError):
    """Another process holds the run folder's lock (it is running or resuming there)."""


_HELD: dict[Path, list[int]] = {}  # run folders this process has locked: [fd, depth]


@contextmanager
def run_lock(run_dir: Path | str) -> Iterator[None]:
    """Hold ``run_dir``'s lock (an exclusive ``flock`` on ``.fedkt.lock``) for the block.

    A second process that asks for it is refused at once with :class:`RunFolderBusy`,
    naming the folder and the process that holds it.  Within one process the lock is
    re-entrant (``fedkt run`` takes it before checking the folder, the run loop again).
    The lock goes with the process: a killed run leaves no stale lock.
    """
    path = Path(run_dir).resolve()
    held = _HELD.get(path)
    if held is not None:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows): no lock
        yield
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunFolderBusy(
            f"run folder {run_dir} is in use by another fedkt process ({owner}): wait for it "
            "to finish, or choose another folder (--output-dir)") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
    _HELD[path] = [fd, 1]
    try:
        yield
    finally:
        _HELD[path][1] -= 1
        if _HELD[path][1] == 0:
            del _HELD[path]
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def clear_run_dir(run_dir: Path | str) -> None:
    """Remove everything in ``run_dir`` but its lock file (``fedkt run --overwrite``)."""
    for child in Path(run_dir).iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
