"""The job: what every runtime runs where the server is, over its transport.

``run_job`` drives a method's server procedure (``Server.round``) round by round over
any transport: it seeds each round, logs per-participant metrics and traffic (a
:class:`~fedkt.runtime.report.RoundReport`), checkpoints the server after every
completed round (:mod:`fedkt.tracking.checkpoint`) and resumes from the last one
(:mod:`fedkt.tracking.resume`).  A runtime calls it (:mod:`fedkt.runtime.registry`);
:func:`fedkt.runner.run` only picks the runtime.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedkt.config import RunConfig
from fedkt.errors import CheckpointError
from fedkt.eval import predictions
from fedkt.eval.harness import run_after_job
from fedkt.evidence.paired_table import round0_summary
from fedkt.infra import progress
from fedkt.infra.environment import ENVIRONMENT_FILE, environment
from fedkt.infra.memory import peak_rss_mb
from fedkt.infra.precision import resolve_precision, resolved_precision, set_threads
from fedkt.infra.timing import Clock, clocks, eval_clock, now, phase_seconds
from fedkt.methods import get_method
from fedkt.methods.base import (
    Method,
    RoundError,
    Server,
    broadcast,
    privacy_spent,
    seed_everything,
)
from fedkt.runtime.base import RuntimeClients, Traffic, Transport
from fedkt.runtime.report import round_report, server_participants, split_metrics
from fedkt.tracking import checkpoint
from fedkt.tracking.folder import (
    HOLDINGS,
    SERVER_STATE,
    RunRecorder,
    atomic_write,
    run_lock,
)
from fedkt.tracking.resume import record_changes, resume_point
from fedkt.tracking.summary import read_environment
from fedkt.tracking.trackers import Tracking, open_tracking

log = logging.getLogger("fedkt")


def run_job(
    cfg: RunConfig,
    transport: Transport,
    *,
    resume: bool = False,
    quiet: bool = False,
    run_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) a job; returns the metrics rows of the whole run.

    The run folder's lock (:func:`fedkt.tracking.run_lock`) is held throughout: a second
    process writing the same folder is refused.
    """
    run_dir = Path(run_dir or cfg.run_dir)
    with run_lock(run_dir):
        recorder = RunRecorder(run_dir, resume=resume, repair=False)
        # the server's progress bars say whose they are; trackers mirror the run folder
        with progress.participant("server"), open_tracking(cfg, run_dir, resume) as tracking:
            recorder.mirrors.append(tracking.row)
            return _run_job(cfg, transport, recorder, tracking, resume=resume, quiet=quiet)


