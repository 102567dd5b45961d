"""``runtime.local.client_workers``: the clients run in worker processes, and a worker that
dies excludes only the client that killed it (that the numbers are those of clients run one
after another: tests/runtime/test_local.py, same seed same numbers)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Literal

import pytest
import torch

from fedkt import methods
from fedkt.config import MethodConfig, RunConfig, load_config, parse_config
from fedkt.config import method_catalog as catalog
from fedkt.federated.payload import Payload
from fedkt.methods.base import ClientContext, Method, broadcast
from fedkt.runner import run
from fedkt.runtime.job import run_job
from fedkt.runtime.local import (
    client_threads,
    client_workers,
    start,
    threads_record,
    worker_threads,
)
from tests.conftest import final_test_rows, small_config

# flower-sim's probe module, under the name pytest (and a worker, by FEDKT_PLUGINS) imports it.
_sim = importlib.import_module(__name__.rpartition(".")[0] + ".test_flower_sim"
                               if "." in __name__ else "test_flower_sim")
NAME = "local_workers_probe"
ROOT = Path(__file__).resolve().parents[2]


class ProbeConfig(MethodConfig):
    name: Literal["local_workers_probe"] = NAME
    die_client: int | None = None  # this client's process exits (in round 2)
    sleep: float = 0.0  # seconds each client's handler waits
    oom_client: int | None = None  # this client leaks its worker's memory (round 1)
    hang_client: int | None = None  # this client stops answering (round 1)
    hang: Literal["sleep", "stop"] = "sleep"  # how: a handler that sleeps, or SIGSTOP


class ProbeServer(_sim.ProbeServer):
    """flower-sim's probe server (a tensor, its norm evaluated, its state), asking for "work"."""

    def round(self, rnd: int, clients) -> dict[str, float]:
        replies = broadcast(clients, "work", Payload(w=self.w))
        self.w = torch.stack([r.tensor("w") for r in replies.values()]).mean(0)
        return {}


_SPENT: list[bool] = []  # this process's memory was leaked by a client


def _work(ctx: ClientContext, msg: Payload) -> Payload:
    if ctx.method.die_client == ctx.cid and ctx.rnd == 2:
        os._exit(3)  # the process dies, as under the OOM killer
    if ctx.method.oom_client == ctx.cid and ctx.rnd == 1:
        _SPENT.append(True)  # it keeps what it allocated: nothing else fits in its process
        raise MemoryError
    if _SPENT:  # a client after it in the same process: oneDNN finds no memory either
        raise RuntimeError("could not create a primitive")
    if ctx.method.hang_client == ctx.cid and ctx.rnd == 1:
        if ctx.method.hang == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    if ctx.method.sleep:
        ctx.state_dir.mkdir(parents=True, exist_ok=True)
        (ctx.state_dir / "busy").touch()  # the test stops the run now
        time.sleep(ctx.method.sleep)
    w = msg.tensor("w") + torch.rand(4)  # seeded per (client, round, step)
    return Payload(w=w, metrics={"train/pid": float(os.getpid()),
                                 "train/threads": float(torch.get_num_threads())})


PROBE = Method(name=NAME, config=ProbeConfig, server=ProbeServer, handlers={"work": _work})


def install() -> None:
    """Register the probe (also in the worker processes, through FEDKT_PLUGINS)."""
    methods.register(PROBE)


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setitem(catalog._REGISTERED_BY, NAME, __name__)
    monkeypatch.setitem(catalog._REGISTRY, NAME, PROBE)
    monkeypatch.setenv("FEDKT_PLUGINS", f"{__name__}:install")


def probe_config(run_dir, **method) -> RunConfig:
    return parse_config({
        "name": "probe", "rounds": 2, "output_dir": str(run_dir),
        "method": {"name": NAME, **method},
        "clients": {"num_clients": 3, "min_replies": 2},
        "data": {"dataset": {"name": "intent_recognition"}},
        "runtime": {"local": {"client_workers": 2}},
    })


def _train(rows: list[dict]) -> dict[tuple[int, str], dict]:
    return {(r["round"], r["participant"]): r for r in rows
            if r["split"] == "train" and r["participant"].startswith("client_")}


