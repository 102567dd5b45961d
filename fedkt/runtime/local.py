"""The ``local`` runtime: clients run on this machine, in this process one after another,
or with ``runtime.local.client_workers: N`` up to N at once in worker processes.

Requests and replies still go through the wire format, so byte counts and
results are identical to the Flower runtimes.  Client state is kept on disk
under the run folder, as a deployed client keeps it on its own machine; so a client
may run in any worker from one round to the next.  Every client computes with
``runtime.local.client_threads`` torch threads wherever it runs (:func:`client_threads`),
and ``runtime.timeout`` is enforced (:class:`LocalTransport`; docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from fedkt.config import RunConfig
from fedkt.runtime.base import default_state_root, handle_request

__all__ = ["LocalTransport", "client_threads", "client_workers", "start", "threads_record",
           "unusable_after", "worker_threads"]


def worker_threads(workers: int, cores: int | None = None) -> int:
    """torch threads of each of ``workers`` worker processes: the physical cores (or
    ``$OMP_NUM_THREADS`` when set: :func:`~fedkt.infra.precision.default_threads`) shared
    out, at least one (``runtime.torch_threads``, when set, still wins in each)."""
    if cores is None:
        from fedkt.infra.precision import default_threads

        cores = default_threads()
    return max(1, cores // max(1, workers))


def _start_worker(threads: int, parent: int, workers: int) -> None:
    """A worker process's set-up: its share of the cores, a line of its own for progress
    bars (tqdm reads ``TQDM_POSITION``), and the ``FEDKT_PLUGINS`` methods and readers.
    Ctrl-C is the run's to handle (it stops the workers): a worker ignores it, and ends
    when the run's process is gone (killed: nothing would read its replies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # fedkt's default_threads reads it
    number = multiprocessing.current_process().name.rpartition("-")[2]  # SpawnProcess-3
    os.environ["TQDM_POSITION"] = str((int(number) - 1) % workers + 1 if number.isdigit() else 1)
    import torch
    from tqdm import tqdm

    from fedkt.infra.plugins import import_plugins

    torch.set_num_threads(threads)
    tqdm.set_lock(threading.RLock())  # not tqdm's default, a semaphore a killed worker leaks
    import_plugins()


def _end_with(parent: int, every: float = 1.0) -> None:
    """Exit this process once ``parent`` is no longer its parent."""
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)


def _handle(data: bytes, state_root: Path | None, cid: int, threads: int | None,
            started: str | None) -> bytes:
    """A worker's task: the client's handler, after writing ``<started>/<cid>`` (this pid
    and the time: the run's process times the client from then on)."""
    if started:
        Path(started, str(cid)).write_text(f"{os.getpid()} {time.time()!r}")
    return handle_request(data, state_root, cid, allow_remote_code=True, threads=threads,
                          fatal=unusable_after)


def unusable_after(exc: BaseException) -> bool:
    """Whether a process is unusable after ``exc`` (out of memory, or oneDNN unable to
    build a kernel, as when a neighbour leaked memory): its worker is replaced."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("could not create a primitive", "can't allocate memory",
                            "out of memory"))


def _ready() -> None:
    """A task that only makes its worker start."""


def _pool(workers: int, threads: int) -> ProcessPoolExecutor:
    """``workers`` worker processes of ``threads`` torch threads each (``spawn``: a fresh
    interpreter each, never a fork of this one's threads)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker,
                               initargs=(threads, os.getpid(), workers))


# A client's outcome in a worker: its reply (bytes), the handler's error that left its
# worker unusable, a TimeoutError (runtime.timeout: its worker was killed), or None (its
# worker pool broke under it: a worker died, not necessarily its own).
Outcome = bytes | BaseException | None


def _started(folder: Path, cid: int) -> tuple[int, float] | None:
    """(pid, time) a worker wrote when it started client ``cid`` (None: not started)."""
    try:
        pid, at = Path(folder, str(cid)).read_text().split()
        return int(pid), float(at)
    except (OSError, ValueError):
        return None