def _run_job(cfg: RunConfig, transport: Transport, recorder: RunRecorder, tracking: Tracking,
             *, resume: bool, quiet: bool) -> list[dict[str, Any]]:
    run_dir = recorder.run_dir
    set_threads(cfg.runtime.torch_threads)
    resolve_precision(cfg.training.precision, cfg.runtime.device)  # fp16 without CUDA fails here
    method = get_method(cfg.method.name)
    seed_everything(cfg.seed)
    # Before any work (and before anything in the folder changes): is the folder resumable?
    point = resume_point(cfg, recorder) if resume else None
    server = method.server(cfg, run_dir)
    server.data()  # load and validate the data before any work: errors name file and field
    server.setup()

    start = 1
    if point is not None:
        done = point.round
        if done:
            state_file = point.folder / SERVER_STATE
            try:
                server.load_state_dict(point.state)
            except (RuntimeError, KeyError, ValueError, TypeError) as exc:
                raise CheckpointError(f"{state_file}: does not fit this run's server "
                                      f"({type(exc).__name__}: {str(exc)[:300]})") from None
            if point.holdings is not None:  # what each client held after that round
                try:
                    server.holdings.load_state_dict(point.holdings)
                except (AttributeError, KeyError, ValueError, TypeError) as exc:
                    raise CheckpointError(f"{point.folder / HOLDINGS}: not a holdings record "
                                          f"({type(exc).__name__}: {exc})") from None
        recorder.repair_tail(done)
        recorder.truncate_after(done if done else -1)  # before round 1: redo round 0 too
        record_changes(cfg, recorder, done)
        start = done + 1
        if not quiet:
            print(f"resuming {run_dir} after round {done} of {cfg.rounds}")
    else:
        recorder.save_config(cfg.to_yaml())
    _record_environment(run_dir, start, cfg)
    tracking.config()

    clients = RuntimeClients(cfg, transport)
    if start == 1 and evaluates_round0(cfg):
        _round0(cfg, method, server, clients, recorder, quiet)
    for rnd in range(start, cfg.rounds + 1):
        t0 = time.perf_counter()
        evaluate = rnd % cfg.eval.every == 0 or rnd == cfg.rounds
        clients.start_round(rnd, evaluate)
        seed_everything(server.seed(rnd))
        started, evaluated, phases = now(), eval_clock(), clocks()
        server_metrics = split_metrics(server.round(rnd, clients) or {})
        traffic = clients.traffic
        # The server's own work: the round without waiting for clients or evaluating.
        compute = (now() - started) - traffic.wait - (
            eval_clock() - evaluated - traffic.wait_phases.get("eval", Clock()))
        if spent := privacy_spent(cfg, rnd):  # the privacy budget each client has spent
            server_metrics.setdefault("train", {}).update(spent)
        server_eval = _server_evaluate(cfg, server, recorder, rnd) if evaluate else {}
        sums = checkpoint.write_checkpoint(recorder, server.state_dict(),
                                           server.holdings.state_dict(), rnd)
        timing = {"wall_time": time.perf_counter() - t0, "compute_time": max(0.0, compute.wall),
                  "compute_cpu": max(0.0, compute.cpu),
                  **_server_phases(phases, traffic.wait_phases)}
        report = round_report(rnd, server_metrics, server_eval, clients.ids, traffic, timing)
        recorder.log_rows(report.rows())
        _client_predictions(cfg, server, recorder, rnd, traffic)
        checkpoint.mark_checkpoint(recorder, rnd, cfg.seed, sums)  # the round is complete
        _record_round_end(run_dir)
        if not quiet:
            print(recorder.round_table(rnd), flush=True)
    summary = recorder.summary()
    if not quiet:
        print(summary)
    tracking.summary(summary)
    if cfg.eval.plots:
        recorder.plot()
    if cfg.eval.harness:  # lm-evaluation-harness on the final models (fedkt[harness])
        run_after_job(cfg, run_dir, server, quiet=quiet)
    if cfg.eval.compare_round0 and not quiet:
        print(_round0_comparison(cfg, run_dir), flush=True)
    return recorder.rows()


def evaluates_round0(cfg: RunConfig) -> bool:
    """Whether the run evaluates every participant before training (``eval.round0``)."""
    if cfg.eval.round0 is None:
        return cfg.method.name != "zero_shot"
    return cfg.eval.round0


def _round0_comparison(cfg: RunConfig, run_dir: Path) -> str:
    """``eval.compare_round0``: the round 0 -> final table with paired CIs."""
    if not evaluates_round0(cfg):
        return (f"eval.compare_round0: method {cfg.method.name!r} has no round 0 evaluation "
                "(set eval.round0: true)")
    return "\n" + round0_summary(run_dir)


def _server_evaluate(cfg: RunConfig, server: Server, recorder: RunRecorder, rnd: int
                     ) -> dict[str, dict[str, float]]:
    """``server.evaluate(rnd)`` as ``{participant: metrics}``, writing the per-example
    predictions of each server-side participant to the run folder."""
    with predictions.capture() as tables:
        metrics = server_participants(server.evaluate(rnd))
    if metrics and tables and cfg.eval.predictions:
        own: dict[str, Any] = {}
        for scope_name, table in tables.items():
            if scope_name and scope_name in metrics:  # a participant of its own
                predictions.write_predictions(recorder.run_dir, rnd, scope_name, {"": table})
            else:
                own[scope_name] = table
        if own:
            predictions.write_predictions(recorder.run_dir, rnd, "server", own)
    return metrics


def _client_predictions(cfg: RunConfig, server: Server, recorder: RunRecorder, rnd: int,
                        traffic: Traffic) -> None:
    """The clients' per-example tables of round ``rnd`` into the run folder
    (:func:`fedkt.eval.predictions.write_client_predictions`), with ``eval.predictions``."""
    if cfg.eval.predictions and any(traffic.predictions.values()):
        test_ids = {str(r["id"]) for r in server.data().test}
        predictions.write_client_predictions(recorder.run_dir, rnd, traffic.predictions,
                                             test_ids)


