"""The run folder: its files, the metrics log, checkpoints, atomic writes and the lock.

Layout of ``run_dir``::

    config.yaml              the validated run config
    environment.json         where its rounds were computed: code, versions, kernels, peak memory
                             (:mod:`fedkt.infra.environment`; a second entry after a resume
                             elsewhere)
    metrics.jsonl            one JSON object per (round, participant, split)
                             (:mod:`fedkt.tracking.rows`)
    summary.md               final summary table (written by ``summary()``,
                             :mod:`fedkt.tracking.summary`)
    plots/*.png              metric and communication curves (``plot()``,
                             :mod:`fedkt.tracking.run_plots`)
    checkpoints/round_0007/  the server's state after round 7 (server.safetensors) and
                             what each client held then (holdings.json)
    checkpoints/latest.json  {"round": 7, "time": ..., ...}: the last completed round
    .fedkt.lock              held (flock) by the one process writing the folder
    predictions/round_0007/  per-example predictions of each participant evaluated in
                             round 7 (server.json.gz, client_0.json.gz, ...; see
                             fedkt.eval.predictions); round_0000 with ``eval.round0``
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedkt.tracking.rows import is_number, plain, read_rows
from fedkt.tracking.run_plots import write_plots
from fedkt.tracking.summary import summary_markdown
from fedkt.tracking.tables import round_table

__all__ = [
    "CONFIG_FILE", "HOLDINGS", "LATEST_FILE", "LOCK_FILE", "METRICS_FILE", "PREDICTIONS_DIR",
    "SERVER_STATE", "SUMMARY_FILE", "WRITTEN", "PlantedLink", "RunFolderBusy", "RunRecorder",
    "optional_output",
    "atomic_write", "clear_run_dir", "holds_files", "is_run_folder", "not_a_run", "refuse_link",
    "refuse_links", "run_lock",
]

METRICS_FILE = "metrics.jsonl"
PREDICTIONS_DIR = "predictions"  # per-example tables (fedkt.eval.predictions)
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.md"
LATEST_FILE = "latest.json"
SERVER_STATE = "server.safetensors"  # the server's state in each checkpoint folder
HOLDINGS = "holdings.json"  # ... and what each client held (fedkt.methods.holdings)
LOCK_FILE = ".fedkt.lock"  # the run folder's lock (run_lock)
_ROUND_DIR = re.compile(r"^round_(\d+)$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # not on Windows
# What fedkt writes or deletes in a run folder: none of it may be a symbolic link.
WRITTEN = (LOCK_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, "checkpoints", PREDICTIONS_DIR,
           "plots", "clients", "resumes.jsonl", "environment.json", "trackers.json")
_WRITTEN_BELOW = ("checkpoints", PREDICTIONS_DIR, "clients")  # ... nor their entries


class PlantedLink(FileExistsError):
    """A path fedkt would write or delete inside a run or export folder is a symbolic
    link; nothing is written through it (the message names the path)."""


def refuse_link(path: Path) -> None:
    """Raise :class:`PlantedLink` if ``path`` is a symbolic link (dangling or not)."""
    if path.is_symlink():
        raise PlantedLink(f"{path}: a symbolic link; fedkt writes nothing through a link "
                          "inside a run or export folder: remove the link (or put a real "
                          "folder there)")


def refuse_links(run_dir: Path | str) -> None:
    """Refuse a run folder where a path fedkt writes (:data:`WRITTEN`, and the entries of
    ``checkpoints/``, ``predictions/`` and ``clients/``) is a symbolic link."""
    folder = Path(run_dir)
    for name in WRITTEN:
        refuse_link(folder / name)
    for name in _WRITTEN_BELOW:
        if (folder / name).is_dir():
            for child in (folder / name).iterdir():
                refuse_link(child)


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` (disk full, ...) as an ``OSError`` whose message starts with ``path``."""
    if exc.filename is not None:
        return exc
    named = OSError(f"{path}: {exc.strerror or exc}; the file was not written")
    named.errno = exc.errno
    return named


