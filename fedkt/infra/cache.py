"""fedkt's on-disk cache, safe to share between processes that run at once.

The cache lives in ``$FEDKT_CACHE`` or ``~/.cache/fedkt`` (:func:`cache_dir`). Every
entry (a file or a folder) is written through :func:`cached` or :func:`cache_entry`,
which give two guarantees when several fedkt processes use the same cache:

* an entry path exists only when the entry is complete: it is built under a unique
  temporary name in the same folder (``.<name>.tmp-<pid>-<random>``) and published
  with one ``rename``, so a reader never sees a file or folder still being written;
* an entry is built once: the builder holds an exclusive ``flock`` on ``<entry>.lock``
  and checks again for the entry after taking it, so a second process asking for the
  same entry waits and then reads the first one's result. The kernel releases the
  lock when a builder dies; its temporary leftovers are deleted by the next builder
  of that entry. Each entry has its own lock, so unrelated entries build in parallel.
  The builder writes its pid into the lock file; a caller that gives a ``wait`` bound
  is told at WARNING whom it waits for, and gets :class:`EntryBusy` once that process is
  dead or stopped (``SIGSTOP``, Ctrl-Z) or the bound has passed.

Without ``fcntl`` (Windows) entries are still published atomically, but two processes
may both build the same entry (the last rename wins; both results are complete).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CACHE_ERRORS", "CacheBuild", "EntryBusy", "cache_dir", "cache_entry", "cached",
           "entry_lock"]

T = TypeVar("T")

#: What a ``load`` function may raise for an unusable entry (it is then rebuilt).
CACHE_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError)

_log = logging.getLogger(__name__)
# seconds a wait for another process's entry goes on before it is reported at WARNING
WARN_AFTER = 10.0


def cache_dir(*parts: str) -> Path:
    """The fedkt cache folder (``$FEDKT_CACHE`` or ``~/.cache/fedkt``), joined with ``parts``."""
    root = os.environ.get("FEDKT_CACHE") or os.path.join(Path.home(), ".cache", "fedkt")
    path = Path(root).expanduser().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


class EntryBusy(TimeoutError):
    """Another process holds an entry's lock and will not finish it in time (it is dead or
    stopped, or the wait's bound passed): build the value without the cache."""


def _holder(fd: int) -> int | None:
    """The pid the lock's holder wrote into the lock file (None: none, or unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _state(pid: int | None) -> str:
    """``dead``, ``stopped`` or ``running`` (also for a pid not known or not readable)."""
    if pid is None:
        return "running"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except OSError:  # another user's process: alive
        return "running"
    try:  # /proc/<pid>/stat: "pid (name) S ...", the state after the last ')'
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "running"
    return {"Z": "dead", "X": "dead", "T": "stopped", "t": "stopped"}.get(state, "running")


def _take(fd: int, path: Path, wait: float | None) -> None:
    """Take the lock on ``fd``: blocking (``wait`` None), or polling until the holder is
    dead or stopped or ``wait`` seconds have passed (then :class:`EntryBusy`)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    pid = _holder(fd)
    who = f"process {pid}" if pid is not None else "another process"
    if wait is None:
        _log.info("waiting for %s: %s is building it", path, who)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    # INFO at first: within one run a client often waits seconds for a sibling's identical
    # entry; a WARNING once the wait is long enough to look like a stall
    _log.info("waiting for %s: %s is building it (at most %.0f s; then it is computed here)",
              path, who, wait)
    start = time.monotonic()
    deadline = start + wait
    warned = False
    seen: tuple[int | None, str] | None = None
    while True:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if not warned and time.monotonic() - start >= WARN_AFTER:
            warned = True
            _log.warning("still waiting for %s: %s is building it (%.0f s so far; at most "
                         "%.0f s, then it is computed here)", path, who,
                         time.monotonic() - start, wait)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        pid = _holder(fd) or pid
        state = _state(pid)
        # dead or stopped twice in a row (a new holder may not have written its pid yet)
        given_up = state != "running" and seen == (pid, state)
        seen = (pid, state)
        if given_up or time.monotonic() >= deadline:
            why = f"process {pid} is {state}" if state != "running" else \
                f"{who} has not finished it in {wait:.0f} s"
            _log.warning("not waiting for %s any longer: %s; computing it here, without the "
                         "cache", path, why)
            raise EntryBusy(f"{path}: {why}")