@pytest.mark.slow  # 28 s idle, 2-core AVX2 (2026-12-03); kept: a dead worker's exclusion
def test_a_client_that_spends_its_workers_memory_is_excluded_alone(probe, tmp_path):
    """Client 1 raises MemoryError and leaves its worker without memory (a client run
    there after it fails to build a kernel): the pool is replaced, the others run again,
    and only client 1 is excluded, named; round 2 runs in a new pool, all three."""
    rows = start(probe_config(tmp_path / "job", oom_client=1), run_job, quiet=True)
    ran = _train(rows)
    assert "client 1 left its worker process unusable (MemoryError" in ran[(1, "client_1")][
        "excluded"]
    for key in [(1, "client_0"), (1, "client_2"), (2, "client_0"), (2, "client_1"),
                (2, "client_2")]:
        assert "excluded" not in ran[key], ran[key]
    server = {r["round"]: r for r in rows if r["participant"] == "server" and r["split"] == "train"}
    assert [server[k]["clients_replied"] for k in (1, 2)] == [2, 3]


@pytest.mark.parametrize(("workers", "hang"), [  # two workers: 19-20 s each, idle AVX2
    pytest.param(2, "stop", marks=pytest.mark.slow),
    pytest.param(2, "sleep", marks=pytest.mark.slow), (1, "sleep")])
def test_a_client_that_stops_answering_is_excluded_after_the_timeout(probe, tmp_path, workers,
                                                                     hang):
    """runtime.timeout (3 s): client 1 stops answering in round 1 (its worker got SIGSTOP,
    or its handler sleeps; in-process with 1 worker); it is excluded, named, the round goes
    on and round 2 runs all three (a stopped worker was killed, the pool replaced)."""
    cfg = probe_config(tmp_path / "job", hang_client=1, hang=hang)
    cfg.runtime.timeout = 3.0
    cfg.runtime.local.client_workers = workers
    begin = time.monotonic()
    rows = start(cfg, run_job, quiet=True)
    assert time.monotonic() - begin < 60
    ran = _train(rows)
    assert "runtime.timeout (3 s)" in ran[(1, "client_1")]["excluded"], ran[(1, "client_1")]
    for key in [(1, "client_0"), (1, "client_2"), (2, "client_0"), (2, "client_1"),
                (2, "client_2")]:
        assert "excluded" not in ran[key], ran[key]
        assert (ran[key]["pid"] == os.getpid()) == (workers == 1)


@pytest.mark.slow  # 16 s idle, 2-core AVX2 (2026-12-03); kept: one and two workers' equal rows
def test_client_threads_are_the_same_in_a_worker_and_in_this_process(probe, tmp_path):
    """runtime.local.client_threads: 1 client computes with that many threads in-process
    (this process's own count restored after) and in workers; never more workers than
    clients; environment.json records the clients' threads."""
    before = torch.get_num_threads()
    threads = {}
    for workers in (1, 12):
        cfg = probe_config(tmp_path / f"w{workers}")
        cfg.runtime.local.client_workers = workers
        cfg.runtime.local.client_threads = 1
        assert client_workers(cfg) == min(workers, 3)
        rows = run(cfg, quiet=True)
        ran = _train(rows)
        threads[workers] = {r["threads"] for r in ran.values()}
        assert len({r["pid"] for r in ran.values()}) <= min(workers, 3)
        assert torch.get_num_threads() == before
        [env] = json.loads((cfg.run_dir / "environment.json").read_text())
        assert (env["client_threads"], env["client_workers"]) == (1, min(workers, 3))
    assert threads == {1: {1.0}, 12: {1.0}}


def test_client_threads_auto_shares_out_the_cores_over_the_workers(probe, tmp_path):
    cfg = probe_config(tmp_path / "job")
    cfg.runtime.local.client_workers = 2
    assert client_threads(cfg) == worker_threads(2)
    cfg.runtime.local.client_workers = 1
    assert client_threads(cfg) == worker_threads(1)
    assert "another worker count gives other threads" in threads_record(cfg)[
        "client_threads_from"]
    cfg.runtime.torch_threads = 3  # runtime.torch_threads wins
    assert client_threads(cfg) == 3


def _final_rows(cfg: RunConfig, workers: int) -> dict[str, dict]:
    cfg = cfg.model_copy(deep=True, update={"output_dir": str(Path(cfg.output_dir) / str(workers))})
    cfg.runtime.local.client_workers = workers
    return final_test_rows(run(cfg, quiet=True))


def test_one_and_two_workers_give_the_same_rows_with_client_threads_set(tmp_path):
    """A tiny FedAvg run (runtime.torch_threads unset, client_threads 1): the same final
    rows with 1 worker (clients in this process) and 2."""
    cfg = small_config(tmp_path / "job", "rounds=1", "runtime.torch_threads=null",
                       "runtime.local.client_threads=1", "data.max_private_per_client=8")
    assert _final_rows(cfg, 1) == _final_rows(cfg, 2)


