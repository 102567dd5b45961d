"""Resuming a run folder: where it resumes (its last complete round, checked), and what a
resume with a changed config records.

:func:`resume_point` changes nothing: it refuses, naming the file at fault, before a
resumed run deletes or overwrites anything (``fedkt resume``; the runner calls it).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedkt.errors import CheckpointError
from fedkt.tracking.checkpoint import read_checkpoint
from fedkt.tracking.folder import LATEST_FILE, RunRecorder

if TYPE_CHECKING:
    from fedkt.config import RunConfig

__all__ = ["RESUMES_FILE", "ResumePoint", "record_changes", "resume_point"]

log = logging.getLogger("fedkt")
RESUMES_FILE = "resumes.jsonl"  # each resume that changed the config: the keys, old and new


@dataclass
class ResumePoint:
    """Where a run resumes: the last complete round and its checked checkpoint."""

    round: int
    folder: Path
    state: dict[str, torch.Tensor]
    holdings: dict[str, Any] | None


def resume_point(cfg: RunConfig, recorder: RunRecorder) -> ResumePoint:
    """Check that the run folder can resume and read its last checkpoint, changing nothing.

    Raises :class:`~fedkt.errors.CheckpointError` naming the file at fault when
    ``latest.json`` is unreadable, names a round the run does not have, or is older than
    the rows and checkpoints in the folder (resuming would delete later rounds); when
    the checkpoint's files are missing, unreadable, have no recorded SHA-256 or differ
    from it (:func:`fedkt.tracking.checkpoint.read_checkpoint`); or when the config's
    seed differs from the run's.
    """
    latest = recorder.checkpoints / LATEST_FILE
    try:
        info = recorder.latest()
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    done = int(info["round"]) if info else 0
    if not 0 <= done <= cfg.rounds:
        raise CheckpointError(f"{latest}: round {done} is marked complete, but the run has "
                              f"{cfg.rounds} rounds (rounds)")
    seed = info.get("seed") if info else None
    if seed is not None and seed != cfg.seed:
        raise CheckpointError(
            f"seed: the run was checkpointed with seed {seed} ({latest}), the config now says "
            f"{cfg.seed}: a resumed run keeps its seed (start a new run for another one)")
    rows = recorder.rows()  # a malformed line names the file and line
    check_rows(recorder, rows, done, latest)
    later = sorted({int(r["round"]) for r in rows if isinstance(r.get("round"), int)
                    and r["round"] > done + 1}
                   | {rnd for rnd, _ in recorder.round_dirs() if rnd > done + 1})
    if later:
        what = f"round {done} is the last complete one" if info else "no round is complete"
        raise CheckpointError(
            f"{latest}: {what}, but the folder holds round {later[-1]} (metrics.jsonl or "
            f"checkpoints/round_{later[-1]:04d}); resuming would delete it. Restore "
            "latest.json, or start a new run")
    folder = recorder.checkpoints / f"round_{done:04d}"
    if not done:
        return ResumePoint(0, folder, {}, None)
    state, holdings = read_checkpoint(recorder.checkpoints, done, info)
    return ResumePoint(done, folder, state, holdings)


def check_rows(recorder: RunRecorder, rows: list[dict[str, Any]], done: int,
                latest: Path) -> None:
    """Refuse to resume when ``metrics.jsonl`` lost rounds ``latest.json`` marks complete
    (deleted, or cut at a line's end): the run would go on with part of its record."""
    if not done:
        return
    if not recorder.metrics_path.is_file():
        raise CheckpointError(f"{recorder.metrics_path}: missing, but {latest} marks round "
                              f"{done} complete; restore the file, or start a new run")
    logged = {r["round"] for r in rows if r.get("participant") == "server"
              and r.get("split") == "train" and isinstance(r.get("round"), int)}
    lost = [rnd for rnd in range(1, done + 1) if rnd not in logged]
    if lost:
        shown = ", ".join(map(str, lost[:10])) + (", ..." if len(lost) > 10 else "")
        raise CheckpointError(
            f"{recorder.metrics_path}: has no rows of round{'s' if len(lost) > 1 else ''} "
            f"{shown}, which {latest} marks complete (the file was cut or changed); restore "
            "it, or start a new run")


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def changed_keys(saved: dict[str, Any], cfg: RunConfig) -> dict[str, list[Any]]:
    """Each dotted key of a kept ``config.yaml`` (``saved``) whose value ``cfg`` changes:
    ``[before, after]``, in ``saved``'s order.  Keys of ``saved`` only: a key added to
    fedkt since the run began is no change."""
    before = _flat(saved)
    after = _flat(cfg.model_dump(mode="json"))
    return {k: [v, after.get(k)] for k, v in before.items() if v != after.get(k)}


def record_changes(cfg: RunConfig, recorder: RunRecorder, done: int) -> None:
    """A resumed run whose config differs from ``config.yaml`` (an edit, or ``resume
    --set``): the changed keys go to ``resumes.jsonl`` and the new config to config.yaml."""
    changed = {k: v for k, v in sorted(changed_keys(recorder.config(), cfg).items())
               if k != "output_dir"}
    if not changed:
        return
    log.warning("resuming with a changed config: %s", ", ".join(changed))
    line = json.dumps({"after_round": done, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "changed": changed})
    with (recorder.run_dir / RESUMES_FILE).open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    recorder.save_config(cfg.to_yaml())