@contextlib.contextmanager
def entry_lock(path: str | os.PathLike[str], wait: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (blocks while another process holds it;
    with ``wait``, at most that long and only while the holder runs: :class:`EntryBusy`)."""
    path = Path(path)
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if fcntl is not None:
            try:
                _take(fd, path, wait)
            except BaseException:
                os.close(fd)
                fd = -1
                raise
            with contextlib.suppress(OSError):  # who builds it, for those who wait
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        if fd >= 0:
            if fcntl is not None:
                with contextlib.suppress(OSError):  # no builder now: an empty lock file
                    os.ftruncate(fd, 0)
                # Explicit unlock: a child forked meanwhile would otherwise keep the lock.
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _remove(path: Path) -> None:
    """Delete a file or folder if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _clean_stale(path: Path) -> None:
    """Delete temporaries of ``path`` left by killed builders (call with its lock held)."""
    with contextlib.suppress(FileNotFoundError):
        for leftover in path.parent.glob(_temp_prefix(path) + "*"):
            _log.info("removing a stale cache temporary: %s", leftover)
            _remove(leftover)


def _publish(tmp: Path, path: Path) -> None:
    """Move the complete ``tmp`` to ``path`` in one rename (replacing an unusable entry)."""
    # An existing entry is one our check refused. os.replace swaps a file atomically; a
    # folder cannot be swapped, so it is moved aside first (readers then briefly find
    # no entry, take the lock and wait for us).
    if os.path.lexists(path) and ((path.is_dir() and not path.is_symlink()) or tmp.is_dir()):
        old = path.with_name(f"{_temp_prefix(path)}old-{uuid.uuid4().hex[:8]}")
        os.rename(path, old)
        _remove(old)
    try:
        os.replace(tmp, path)
    except OSError:
        # A folder that appeared meanwhile (a writer that does not lock): keep it.
        if not path.is_dir():
            raise
        _remove(tmp)


class CacheBuild:
    """A cache entry being built: write it (file or folder) at :attr:`tmp`.

    It is published when the ``with cache_entry(...)`` block ends without an error, or
    earlier by :meth:`publish` (e.g. to write a marker next to it under the lock).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(
            f"{_temp_prefix(path)}{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}"
        )
        self.published = False

    def publish(self) -> None:
        """Rename :attr:`tmp` to the entry path (once)."""
        if self.published:
            return
        if not os.path.lexists(self.tmp):
            raise FileNotFoundError(f"the cache build of {self.path} wrote nothing to {self.tmp}")
        _publish(self.tmp, self.path)
        self.published = True


def _exists(path: Path) -> bool:
    return os.path.lexists(path)


@contextlib.contextmanager
def cache_entry(
    path: str | os.PathLike[str], valid: Callable[[Path], bool] | None = None,
    wait: float | None = None,
) -> Iterator[CacheBuild | None]:
    """Build the entry at ``path`` unless a usable one exists.

    Yields ``None`` when ``valid(path)`` holds (default: the path exists), checked
    first without the lock and again with it; otherwise, with ``path``'s lock held, a
    :class:`CacheBuild` whose ``tmp`` the block writes. On a clean exit the entry is
    published; on an error the temporary is deleted and no entry appears.  ``wait``: see
    :func:`entry_lock`.
    """
    path = Path(path)
    ok = valid or _exists
    if ok(path):
        yield None
        return
    with entry_lock(path, wait):
        if ok(path):  # another process built it while we waited
            yield None
            return
        _clean_stale(path)
        build = CacheBuild(path)
        try:
            yield build
            build.publish()
        finally:
            if not build.published:
                _remove(build.tmp)


def cached(
    path: str | os.PathLike[str],
    build: Callable[[Path], T],
    load: Callable[[Path], T],
    errors: tuple[type[BaseException], ...] = CACHE_ERRORS,
    wait: float | None = None,
) -> T:
    """``load(path)`` of a usable entry, else ``build(tmp)``'s value after publishing it.

    ``build`` writes the complete entry at the path it is given (a file or a folder,
    under a temporary name) and returns the value (when that is the temporary path,
    the entry's path is returned instead); ``load`` reads an entry, raising
    one of ``errors`` when it is unusable (it is then rebuilt and replaced). At most
    one process builds a given entry at a time; the others wait and load its result
    (with ``wait``, only while the builder runs and at most that long: :class:`EntryBusy`).
    """
    path = Path(path)
    found: list[T] = []

    def usable(p: Path) -> bool:
        if not os.path.lexists(p):
            return False
        try:
            found.append(load(p))
        except errors as exc:
            _log.info("rebuilding the unusable cache entry %s (%s)", p, exc)
            return False
        return True

    with cache_entry(path, usable, wait) as entry:
        if entry is None:
            return found[-1]
        value = build(entry.tmp)
    if isinstance(value, Path) and value == entry.tmp:
        return path  # type: ignore[return-value]
    return value
