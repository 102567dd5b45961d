"""Experiment trackers: the run mirrored to TensorBoard and MLflow (``tracking:``).

The run folder stays the record (:mod:`fedkt.tracking`); a tracker gets a copy of it as
it is written, from the server's run loop, so every runtime (``local``, ``flower-sim``,
``flower``) tracks the same way and clients need none of it:

* every ``metrics.jsonl`` row: each numeric value as the scalar
  ``<participant>/<split>/<key>`` at step = the row's round (``client_0/test/accuracy``
  at step 2);
* the resolved config: ``config.yaml`` (MLflow: an artifact and the flattened keys as
  params; TensorBoard: a text entry), and the run's tags;
* the final summary (``summary.md``: an artifact, a text entry).

A resumed run goes on in the same MLflow run (its id is kept in ``RUN_DIR/trackers.json``)
and the same TensorBoard folder; the rows of the round that was re-run appear twice, at
the same step.  Backends are optional extras (``fedkt[mlflow]``, ``fedkt[tensorboard]``);
the config check names the extra when one is missing.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedkt.config import RunConfig
from fedkt.tracking.folder import atomic_write, optional_output

__all__ = ["MLflowTracker", "TensorBoardTracker", "Tracking", "open_tracking", "scalars"]

STATE_FILE = "trackers.json"  # in the run folder: the MLflow run id, for resume
_SKIP = frozenset({"round", "participant", "split"})
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def scalars(row: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """A metrics row as (step, ``{participant/split/key: value}``) of its numeric values."""
    step = row.get("round")
    step = int(step) if isinstance(step, int | float) and not isinstance(step, bool) else 0
    prefix = f"{row.get('participant', 'run')}/{row.get('split', 'test')}/"
    out = {}
    for key, value in row.items():
        if key in _SKIP or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[_BAD_CHARS.sub("_", prefix + str(key))] = float(value)
    return step, out


def flat_config(data: Any, prefix: str = "") -> dict[str, str]:
    """A config dict as ``{"training.lr": "0.002", ...}`` (lists as JSON)."""
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flat_config(value, f"{prefix}{key}."))
        return out
    out[prefix.rstrip(".")] = json.dumps(data) if isinstance(data, list) else str(data)
    return out


class TensorBoardTracker:
    """Event files written with ``torch.utils.tensorboard`` (needs ``tensorboard``)."""

    name = "tensorboard"

    def __init__(self, cfg: RunConfig, run_dir: Path, state: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = cfg.tracking.tensorboard.dir
        self.log_dir = Path(folder) if folder else run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def config(self, cfg: RunConfig, tags: dict[str, str], resumed: bool) -> None:
        self.writer.add_text("config", _as_code(cfg.to_yaml()))
        if tags:
            self.writer.add_text("tags", "\n".join(f"- {k}: {v}" for k, v in tags.items()))

    def row(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def summary(self, text: str) -> None:
        self.writer.add_text("summary", text)

    def close(self, ok: bool) -> None:
        self.writer.close()


class MLflowTracker:
    """One MLflow run through ``MlflowClient`` (no global active run: runs in one process
    never mix)."""

    name = "mlflow"

    def __init__(self, cfg: RunConfig, run_dir: Path, state: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        settings = cfg.tracking.mlflow
        uri = settings.uri or os.environ.get("MLFLOW_TRACKING_URI") or str(
            run_dir.resolve().parent / "mlruns")
        if "://" not in uri and not uri.startswith("file:"):
            uri = Path(uri).resolve().as_uri()  # a folder: MLflow's file store
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode and asks for this opt-in.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = settings.experiment or cfg.name
        self.run_id: str | None = state.get("mlflow_run_id")
        self.resumed = False
        if self.run_id is not None:
            try:
                self.client.update_run(self.run_id, status="RUNNING")
                self.resumed = True
            except Exception:  # noqa: BLE001 - not in this store (deleted, another URI)
                self.run_id = None
        if self.run_id is None:
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                try:
                    exp_id = self.client.create_experiment(experiment)
                except Exception:  # noqa: BLE001 - another run of a suite created it first
                    found = self.client.get_experiment_by_name(experiment)
                    if found is None:
                        raise
                    exp_id = found.experiment_id
            else:
                exp_id = found.experiment_id
            run = self.client.create_run(exp_id, run_name=cfg.tracking.run_name or cfg.name,
                                         tags=dict(cfg.tracking.tags))
            self.run_id = run.info.run_id
        state["mlflow_run_id"] = self.run_id
        state["mlflow_uri"] = self.uri

    def config(self, cfg: RunConfig, tags: dict[str, str], resumed: bool) -> None:
        from mlflow.entities import Param, RunTag

        self.client.log_text(self.run_id, cfg.to_yaml(), "config.yaml")
        if self.resumed:  # params were logged by the first start, and cannot change
            return
        params = [Param(k[:250], v[:6000]) for k, v in
                  flat_config(cfg.model_dump(mode="json")).items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 params a batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def row(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def summary(self, text: str) -> None:
        self.client.log_text(self.run_id, text, "summary.md")

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


BACKENDS = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker}


class Tracking:
    """Every configured tracker, fed together (nothing at all without ``tracking``)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool) -> None:
        self.cfg = cfg
        self.state_path = run_dir / STATE_FILE
        state: dict[str, Any] = {}
        if resume and self.state_path.exists():
            state = json.loads(self.state_path.read_text())
        self.trackers = [BACKENDS[name](cfg, run_dir, state) for name in cfg.tracking.backends]
        if self.trackers:
            atomic_write(self.state_path, json.dumps(state, indent=2) + "\n")
        self.resumed = resume
        self._failed: set[int] = set()  # id() of the trackers whose writes failed

    def _working(self) -> list[Any]:
        """The trackers whose writes have not failed (a failed one is skipped from then on)."""
        return [t for t in self.trackers if id(t) not in self._failed]

    @contextmanager
    def _optional(self, tracker: Any) -> Iterator[None]:
        """A tracker's write: an ``OSError`` (a full disk) warns once, naming the tracker and
        where it writes, and turns that tracker off; the run and the other trackers go on."""
        failed = True
        with optional_output(_mirror(tracker)):
            yield
            failed = False
        if failed:
            self._failed.add(id(tracker))

    def tags(self) -> dict[str, str]:
        return {"method": self.cfg.method.name, "seed": str(self.cfg.seed),
                **self.cfg.tracking.tags}

    def config(self) -> None:
        for t in self._working():
            with self._optional(t):
                t.config(self.cfg, self.tags(), self.resumed)

    def row(self, row: dict[str, Any]) -> None:
        step, values = scalars(row)
        for t in self._working():
            with self._optional(t):
                t.row(step, values)

    def summary(self, text: str) -> None:
        for t in self._working():
            with self._optional(t):
                t.summary(text)

    def close(self, ok: bool) -> None:
        for t in self.trackers:  # a failed one too: its files and threads are released
            with self._optional(t):
                t.close(ok)


def _mirror(tracker: Any) -> str:
    """A tracker and where it writes, for a warning: ``tensorboard mirror (runs/x/tensorboard)``."""
    where = getattr(tracker, "log_dir", None) or getattr(tracker, "uri", None)
    return f"{tracker.name} mirror" + (f" ({where})" if where else "")


@contextmanager
def open_tracking(cfg: RunConfig, run_dir: Path, resume: bool) -> Iterator[Tracking]:
    """The run's trackers, closed at the end (an MLflow run marked FAILED on an error)."""
    tracking = Tracking(cfg, run_dir, resume)
    ok = False
    try:
        yield tracking
        ok = True
    finally:
        tracking.close(ok)


def _as_code(text: str) -> str:
    """Markdown code block (TensorBoard renders text entries as markdown)."""
    return "\n".join("    " + line for line in text.splitlines())
