"""``runtime.local.client_workers``: the clients run in worker processes, and a worker that
dies excludes only the client that killed it (that the numbers are those of clients run one
after another: tests/runtime/test_local.py, same seed same numbers)."""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import pytest
import torch

from fedkt import methods
from fedkt.config import MethodConfig, RunConfig, parse_config
from fedkt.federated.payload import Payload
from fedkt.methods import catalog
from fedkt.methods.base import ClientContext, Method, broadcast
from fedkt.runner import run_job
from fedkt.runtime.local import start, worker_threads

# flower-sim's probe module, under the name pytest (and a worker, by FEDKT_PLUGINS) imports it.
_sim = importlib.import_module(__name__.rpartition(".")[0] + ".test_flower_sim"
                               if "." in __name__ else "test_flower_sim")
NAME = "local_workers_probe"


class ProbeConfig(MethodConfig):
    name: Literal["local_workers_probe"] = NAME
    die_client: int | None = None  # this client's process exits (in round 2)
    sleep: float = 0.0  # seconds each client's handler waits


class ProbeServer(_sim.ProbeServer):
    """flower-sim's probe server (a tensor, its norm evaluated, its state), asking for "work"."""

    def round(self, rnd: int, clients) -> dict[str, float]:
        replies = broadcast(clients, "work", Payload(w=self.w))
        self.w = torch.stack([r.tensor("w") for r in replies.values()]).mean(0)
        return {}


def _work(ctx: ClientContext, msg: Payload) -> Payload:
    if ctx.method.die_client == ctx.cid and ctx.rnd == 2:
        os._exit(3)  # the process dies, as under the OOM killer
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
@pytest.mark.parametrize("stop", ["ctrl-c", "sigkill"])
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