@pytest.mark.slow
def test_the_demo_gives_the_same_rows_with_one_and_two_workers(tmp_path):
    """configs/demo.yaml as configured (real SmolLM2-135M, bf16 where the CPU has it,
    client_threads 2), shrunk to one short round: the same rows with 1 and 2 workers."""
    cfg = load_config(ROOT / "configs" / "demo.yaml", [
        f"output_dir={tmp_path}", "rounds=1", "data.split.test_size=6",
        "data.max_private_per_client=8", "data.max_public=8", "training.local_epochs=1",
        "eval.every=1", "eval.compare_round0=false", "eval.plots=false"])
    assert cfg.runtime.local.client_threads == 2
    one, two = _final_rows(cfg, 1), _final_rows(cfg, 2)
    assert one == two and {"client_0", "client_1"} <= set(one)


def test_local_settings_under_another_runtime_are_named_in_a_warning():
    base = {"method": "fedavg", "data": {"dataset": {"name": "intent_recognition"}}}
    with pytest.warns(UserWarning, match=r"runtime\.local\.client_workers: only the local "
                                         r"runtime reads it; ignored under runtime\.name "
                                         r"flower-sim"):
        parse_config({**base, "runtime": {"name": "flower-sim",
                                          "local": {"client_workers": 2}}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_config({**base, "runtime": {"name": "local", "local": {"client_workers": 2}}})
        parse_config({**base, "runtime": {"name": "flower-sim"}})


def test_worker_threads_share_out_the_cores():
    assert worker_threads(2, cores=2) == 1
    assert worker_threads(2, cores=16) == 8
    assert worker_threads(4, cores=2) == 1  # never fewer than one


def test_workers_run_the_clients_and_a_dead_worker_excludes_only_its_client(probe, tmp_path):
    """Client 1's process exits in round 2: the pool breaks, the clients beside it run again
    in new workers, and only client 1 is excluded, named."""
    rows = start(probe_config(tmp_path / "job", die_client=1), run_job, quiet=True)
    train = [r for r in rows if r["split"] == "train" and r["participant"].startswith("client_")]
    ran = {(r["round"], r["participant"]): r for r in train}
    for rnd, name in [(1, "client_0"), (1, "client_1"), (1, "client_2"), (2, "client_0"),
                      (2, "client_2")]:
        row = ran[(rnd, name)]
        assert "excluded" not in row and row["pid"] != os.getpid(), row
        assert row["threads"] == worker_threads(2)
    dead = ran[(2, "client_1")]
    assert "client 1's worker process ended" in dead["excluded"]
    server = {r["round"]: r for r in rows if r["participant"] == "server" and r["split"] == "train"}
    assert [server[k]["clients_replied"] for k in (1, 2)] == [3, 2]


@pytest.mark.skipif(not Path("/proc/self").exists() or not shutil.which("pgrep"),
                    reason="reads /proc and pgrep (Linux)")
@pytest.mark.parametrize("stop", [  # sigkill: 17 s on an idle AVX2 host; ctrl-c stays
    "ctrl-c", pytest.param("sigkill", marks=pytest.mark.slow)])
def test_stopping_the_run_ends_its_workers_at_once(probe, tmp_path, stop):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) stops the run and kills
    its workers mid-task; a SIGKILL of the run's process alone leaves no orphan worker."""
    conf = tmp_path / "probe.yaml"
    conf.write_text(probe_config(tmp_path / "job", sleep=120.0).to_yaml())
    # The folder this module is imported from (FEDKT_PLUGINS names it by its pytest name).
    root = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedkt.cli", "run", str(conf), "-q"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    workers: list[str] = []
    deadline = time.monotonic() + 120
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        children = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "spawn_main"],
                                  capture_output=True, text=True).stdout.split()
        busy = list((tmp_path / "job" / "clients").glob("client_*/busy"))
        workers = children if len(busy) >= 2 else []
    try:
        assert len(workers) == 2, proc.stdout.read() if proc.poll() is not None else workers
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)  # (an orphan worker would hold stdout open)
        assert proc.returncode == (130 if stop == "ctrl-c" else -signal.SIGKILL), out
        if stop == "ctrl-c":
            assert "interrupted" in out and "leaked" not in out and "Traceback" not in out, out
        gone = time.monotonic() + 10
        while _alive(workers) and time.monotonic() < gone:
            time.sleep(0.2)
        assert not _alive(workers)
    finally:  # nothing left behind, whatever failed
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _alive(workers):
            os.kill(int(pid), signal.SIGKILL)


def _alive(pids: list[str]) -> list[str]:
    """The processes of ``pids`` that still run (not zombies)."""
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                out.append(pid)
        except OSError:
            pass
    return out
