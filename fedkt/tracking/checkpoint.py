"""Checked checkpoints: the SHA-256 of every file a round's checkpoint holds, recorded when
it is written and checked by every reader (``fedkt resume``, ``fedkt eval``, ``fedkt
export``, the lm-evaluation-harness step).

A checkpoint folder ``checkpoints/round_NNNN/`` holds ``server.safetensors``,
``holdings.json`` and ``sha256.json`` (the SHA-256 of the other two); ``latest.json``
records the same sums for the last complete round.  A reader compares each file with
every record it finds and refuses, naming the file, when one differs or when no record
is found at all: a checksum is required, not optional.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from fedkt.errors import CheckpointError, NonFiniteError
from fedkt.infra.timing import timed
from fedkt.tracking.folder import HOLDINGS, LATEST_FILE, SERVER_STATE, RunRecorder, atomic_write

__all__ = ["SUMS_FILE", "check_finite", "mark_checkpoint", "read_checkpoint", "record_sums",
           "sha256_of", "write_checkpoint"]

SUMS_FILE = "sha256.json"  # in each checkpoint folder: the SHA-256 of its files
_CHECKED = (SERVER_STATE, HOLDINGS)


def sha256_of(path: Path) -> str:
    """A file's SHA-256, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_sums(folder: Path) -> dict[str, str]:
    """Write ``folder/sha256.json`` with the SHA-256 of the checkpoint's files; return it."""
    sums = {name: sha256_of(folder / name) for name in _CHECKED}
    atomic_write(folder / SUMS_FILE, json.dumps(sums, indent=1, sort_keys=True) + "\n")
    return sums


def _records(checkpoints: Path, rnd: int, latest: dict[str, Any] | None
             ) -> list[tuple[Path, dict[str, Any]]]:
    """Where round ``rnd``'s checksums are recorded: ``latest.json`` (its round only) and
    the folder's ``sha256.json``."""
    found: list[tuple[Path, dict[str, Any]]] = []
    if latest and latest.get("round") == rnd and isinstance(latest.get("sha256"), dict):
        found.append((checkpoints / LATEST_FILE, latest["sha256"]))
    sums_file = checkpoints / f"round_{rnd:04d}" / SUMS_FILE
    if sums_file.is_file():
        found.append((sums_file, _json_object(sums_file)))
    return found


def _json_object(path: Path) -> dict[str, Any]:
    """``path``'s JSON object, or a :class:`~fedkt.errors.CheckpointError` naming it."""
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return data


def read_checkpoint(checkpoints: Path, rnd: int, latest: dict[str, Any] | None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """Round ``rnd``'s server state and holdings (None: no holdings file), each file
    checked against every recorded SHA-256 (``latest``: the parsed ``latest.json``).

    Raises :class:`~fedkt.errors.CheckpointError` naming the file when it is missing, no
    checksum is recorded for it, it differs from a recorded one, or it is unreadable."""
    folder = checkpoints / f"round_{rnd:04d}"
    state_file, holdings_file = folder / SERVER_STATE, folder / HOLDINGS
    if not state_file.is_file():
        raise CheckpointError(f"{state_file}: missing (round {rnd}'s checkpoint)")
    records = _records(checkpoints, rnd, latest)
    if not records:
        raise CheckpointError(
            f"{state_file}: no SHA-256 is recorded for it ({checkpoints / LATEST_FILE} has "
            f"none for round {rnd} and {folder / SUMS_FILE} is missing), so it cannot be "
            "checked; a checkpoint is only read when it can")
    for path in (state_file, holdings_file):
        got = sha256_of(path) if path.is_file() else None
        for source, sums in records:
            want = sums.get(path.name)
            if want is None:
                raise CheckpointError(f"{source}: records no SHA-256 of {path}")
            if got is None:
                raise CheckpointError(f"{path}: missing ({source} records its checksum)")
            if got != want:
                raise CheckpointError(f"{path}: its SHA-256 differs from the one recorded in "
                                      f"{source} (the file is corrupt or was changed)")
    from safetensors.torch import load_file

    try:
        state = load_file(str(state_file))
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint, named
        raise CheckpointError(f"{state_file}: not a readable safetensors file "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None
    holdings = _json_object(holdings_file) if holdings_file.exists() else None
    return state, holdings


def check_finite(state: dict[str, torch.Tensor], path: Path) -> None:
    """Raise :class:`~fedkt.errors.CheckpointError` naming ``path`` and the tensor when a
    floating tensor of ``state`` holds NaN or infinity."""
    for key, t in state.items():
        if (t.is_floating_point() or t.is_complex()) and not torch.isfinite(t).all():
            raise CheckpointError(f"{path}: {key!r} holds non-finite values (NaN or "
                                  "infinity); such a model is not exported")


@timed("checkpoint")
def write_checkpoint(recorder: RunRecorder, state: dict[str, torch.Tensor],
                      holdings: dict[str, dict[str, str]], rnd: int) -> dict[str, str]:
    """Write the server's state and what each client holds for round ``rnd``; return the
    files' SHA-256 (a non-finite tensor raises :class:`~fedkt.errors.NonFiniteError`
    before anything is written).  The round counts as complete only once :func:`mark_checkpoint` ran
    (after its rows are logged), so a crash in between runs the round again."""
    folder = recorder.checkpoint_dir(rnd)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    for key, t in tensors.items():  # a model gone NaN fails the run, not its checkpoint
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"round {rnd}: the server's state {key!r} holds non-finite "
                                 f"values (NaN or infinity); no checkpoint is written to "
                                 f"{folder}")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / SERVER_STATE, lambda tmp: save_tensors(tensors, tmp))
    atomic_write(folder / HOLDINGS, json.dumps(holdings, sort_keys=True))
    return record_sums(folder)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``save_file``, with safetensors' own write error (a full disk) as an ``OSError``,
    which :func:`~fedkt.tracking.folder.atomic_write` names with the checkpoint's path."""
    try:
        save_file(tensors, str(path))
    except SafetensorError as exc:
        text = str(exc)
        found = re.search(r'message: "([^"]{1,200})"', text)
        code = re.search(r"code: (\d+)", text)
        raise OSError(int(code.group(1)) if code else errno.EIO,
                      found.group(1) if found else text[:200]) from None


def mark_checkpoint(recorder: RunRecorder, rnd: int, seed: int, sums: dict[str, str]) -> None:
    """Mark round ``rnd`` complete (``latest.json`` with the files' SHA-256 and the run's
    seed) and keep the last two checkpoints."""
    recorder.mark_complete(rnd, {"state": SERVER_STATE, "seed": seed, "sha256": sums})
    recorder.prune_checkpoints(keep=2)
