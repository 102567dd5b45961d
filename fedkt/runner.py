"""The run loop shared by every method and runtime.

``run_job`` drives a method's server procedure round by round over any
transport: it seeds each round, logs per-participant metrics and traffic,
checkpoints the server after every completed round and resumes from the last
one.  :func:`run` picks the transport the config names.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fedkt.config import RunConfig
from fedkt.methods import get_method
from fedkt.methods.base import seed_everything
from fedkt.precision import resolve_precision, set_threads
from fedkt.privacy import upload_epsilon
from fedkt.runtime.base import RuntimeClients, Transport
from fedkt.runtime.base import default_state_root as client_state_root
from fedkt.tracking import RunRecorder

log = logging.getLogger("fedkt")

SERVER_STATE = "server.safetensors"


def _split_metrics(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{"train/loss": 1, "test/accuracy": .5}`` -> ``{"train": {...}, "test": {...}}``."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        split, _, name = key.rpartition("/")
        out.setdefault(split or "train", {})[name] = value
    return out


def run_job(
    cfg: RunConfig,
    transport: Transport,
    *,
    resume: bool = False,
    quiet: bool = False,
    run_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) a job; returns the metrics rows of the whole run."""
    run_dir = Path(run_dir or cfg.run_dir)
    recorder = RunRecorder(run_dir, resume=resume)
    set_threads(cfg.runtime.torch_threads)
    resolve_precision(cfg.training.precision, cfg.runtime.device)  # fp16 without CUDA fails here
    method = get_method(cfg.method.name)
    seed_everything(cfg.seed)
    server = method.server(cfg, run_dir)
    server.data()  # load and validate the data before any work: errors name file and field
    server.setup()

    start = 1
    if resume:
        done = recorder.last_complete_round()
        if done:
            state_file = recorder.checkpoint_dir(done) / SERVER_STATE
            server.load_state_dict(load_file(str(state_file)) if state_file.exists() else {})
        recorder.truncate_after(done)
        start = done + 1
        if not quiet:
            print(f"resuming {run_dir} after round {done} of {cfg.rounds}")
    else:
        recorder.save_config(cfg.to_yaml())

    clients = RuntimeClients(cfg, transport)
    for rnd in range(start, cfg.rounds + 1):
        t0 = time.perf_counter()
        evaluate = rnd % cfg.eval.every == 0 or rnd == cfg.rounds
        clients.start_round(rnd, evaluate)
        seed_everything(server.seed(rnd))
        server_metrics = _split_metrics(server.round(rnd, clients) or {})
        dp = cfg.differential_privacy
        if dp.enabled:  # the privacy budget each client has spent so far
            server_metrics.setdefault("train", {}).update(
                upload_epsilon(dp.clip_norm, dp.noise_multiplier, dp.delta, rnd))
        if evaluate:
            server_eval = server.evaluate(rnd)
            if server_eval is not None:
                server_metrics.setdefault("test", {}).update(server_eval)
        wall = time.perf_counter() - t0
        traffic = clients.traffic
        recorder.log({"round": rnd, "participant": "server", "split": "train",
                      **server_metrics.get("train", {}),
                      "bytes_sent": sum(traffic.sent.values()),
                      "bytes_received": sum(traffic.received.values()),
                      "clients_replied": len(clients.ids) - len(traffic.excluded),
                      "wall_time": wall})
        if "test" in server_metrics:
            recorder.log({"round": rnd, "participant": "server", "split": "test",
                          **server_metrics["test"]})
        for cid in clients.ids:
            if cid not in traffic.sent:
                continue
            per_split = _split_metrics(traffic.metrics.get(cid, {}))
            row = {"round": rnd, "participant": f"client_{cid}", "split": "train",
                   **per_split.pop("train", {}),
                   "bytes_sent": traffic.received.get(cid, 0),
                   "bytes_received": traffic.sent.get(cid, 0),
                   "wall_time": traffic.seconds.get(cid, 0.0)}
            if cid in traffic.excluded:
                row["excluded"] = traffic.excluded[cid]
            recorder.log(row)
            for split, values in per_split.items():
                recorder.log({"round": rnd, "participant": f"client_{cid}", "split": split, **values})
        _test_pause(rnd)
        _checkpoint(recorder, server.state_dict(), rnd)
        if not quiet:
            print(recorder.round_table(rnd), flush=True)
    if not quiet:
        print(recorder.summary())
    else:
        recorder.summary()
    recorder.plot()
    return recorder.rows()


def _test_pause(rnd: int) -> None:
    """Test hook: with ``FEDKT_PAUSE_IN_ROUND=N`` the server stops for
    ``FEDKT_PAUSE_SECONDS`` (default 600) in round N, after the clients replied and
    the round's metrics rows were written but before its checkpoint, and says so on
    stderr; tests kill the process there (tests/test_kill_resume.py)."""
    if os.environ.get("FEDKT_PAUSE_IN_ROUND", "") == str(rnd):
        print(f"fedkt: FEDKT_PAUSE_IN_ROUND={rnd}: pausing before the checkpoint",
              file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("FEDKT_PAUSE_SECONDS", "600")))


def _checkpoint(recorder: RunRecorder, state: dict[str, torch.Tensor], rnd: int) -> None:
    folder = recorder.checkpoint_dir(rnd)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (SERVER_STATE + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, folder / SERVER_STATE)
    recorder.mark_complete(rnd, {"state": SERVER_STATE})
    recorder.prune_checkpoints(keep=2)


def run(cfg: RunConfig, *, resume: bool = False, quiet: bool = False) -> list[dict[str, Any]]:
    """Run a job on the runtime its config names."""
    name = cfg.runtime.name
    if name == "local":
        from fedkt.runtime.local import LocalTransport

        return run_job(cfg, LocalTransport(client_state_root(cfg)), resume=resume, quiet=quiet)
    if name == "flower-sim":
        from fedkt.runtime.flower_sim import run_simulation_job

        return run_simulation_job(cfg, resume=resume, quiet=quiet)
    if name == "flower":
        from fedkt.runtime.flower_deploy import submit_job

        return submit_job(cfg, resume=resume, quiet=quiet)
    raise ValueError(f"runtime.name: unknown runtime {name!r}")


def final_metrics(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Last test metrics of each participant (for comparing runs)."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if row.get("split") == "test":
            out[row["participant"]] = {k: v for k, v in row.items()
                                       if k not in ("round", "participant", "split")}
    return json.loads(json.dumps(out))
