"""The ``local`` runtime: clients run on this machine, in this process one after another,
or with ``runtime.local.client_workers: N`` up to N at once in worker processes.

Requests and replies still go through the wire format, so byte counts and
results are identical to the Flower runtimes.  Client state is kept on disk
under the run folder, as a deployed client keeps it on its own machine; so a client
may run in any worker from one round to the next.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from fedkt.config import RunConfig
from fedkt.runtime.base import default_state_root, handle_request

__all__ = ["LocalTransport", "start", "worker_threads"]


def worker_threads(workers: int, cores: int | None = None) -> int:
    """torch threads of each of ``workers`` worker processes: the physical cores shared
    out, at least one (``runtime.torch_threads``, when set, still wins in each)."""
    if cores is None:
        from fedkt.infra.precision import physical_cores

        cores = physical_cores()
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


def _handle(data: bytes, state_root: Path | None, cid: int) -> bytes:
    return handle_request(data, state_root, cid, allow_remote_code=True)


def _ready() -> None:
    """A task that only makes its worker start."""


def _pool(workers: int, threads: int) -> ProcessPoolExecutor:
    """``workers`` worker processes of ``threads`` torch threads each (``spawn``: a fresh
    interpreter each, never a fork of this one's threads)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker,
                               initargs=(threads, os.getpid(), workers))


def _collect(futures: dict[int, Future[bytes]]) -> dict[int, bytes | BaseException | None]:
    """Each client's reply or error; None where its worker pool broke (a worker died, so
    every client not yet finished lost its reply, not only the one that killed it)."""
    replies: dict[int, bytes | BaseException | None] = {}
    for cid, future in futures.items():
        try:
            replies[cid] = future.result()
        except BrokenProcessPool:
            replies[cid] = None
        except Exception as exc:  # noqa: BLE001 - the server excludes the client
            replies[cid] = exc
    return replies


class LocalTransport:
    """In-process transport (no Ray, no servers); with ``workers`` > 1, a pool of that many
    worker processes (started with the run by :meth:`start_workers`, or by the first
    exchange, and kept for the run) runs the clients of an exchange at once.  A worker that dies takes the replies of the clients beside it
    with it: those run again, each alone in a new worker, and only a client whose worker
    dies again is excluded.

    Its clients run model code the config asks for (``trust_remote_code``): they share the
    process, or the machine, and the config, of the one who started the run."""

    def __init__(self, state_root: Path | None = None, workers: int = 1) -> None:
        self.state_root = state_root
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        # In order of client id, each reply a function of its request and the client's
        # stored state only: the same replies in a worker as here.  `timeout` is not enforced.
        if self.workers <= 1:
            return {cid: handle_request(data, self.state_root, cid, allow_remote_code=True)
                    for cid, data in sorted(requests.items())}
        pool = self._workers()
        replies = _collect({cid: pool.submit(_handle, data, self.state_root, cid)
                            for cid, data in sorted(requests.items())})
        lost = [cid for cid, reply in replies.items() if reply is None]
        if lost:  # a worker died (os._exit, the OOM killer), and the pool with it
            self.close()
            threads = worker_threads(self.workers)
            for cid in lost:  # each again, alone: only the one that dies again is excluded
                alone = _pool(1, threads)
                try:
                    replies |= _collect({cid: alone.submit(_handle, requests[cid],
                                                           self.state_root, cid)})
                finally:
                    alone.shutdown(wait=True, cancel_futures=True)
                if replies[cid] is None:
                    replies[cid] = RuntimeError(
                        f"client {cid}'s worker process ended while it ran (killed, or it "
                        "exited); the local runtime's other clients were run again without it")
        return {cid: reply for cid, reply in replies.items() if reply is not None}

    def start_workers(self) -> None:
        """Start the worker processes now, if ``workers`` > 1 (they import torch and fedkt
        while the server sets up); else on the first exchange."""
        if self.workers > 1:
            self._workers()

    def _workers(self) -> ProcessPoolExecutor:
        """The pool of ``workers`` processes, started if none runs: every client runs in a
        worker of the same threads, however many clients an exchange asks."""
        if self._pool is None:
            self._pool = _pool(self.workers, worker_threads(self.workers))
            for _ in range(self.workers):  # a process starts for each task submitted
                self._pool.submit(_ready)
        return self._pool

    def secagg_grid(self, cids: list[int]) -> tuple[object, dict[int, int]]:
        """An in-process Flower grid for SecAgg+ (:mod:`fedkt.runtime.secagg`) and the
        clients' node ids on it (its clients run in this process, one after another)."""
        from fedkt.runtime.secagg import LocalGrid

        grid = LocalGrid(lambda cid, data: handle_request(data, self.state_root, cid,
                                                          allow_remote_code=True))
        return grid, {cid: LocalGrid.node(cid) for cid in cids}

    def close(self, *, kill: bool = False) -> None:
        """Stop the worker processes, if any (a later exchange starts new ones): after their
        tasks, or with ``kill`` at once (the run was interrupted or failed)."""
        if self._pool is None:
            return
        if kill and hasattr(self._pool, "kill_workers"):  # Python 3.14+
            self._pool.kill_workers()
        elif kill:
            for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                process.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)  # killed: returns at once
        self._pool = None


def start(cfg: RunConfig, job: Any, *, resume: bool = False, quiet: bool = False
          ) -> list[dict[str, Any]]:
    """The ``local`` runtime: the job here, its clients in this process or in
    ``runtime.local.client_workers`` worker processes."""
    transport = LocalTransport(default_state_root(cfg), workers=cfg.runtime.local.client_workers)
    transport.start_workers()
    try:
        rows = job(cfg, transport, resume=resume, quiet=quiet)
    except BaseException:  # Ctrl-C or a failed round: the workers' work is lost anyway
        transport.close(kill=True)
        raise
    transport.close()
    return rows
