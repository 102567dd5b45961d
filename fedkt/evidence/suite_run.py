"""``fedkt suite run``: what is missing of a suite, run as ``fedkt`` processes
(``--jobs N`` at once, each with ``cores / N`` torch threads), kept as each finishes
(``--keep``), taken from other folders where they hold the same runs (``--runs-from``),
stopped between runs at a time (``--stop-by``, :mod:`fedkt.evidence.deadline`); then the
suite's table (:mod:`fedkt.evidence.suite_report`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fedkt.config import RunConfig
from fedkt.evidence.deadline import SuiteStopped, why_not_start
from fedkt.evidence.invocations import record_invocation
from fedkt.evidence.suite import load_suite, plan_runs, run_state, write_suite_file
from fedkt.evidence.suite_keep import arm_wall, check_kept_suite, keep_runs, take_runs
from fedkt.evidence.suite_report import report_suite
from fedkt.infra.precision import physical_cores

__all__ = [
    "run_suite",
]

def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_suite(path: str | Path, *, jobs: int = 1, output_dir: str | Path | None = None,
              quiet: bool = False, rerun_changed: bool = False,
              keep: str | Path | None = None,
              runs_from: Sequence[str | Path] = (), command: str | None = None,
              folds: Sequence[int] | None = None, stop_by: float | None = None) -> Path:
    """Run what is missing of a suite, then write its table and plots; returns the folder.

    A run of the folder made with another config than the suite file now gives it (an
    edited suite file) is refused by name with the keys that differ, before anything
    runs; ``rerun_changed`` runs those again from the start instead.  ``keep`` is a
    folder the finished runs' records are kept into (:func:`keep_runs`) as each run
    finishes, so a suite stopped at any point has kept every run it finished; a folder
    :func:`keep_runs` would refuse is refused before anything runs, and the runs it holds
    that the suite folder lacks are taken from it (:func:`take_runs`), so a suite goes on
    from its kept folder into a new working folder without running them again.
    ``runs_from``: suite folders whose finished runs this suite would make itself (the
    same config and setting) are taken from them (:func:`take_runs`) rather than run
    again.  ``command``: the command line to record in the folder
    (:mod:`fedkt.evidence.invocations`), which the report names.  ``folds``: run only
    these of the suite's folds (:func:`only_folds`).  ``stop_by``: a time (seconds since
    the epoch) by which the suite ends: a run is started only if its arm's mean wall time
    here fits before it (:mod:`fedkt.evidence.deadline`); at the first that does not, no
    more start, the runs going finish, and :class:`~fedkt.evidence.deadline.SuiteStopped`
    is raised instead of writing the table."""
    suite = load_suite(path, output_dir, folds)
    threads = max(1, physical_cores() // max(1, jobs))
    # The suite as run, its base inlined, so `fedkt suite report DIR` needs nothing else.
    dumped = suite.cfg.model_dump(exclude={"seeds"} if suite.cfg.folds is not None else None)
    kept = Path(keep) if keep is not None and (Path(keep) / "suite.yaml").is_file() else None
    if kept is not None:  # refused here, before any run, where keeping would be refused
        check_kept_suite(suite, kept, dumped)
        plan_runs(load_suite(path, kept, folds), threads=threads)  # this config and setting
    sources = list(runs_from)
    if kept is not None and kept.resolve() != suite.folder.resolve():
        sources.append(kept)  # going on from a kept folder: its runs are not run again
    from_kept: set[tuple[str, int]] = set()
    if sources:
        taken, refused = take_runs(suite, sources, threads=threads)
        from_kept = {(arm, seed) for arm, seed, source in taken if kept is not None
                     and source.resolve().is_relative_to(kept.resolve())}
        if not quiet:
            for arm, seed, source in taken:
                print(f"suite {suite.cfg.name}: {arm} seed {seed}: taken from {source}")
            for line in refused:
                print(f"suite {suite.cfg.name}: not taken: {line}")
    todo = plan_runs(suite, rerun_changed=rerun_changed, quiet=quiet, threads=threads)
    suite.folder.mkdir(parents=True, exist_ok=True)
    write_suite_file(f"# copied from {suite.source}\n"
                     + yaml.safe_dump(dumped, sort_keys=False), suite.folder / "suite.yaml")
    failures: list[str] = []
    finished = [k for k, cfg in suite.runs.items() if k not in from_kept
                and run_state(suite.run_dir(*k), cfg.rounds) == "done"]
    if keep is not None and finished:  # what DIR lacks (what came from it is there)
        keep_runs(suite.folder, keep, only=finished)
    if command is not None and todo:  # it runs something: after every refusal above
        record_invocation(suite.folder, command)
    running: list[tuple[str, int, subprocess.Popen, Any, float]] = []
    log_dir = suite.folder / "logs"
    conf_dir = suite.folder / "configs"
    log_dir.mkdir(exist_ok=True)
    conf_dir.mkdir(exist_ok=True)

    def start(arm: str, seed: int, cfg: RunConfig, state: str) -> None:
        run_dir = suite.run_dir(arm, seed)
        conf = conf_dir / f"{arm}_seed{seed}.yaml"
        conf.write_text(cfg.to_yaml())
        # The config's own thread count wins (results can depend on it); else split cores.
        sets = ["-q"] if cfg.runtime.torch_threads else [
            "--set", f"runtime.torch_threads={threads}", "-q"]
        if state == "started":  # continue from its last checkpointed round
            cmd = [sys.executable, "-m", "fedkt.cli", "resume", str(run_dir), *sets]
        else:
            cmd = [sys.executable, "-m", "fedkt.cli", "run", str(conf), "--overwrite", *sets]
        if not quiet:
            print(f"suite {suite.cfg.name}: {arm} seed {seed}: "
                  f"{'resuming' if state == 'started' else 'running'}", flush=True)
        log = (log_dir / f"{arm}_seed{seed}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        running.append((arm, seed, proc, log, time.perf_counter()))

    def reap() -> None:
        for item in list(running):
            arm, seed, proc, log, t0 = item
            label = f"{arm} seed {seed}"
            code = proc.poll()
            if code is None:
                continue
            running.remove(item)
            log.close()
            if code != 0:
                failures.append(f"{label} (exit {code}; see {log.name})")
                continue
            if not quiet:
                print(f"suite {suite.cfg.name}: {label}: finished in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            if keep is not None:
                try:  # the runs go on: a run not kept is named at the end
                    keep_runs(suite.folder, keep, only=[(arm, seed)])
                except (OSError, ValueError) as exc:
                    failures.append(f"{label} not kept into {keep}: {exc}")
                    print(f"suite {suite.cfg.name}: {label}: not kept: {exc}",
                          file=sys.stderr, flush=True)
                else:
                    if not quiet:
                        print(f"suite {suite.cfg.name}: {label}: kept into {keep}",
                              flush=True)

    # `kill` (SIGTERM) stops a suite like Ctrl-C: its runs are killed and resumed next time.
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    stopped = ""
    try:
        for index, item in enumerate(todo):
            while len(running) >= max(1, jobs):
                time.sleep(0.2)
                reap()
            arm, seed = item[0], item[1]
            why = None if stop_by is None else why_not_start(arm_wall(suite, arm), stop_by,
                                                             time.time())
            if why is not None:
                stopped = (f"{arm} seed {seed} not started: {why}; {len(todo) - index} "
                           "run(s) left, the same command goes on")
                if not quiet:
                    print(f"suite {suite.cfg.name}: stopping: {stopped}", flush=True)
                break
            start(*item)
        while running:
            time.sleep(0.2)
            reap()
    except BaseException:  # Ctrl-C or an error: stop the runs; a rerun resumes them
        for _, _, proc, log, _ in running:
            proc.kill()
            proc.wait()
            log.close()
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    if stopped:  # no table: the suite goes on later (a failed run is named first)
        if failures:
            raise RuntimeError("suite runs failed: " + "; ".join(failures)
                               + f"; then stopped: {stopped}")
        raise SuiteStopped(f"suite {suite.cfg.name}: {stopped}")
    # some folds (--fold): the folder's suite.yaml, which holds the folds run before too
    text = report_suite(suite.folder, suite=suite if folds is None else None)
    if not quiet:
        print(text)
    if failures:
        raise RuntimeError("suite runs failed: " + "; ".join(failures))
    return suite.folder