def _round0(cfg: RunConfig, method: Method, server: Server, clients: RuntimeClients,
            recorder: RunRecorder, quiet: bool) -> None:
    """Round 0: every participant's model evaluated before any training (zero-shot).

    Clients take part when the method has an ``evaluate`` handler (their initial
    models); nothing is trained and no checkpoint is written.
    """
    t0, phases = time.perf_counter(), clocks()
    clients.start_round(0, True)
    clients.ids = cfg.client_ids()  # every participant, whatever clients.fraction samples
    if "evaluate" in method.handlers and cfg.eval.clients:
        try:  # a client that cannot evaluate is logged as excluded; it never stops the run
            broadcast(clients, "evaluate", evaluate=True)
        except RoundError as exc:
            log.warning("round 0: %s", exc)
    server_eval = _server_evaluate(cfg, server, recorder, 0)
    traffic = clients.traffic
    wall = {"wall_time": time.perf_counter() - t0, **_server_phases(phases, traffic.wait_phases)}
    report = round_report(0, {}, server_eval, clients.ids, traffic, wall)
    recorder.log_rows(report.evaluation_rows())
    _client_predictions(cfg, server, recorder, 0, traffic)
    if not quiet:
        print(recorder.round_table(0), flush=True)


def _server_phases(before: dict[str, Clock], clients: dict[str, Clock]) -> dict[str, float]:
    """The server's own seconds per phase since ``before``: without the phases its clients
    ran in this process while it waited for them (the local runtime)."""
    names = set(before) | set(clients)
    return phase_seconds({k: before.get(k, Clock()) + clients.get(k, Clock()) for k in names},
                         clocks())


def _client_threads(cfg: RunConfig) -> dict[str, Any]:
    """The torch threads clients compute with, as ``environment.json`` records them."""
    if cfg.runtime.name == "local":
        from fedkt.runtime.local import threads_record

        return threads_record(cfg)
    if cfg.runtime.torch_threads:
        return {"client_threads": cfg.runtime.torch_threads,
                "client_threads_from": f"runtime.torch_threads={cfg.runtime.torch_threads}"}
    return {"client_threads": None, "client_threads_from": (
        "each client process's default (flower-sim: its actor's client_cpus; flower: its "
        "machine's physical cores)")}


def _precision(cfg: RunConfig) -> dict[str, str]:
    """The arithmetic the run computes in, as ``environment.json`` records it:
    ``training.precision`` (``precision``) and what it resolved to on the run's device
    (``autocast``: bf16, fp16 or fp32), which ``auto`` makes a fact of the machine."""
    return {"precision": cfg.training.precision,
            "autocast": resolved_precision(cfg.training.precision, cfg.runtime.device)}


#: An entry's keys that are not the machine's: the first round it computed, its processes'
#: peak memory, and ``spans``: when each process computed its rounds, ``[start, end]`` in
#: UTC (ISO 8601, to the second; the end moved on after every round), which a suite's
#: wall time is read from (:func:`fedkt.evidence.wall.suite_wall`).
_PER_PROCESS = ("from_round", "peak_rss_mb", "spans")


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _record_round_end(run_dir: Path) -> None:
    """After each round, in the last ``environment.json`` entry: ``peak_rss_mb``, the
    largest resident memory of the processes that computed its rounds (this one's so far;
    under the local runtime with one client worker every participant's, otherwise the
    server process's), and the end of this process's span, now."""
    entries = read_environment(run_dir)
    if not entries:
        return
    peak = peak_rss_mb()
    if peak is not None:
        entries[-1]["peak_rss_mb"] = max(peak, float(entries[-1].get("peak_rss_mb") or 0.0))
    spans = entries[-1].get("spans")
    if isinstance(spans, list) and spans and isinstance(spans[-1], list):
        spans[-1] = [spans[-1][0], _utc_now()]
    atomic_write(run_dir / ENVIRONMENT_FILE, json.dumps(entries, indent=1) + "\n")


def _record_environment(run_dir: Path, start: int, cfg: RunConfig | None = None) -> None:
    """``environment.json``: where the rounds from ``start`` on are computed (a list: a run
    resumed elsewhere gets a second entry; rounds before it came from the first). It is
    the server process's machine: in the local and flower-sim runtimes every participant's,
    deployed (`flower`) only the server's; ``torch_threads`` are the server's, and with
    ``cfg`` the clients' are recorded too (``client_threads``, and what set them).  This
    process begins a span (``spans``) in the entry, a resume on the same machine one more
    in the same entry."""
    entries = [e for e in read_environment(run_dir) if start > 1
               and int(e.get("from_round", 1)) < start]
    here = environment() | (_client_threads(cfg) | _precision(cfg) if cfg is not None else {})
    span = [_utc_now()] * 2
    if entries and {k: v for k, v in entries[-1].items() if k not in _PER_PROCESS} == here:
        entries[-1]["spans"] = [*(entries[-1].get("spans") or []), span]
    else:
        entries.append({"from_round": start, **here, "spans": [span]})
    atomic_write(run_dir / ENVIRONMENT_FILE, json.dumps(entries, indent=1) + "\n")