@contextmanager
def optional_output(what: str, path: Path | None = None) -> Iterator[None]:
    """An optional output of a run (plots, summary.md, a tracker's mirror): an ``OSError``
    while writing it (a full disk, a read-only folder) is a ``RuntimeWarning`` naming the
    path (``path``, or the error's), and the run goes on. The run's essential files
    (``metrics.jsonl``, checkpoints) are written outside it: their errors stop the run,
    naming the path."""
    try:
        yield
    except OSError as exc:
        named = path if path is not None else exc.filename
        where = f"{named}: " if named and str(named) not in str(exc) else ""
        warnings.warn(f"{what} not written: {where}{exc}; it is optional, the run goes on",
                      RuntimeWarning, stacklevel=3)


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
        refuse_links(self.run_dir)  # before anything in the folder is written or deleted
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
        refuse_links(self.run_dir)
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
        from fedkt.config.bounded_yaml import load_yaml  # here: fedkt.config loads the schema

        data = load_yaml(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ metrics

    def log(self, row: dict[str, Any]) -> None:
        """Append one row to ``metrics.jsonl`` (and hand it to each of :attr:`mirrors`)."""
        if not isinstance(row, dict):
            raise TypeError(f"a metrics row must be a dict, got {type(row).__name__}")
        line = json.dumps({str(k): plain(v) for k, v in row.items()}, default=str)
        try:
            with self.metrics_path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as exc:  # disk full: named
            raise _named(exc, self.metrics_path) from None
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
                if not (is_number(row.get("round")) and row["round"] > round)]
        atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        refuse_link(self.run_dir / PREDICTIONS_DIR)
        for folder in (self.run_dir / PREDICTIONS_DIR).glob("round_*"):
            m = _ROUND_DIR.match(folder.name)
            if m and int(m.group(1)) > round:
                refuse_link(folder)
                shutil.rmtree(folder)

    def log_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        """:meth:`log` each of ``rows``, in order."""
        for row in rows:
            self.log(row)

    # ------------------------------------------------------------------ tables, summary, plots

    def round_table(self, round: int) -> str:
        """Fixed-width table of one round: one line per participant."""
        return round_table(self.rows(), round)

    def summary(self) -> str:
        """Markdown summary of the run (final and best values); also written to summary.md
        (optional: a failed write is a warning naming it, :func:`optional_output`)."""
        text = summary_markdown(self.rows(), self.config(), self.run_dir)
        with optional_output("summary.md", self.run_dir / SUMMARY_FILE):
            atomic_write(self.run_dir / SUMMARY_FILE, text)
        return text

    def plot(self) -> list[Path]:
        """Write PNG curves to ``plots/`` (:func:`~fedkt.tracking.run_plots.write_plots`);
        returns the files written (none where a write failed: a warning names the file)."""
        with optional_output("the plots"):
            return write_plots(self.rows(), self.plots_dir)
        return []

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
                "checkpoint": f"round_{round:04d}", **{k: plain(v) for k, v in
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
            refuse_link(path)  # never delete through a link
            shutil.rmtree(path)


# --------------------------------------------------------------------------- atomic writes


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
        tmp.unlink(missing_ok=True)  # a leftover or planted one: a link is never followed
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
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW,
                         0o666 if mode is None else mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # disk full, read-only: the message names the file
        tmp.unlink(missing_ok=True)
        raise _named(exc, path) from None
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
    lock = Path(run_dir) / LOCK_FILE
    refuse_link(lock)
    try:  # O_NOFOLLOW: a link planted after the check is not followed either
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(lock)
        raise
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


def is_run_folder(run_dir: Path | str) -> bool:
    """Whether ``run_dir`` holds a fedkt run: its ``config.yaml`` beside the lock file,
    ``metrics.jsonl`` or ``checkpoints/latest.json`` (plain files, not links)."""
    folder = Path(run_dir)

    def plain_file(path: Path) -> bool:
        return path.is_file() and not path.is_symlink()

    return plain_file(folder / CONFIG_FILE) and any(
        plain_file(p) for p in (folder / LOCK_FILE, folder / METRICS_FILE,
                                folder / "checkpoints" / LATEST_FILE))


def holds_files(run_dir: Path | str) -> bool:
    """Whether ``run_dir`` holds anything but its lock file (a run killed before it wrote
    its config leaves only that: the folder is then empty of any run)."""
    return any(p.name != LOCK_FILE for p in Path(run_dir).iterdir())


def not_a_run(run_dir: Path | str, overwrite: bool) -> FileExistsError:
    """The refusal to run into a non-empty folder that is not a run folder."""
    if overwrite:
        return FileExistsError(
            f"--overwrite: {run_dir} is not a fedkt run folder (no {CONFIG_FILE} beside "
            f"{LOCK_FILE}, {METRICS_FILE} or checkpoints/{LATEST_FILE}); --overwrite empties "
            "only run folders: choose another folder (--output-dir)")
    return FileExistsError(
        f"run folder {run_dir} is not empty and is not a fedkt run (no {CONFIG_FILE} beside "
        f"{LOCK_FILE}, {METRICS_FILE} or checkpoints/{LATEST_FILE}): choose an empty or new "
        "folder (--output-dir)")


def clear_run_dir(run_dir: Path | str) -> None:
    """Remove everything in ``run_dir`` but its lock file (``fedkt run --overwrite``); a
    folder that is not a run folder (:func:`is_run_folder`) is refused, untouched."""
    if not is_run_folder(run_dir):
        raise not_a_run(run_dir, overwrite=True)
    for child in Path(run_dir).iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
