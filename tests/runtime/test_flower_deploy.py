"""The flower runtime on a real SuperLink and two SuperNodes (127.0.0.1, free ports).

Uses the probe method of test_flower_sim; Flower's processes import it through
``FEDKT_PLUGINS`` and ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import pytest

from fedkt.runtime.flower_deploy import (
    flower_child_env,
    free_port,
    start_superlink,
    start_supernode,
    submit_job,
)
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import without_timings

_sim = importlib.import_module(__name__.rpartition(".")[0] + ".test_flower_sim"
                               if "." in __name__ else "test_flower_sim")
probe = _sim.probe  # fixture: registers the probe method here and for Flower's processes


def _module_root(module) -> str:
    """The sys.path entry from which ``module`` is imported under its name."""
    return str(Path(module.__file__).resolve().parents[len(module.__name__.split(".")) - 1])


@pytest.fixture
def federation(tmp_path, probe, monkeypatch):
    """A SuperLink and two SuperNodes; all their processes end with the test."""
    port = free_port()
    # The probe's folder, and this fedkt (the one a Flower process gets without PYTHONPATH).
    env = {"PYTHONPATH": os.pathsep.join([_module_root(_sim), flower_child_env()["PYTHONPATH"]])}
    # The processes learn about the probe method from the run config, not their environment.
    plugins = os.environ["FEDKT_PLUGINS"]
    monkeypatch.delenv("FEDKT_PLUGINS")
    procs = []
    try:
        t0 = time.perf_counter()
        procs.append(start_superlink("127.0.0.1", port, flwr_home=tmp_path / "home" / "link",
                                     log_file=tmp_path / "logs" / "superlink.log", env=env))
        for cid in range(2):
            procs.append(start_supernode(
                cid, 2, f"127.0.0.1:{port}", state_dir=tmp_path / "state" / f"node{cid}",
                flwr_home=tmp_path / "home" / f"node{cid}",
                log_file=tmp_path / "logs" / f"supernode{cid}.log", env=env))
        print(f"SuperLink + 2 SuperNodes up in {time.perf_counter() - t0:.1f} s")
        monkeypatch.setenv("FEDKT_PLUGINS", plugins)
        yield f"127.0.0.1:{port}", procs
    finally:
        for proc in reversed(procs):
            proc.stop()
        for proc in procs:
            assert not proc.alive()


def config(run_dir, superlink, **method):
    cfg = _sim.probe_config(run_dir, **method)
    cfg.runtime.name = "flower"
    cfg.runtime.flower.superlink = superlink
    cfg.clients.min_replies = 1
    return cfg


def test_deployed_job_matches_local_and_names_failing_client(federation, tmp_path):
    superlink, procs = federation
    # Client 1's handler raises in round 2; one reply is enough, so the job goes on.
    local = run_job(config(tmp_path / "a" / "job", superlink, fail_client=1), LocalTransport(),
                    quiet=True)
    t0 = time.perf_counter()
    rows = submit_job(config(tmp_path / "b" / "job", superlink, fail_client=1), quiet=True)
    print(f"flower deployment run: {time.perf_counter() - t0:.1f} s")
    _sim.assert_same_rows(rows, local)
    excluded = [r for r in rows if r.get("excluded")]
    assert [(r["round"], r["participant"]) for r in excluded] == [(2, "client_1")]
    assert "ValueError: probe failure on client 1" in excluded[0]["excluded"]
    # Each SuperNode kept its client's state in its own --node-config state-dir.
    assert list((tmp_path / "state" / "node0" / "client_0").glob("calls.*"))
    assert list((tmp_path / "state" / "node1" / "client_1").glob("calls.*"))
    assert all(p.alive() for p in procs)


def test_commands_and_app_folder():
    from fedkt.runtime.flower_deploy import APP_PYPROJECT, superlink_command, supernode_command

    repo_app = Path(__file__).resolve().parents[2] / "flower_app" / "pyproject.toml"
    assert repo_app.read_text() == APP_PYPROJECT
    assert superlink_command("0.0.0.0", 9093) == [
        "flower-superlink", "--host", "0.0.0.0", "--port", "9093",
        "--disable-runtime-dependency-installation", "--insecure"]
    cmd = supernode_command(3, 4, "10.0.0.1:9093", state_dir="/data/c3", port=9200)
    assert cmd == ["flower-supernode", "--superlink", "10.0.0.1:9093", "--node-config",
                   'partition-id=3 num-partitions=4 state-dir="/data/c3"',
                   "--host", "127.0.0.1", "--port", "9200", "--insecure"]


def test_unreachable_superlink_is_a_clear_error(probe, tmp_path):
    from fedkt.runtime.flower_deploy import DeploymentError

    with pytest.raises(DeploymentError, match="could not start the job on SuperLink"):
        submit_job(config(tmp_path / "job", f"127.0.0.1:{free_port()}"), quiet=True)


@pytest.mark.slow
def test_deployed_round_failure_then_resume_matches_clean_run(federation, tmp_path):
    from fedkt.runtime.base import RoundError

    superlink, _ = federation
    clean = run_job(config(tmp_path / "a" / "job", superlink), LocalTransport(), quiet=True)
    faulty = config(tmp_path / "b" / "job", superlink, fail_client=1)
    faulty.clients.min_replies = None
    with pytest.raises(RoundError, match=r"round 2.*client 1: .*probe failure on client 1"):
        submit_job(faulty, quiet=True)
    resumed = submit_job(config(tmp_path / "b" / "job", superlink), resume=True, quiet=True)
    _sim.assert_same_rows(resumed, clean)


@pytest.mark.slow  # 58 s; deployment = local is checked by default in the test above
def test_fedavg_job_on_superlink_matches_local_run(federation, tmp_path):
    """The platform's real FedAvg (tiny-llama, LoRA, vendored data): 2 clients, 2 rounds."""
    from fedkt.runtime.base import default_state_root
    from tests.conftest import small_config

    superlink, _ = federation
    local_cfg = small_config(tmp_path / "local")
    local = run_job(local_cfg, LocalTransport(default_state_root(local_cfg)), quiet=True)
    deployed_cfg = small_config(tmp_path / "deployed", "runtime.name=flower",
                                f"runtime.flower.superlink={superlink}")
    rows = submit_job(deployed_cfg, quiet=True)
    strip = without_timings(local)
    assert without_timings(rows) == strip
    assert {r["participant"] for r in rows if r["split"] == "test"} == {
        "server", "client_0", "client_1"}