def _collect(futures: dict[int, Future[bytes]], timeout: float, folder: Path
             ) -> dict[int, Outcome]:
    """Each client's outcome; a client still running ``timeout`` seconds after its worker
    started it has its worker killed (SIGKILL: a stopped worker too), which breaks the pool
    under the clients still running beside it (None)."""
    out: dict[int, Outcome] = {}
    pending = dict(futures)
    while pending:
        wait(list(pending.values()), timeout=0.25, return_when=FIRST_COMPLETED)
        for cid, future in list(pending.items()):
            if future.done():
                del pending[cid]
                try:
                    out[cid] = future.result()
                except BrokenProcessPool:
                    out[cid] = None
                except Exception as exc:  # noqa: BLE001 - the server excludes the client
                    out[cid] = exc
                continue
            begun = _started(folder, cid)
            if begun is not None and time.time() - begun[1] > timeout:
                del pending[cid]
                out[cid] = TimeoutError(
                    f"client {cid} did not answer within runtime.timeout ({timeout:g} s); its "
                    f"worker process ({begun[0]}) was killed and the round went on without it")
                with contextlib.suppress(OSError):
                    os.kill(begun[0], signal.SIGKILL)
    return out


def _failed(outcome: Outcome) -> bool:
    """Whether ``outcome`` leaves its pool unusable (a worker dead, killed or spent)."""
    return outcome is None or isinstance(outcome, TimeoutError) or (
        isinstance(outcome, BaseException) and unusable_after(outcome))


class LocalTransport:
    """In-process transport (no Ray, no servers); with ``workers`` > 1, a pool of that many
    worker processes (started with the run by :meth:`start_workers`, or by the first
    exchange, and kept for the run) runs the clients of an exchange at once.

    Every client computes with ``threads`` torch threads (None: the process default),
    in a worker as here.  A failed worker (it died, ran out of memory, or ran past
    ``timeout``: then it is killed) takes the pool with it: the pool is replaced, every
    client that did not finish runs again, each alone in a new worker, and only a client
    that fails again is excluded, named.  In this process (``workers`` 1) a client past
    ``timeout`` is interrupted at its next Python line (SIGALRM, in the main thread;
    :func:`fedkt.runtime.base._deadline`) and excluded; a call in C that never returns is
    not interrupted (workers are: they are killed).

    Its clients run model code the config asks for (``trust_remote_code``): they share the
    process, or the machine, and the config, of the one who started the run."""

    def __init__(self, state_root: Path | None = None, workers: int = 1,
                 threads: int | None = None) -> None:
        self.state_root = state_root
        self.workers = workers
        self.threads = threads
        self._pool: ProcessPoolExecutor | None = None
        self._folder: Path | None = None  # where workers say which client they started
        self._exchanges = 0

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        # In order of client id, each reply a function of its request and the client's
        # stored state only: the same replies in a worker as here.
        if self.workers <= 1:
            return {cid: self._here(cid, data, timeout) for cid, data in sorted(requests.items())}
        replies = self._run(self._workers(), requests, timeout)
        failed = [cid for cid, outcome in replies.items() if _failed(outcome)]
        if not failed:
            return replies  # type: ignore[return-value]
        self.close(kill=True)  # a worker died, was killed or is spent: a new pool after
        threads = self._worker_threads()
        for cid in failed:
            if isinstance(replies[cid], TimeoutError):
                continue  # it had its time: excluded
            alone = _pool(1, threads)  # each again, alone: only one that fails again is out
            try:
                replies |= self._run(alone, {cid: requests[cid]}, timeout)
            finally:
                _kill(alone)
            outcome = replies[cid]
            if outcome is None:
                replies[cid] = RuntimeError(
                    f"client {cid}'s worker process ended while it ran (killed, or it "
                    "exited); the local runtime's other clients were run again without it")
            elif isinstance(outcome, BaseException) and _failed(outcome) \
                    and not isinstance(outcome, TimeoutError):
                replies[cid] = RuntimeError(
                    f"client {cid} left its worker process unusable ({type(outcome).__name__}: "
                    f"{str(outcome)[:300]}); the local runtime's other clients were run again "
                    "in new workers without it")
        return replies  # type: ignore[return-value]

    def _here(self, cid: int, data: bytes, timeout: float) -> bytes:
        """Client ``cid``'s request in this process, under ``threads`` torch threads (this
        process's count restored after) and ``timeout``."""
        import torch

        before = torch.get_num_threads()
        try:
            return handle_request(data, self.state_root, cid, allow_remote_code=True,
                                  threads=self.threads, timeout=timeout)
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)

    def _run(self, pool: ProcessPoolExecutor, requests: dict[int, bytes], timeout: float
             ) -> dict[int, Outcome]:
        """``requests`` on ``pool``'s workers, each client's outcome (:func:`_collect`)."""
        import tempfile

        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="fedkt-workers-"))
        self._exchanges += 1
        folder = self._folder / str(self._exchanges)
        folder.mkdir()
        try:
            return _collect({cid: pool.submit(_handle, data, self.state_root, cid, self.threads,
                                              str(folder))
                             for cid, data in sorted(requests.items())}, timeout, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def start_workers(self) -> None:
        """Start the worker processes now, if ``workers`` > 1 (they import torch and fedkt
        while the server sets up); else on the first exchange."""
        if self.workers > 1:
            self._workers()

    def _worker_threads(self) -> int:
        return self.threads or worker_threads(self.workers)

    def _workers(self) -> ProcessPoolExecutor:
        """The pool of ``workers`` processes, started if none runs: every client runs in a
        worker of the same threads, however many clients an exchange asks."""
        if self._pool is None:
            self._pool = _pool(self.workers, self._worker_threads())
            for _ in range(self.workers):  # a process starts for each task submitted
                self._pool.submit(_ready)
        return self._pool

    def secagg_grid(self, cids: list[int]) -> tuple[object, dict[int, int]]:
        """An in-process Flower grid for SecAgg+ (:mod:`fedkt.runtime.secagg`) and the
        clients' node ids on it (its clients run in this process, one after another)."""
        from fedkt.runtime.secagg import LocalGrid

        grid = LocalGrid(lambda cid, data: handle_request(data, self.state_root, cid,
                                                          allow_remote_code=True,
                                                          threads=self.threads))
        return grid, {cid: LocalGrid.node(cid) for cid in cids}

    def close(self, *, kill: bool = False) -> None:
        """Stop the worker processes, if any (a later exchange starts new ones): after their
        tasks, or with ``kill`` at once (the run was interrupted or failed)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if self._pool is None:
            return
        if kill:
            _kill(self._pool)
        else:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None


def _kill(pool: ProcessPoolExecutor) -> None:
    """End ``pool``'s workers at once (a stopped one too) and shut it down."""
    if hasattr(pool, "kill_workers"):  # Python 3.14+
        pool.kill_workers()
    else:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError):
                process.kill()
    pool.shutdown(wait=True, cancel_futures=True)  # killed: returns at once


def client_threads(cfg: RunConfig, workers: int | None = None) -> int:
    """torch threads each client computes with under the local runtime:
    ``runtime.torch_threads`` when set, else ``runtime.local.client_threads``, whose
    ``auto`` is the physical cores shared out over the workers (:func:`worker_threads`:
    all of them with one worker, so ``auto`` depends on the worker count)."""
    if cfg.runtime.torch_threads:
        return cfg.runtime.torch_threads
    setting = cfg.runtime.local.client_threads
    if setting != "auto":
        return int(setting)
    return worker_threads(workers if workers is not None else client_workers(cfg))


def client_workers(cfg: RunConfig) -> int:
    """Worker processes the run starts: ``runtime.local.client_workers``, at most one per
    client (more could never be busy)."""
    return max(1, min(cfg.runtime.local.client_workers, cfg.clients.num_clients))


def threads_record(cfg: RunConfig) -> dict[str, Any]:
    """What ``environment.json`` records of the clients' threads under the local runtime."""
    workers = client_workers(cfg)
    setting = (f"runtime.torch_threads={cfg.runtime.torch_threads}" if cfg.runtime.torch_threads
               else f"runtime.local.client_threads={cfg.runtime.local.client_threads}")
    return {"client_threads": client_threads(cfg, workers), "client_workers": workers,
            "client_threads_from": setting + (
                f" (the physical cores over {workers} worker(s): another worker count "
                "gives other threads, and other numbers)"
                if setting.endswith("=auto") else "")}


def start(cfg: RunConfig, job: Any, *, resume: bool = False, quiet: bool = False
          ) -> list[dict[str, Any]]:
    """The ``local`` runtime: the job here, its clients in this process or in
    ``runtime.local.client_workers`` worker processes."""
    workers = client_workers(cfg)
    transport = LocalTransport(default_state_root(cfg), workers=workers,
                               threads=client_threads(cfg, workers))
    transport.start_workers()
    try:
        rows = job(cfg, transport, resume=resume, quiet=quiet)
    except BaseException:  # Ctrl-C or a failed round: the workers' work is lost anyway
        transport.close(kill=True)
        raise
    transport.close()
    return rows
