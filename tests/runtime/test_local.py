"""The local runtime end to end: metrics, accounting, determinism, failures and resume."""

from __future__ import annotations

import json

import pytest

from fedkt.runtime.base import RoundError
from fedkt.runtime.base import default_state_root as client_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport, start
from fedkt.tracking import is_timing, without_timings
from tests.conftest import final_test_rows
from tests.support.fault_injection import client_faults


def local(cfg):
    return LocalTransport(client_state_root(cfg))


def _run(cfg, **kw):
    return run_job(cfg, local(cfg), **kw)


def _numbers(rows):
    return without_timings(rows)


def test_fedavg_run_writes_metrics_bytes_and_checkpoints(make_config):
    cfg = make_config("eval.plots=true")
    rows = run_job(cfg, local(cfg), quiet=True)
    run_dir = cfg.run_dir
    assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.md").is_file()
    plots = {p.name for p in (run_dir / "plots").glob("*.png")}
    assert "test_accuracy.png" in plots and "time.png" in plots
    assert not any("seconds" in name or "wall_time" in name for name in plots)
    # summary.md: metric columns only between the losses and the best value; the
    # timings (eval_seconds, comm_seconds, eval_saved_seconds ...) in a table of their own
    results, timings = (run_dir / "summary.md").read_text().split("## Where the time went")
    header = [c.strip() for c in next(ln for ln in results.splitlines()
                                      if ln.startswith("| participant")).strip("|").split("|")]
    metrics = header[header.index("test loss") + 1:header.index("best accuracy (round)")]
    assert "accuracy" in metrics and not any(is_timing(k) for k in metrics)
    assert "_seconds" not in results
    timing_header = next(ln for ln in timings.splitlines() if ln.startswith("| participant"))
    assert "eval (s)" in timing_header and "train (s)" in timing_header
    no_plots = make_config("eval.plots=false", name="no_plots")  # sweeps: metrics only
    run_job(no_plots, local(no_plots), quiet=True)
    assert not (no_plots.run_dir / "plots").exists()
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["round"] == 2
    written = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert written == rows
    server_train = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
    assert [r["round"] for r in server_train] == [1, 2]
    client_rows = [r for r in rows if r["participant"] == "client_1" and r["split"] == "train"]
    # The adapter travels both ways: bytes at least the adapter's fp32 size.
    from fedkt.train.lm import client_lm

    adapter_bytes = sum(t.numel() * t.element_size() for t in client_lm(cfg, 0).initial.values())
    for r in client_rows:
        assert adapter_bytes <= r["bytes_sent"] < adapter_bytes + 64 * 1024
        assert adapter_bytes <= r["bytes_received"] < adapter_bytes + 64 * 1024
    test_rows = {r["participant"] for r in rows if r["split"] == "test"}
    assert test_rows == {"server", "client_0", "client_1"}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows if r["split"] == "test")


def test_same_seed_same_numbers_other_seed_differs(make_config):
    """The same seed gives the same rows, also with the clients in two worker processes
    (``runtime.local.client_workers``: training and evaluation there, not here)."""
    a = _run(make_config(name="a"), quiet=True)
    b = start(make_config("runtime.local.client_workers=2", name="b"), run_job, quiet=True)
    c = _run(make_config("seed=1", name="c"), quiet=True)
    assert _numbers(a) == _numbers(b)
    assert {r["participant"] for r in b if r["split"] == "test"} == {
        "server", "client_0", "client_1"}
    assert final_test_rows(a)["server"]["loss"] != final_test_rows(c)["server"]["loss"]


@pytest.mark.slow  # tests/test_cli.py runs the same failure and resume through the CLI
def test_client_failure_names_client_and_resume_matches_clean_run(make_config):
    clean = _run(make_config("rounds=3", name="clean"), quiet=True)
    cfg = make_config("rounds=3", name="faulty")
    with client_faults("fedavg", "1:2"), \
            pytest.raises(RoundError, match=r"round 2.*client 1: .*injected fault"):
        run_job(cfg, local(cfg), quiet=True)
    resumed = run_job(cfg, local(cfg), resume=True, quiet=True)
    assert max(r["round"] for r in resumed) == 3
    assert _numbers(resumed) == _numbers(clean)


def test_min_replies_lets_round_proceed_without_failed_client(make_config):
    with client_faults("fedavg", "0:1"):
        rows = _run(make_config("rounds=1", "clients.min_replies=1"), quiet=True)
    excluded = [r for r in rows if r.get("excluded")]
    assert len(excluded) == 1 and excluded[0]["participant"] == "client_0"
    assert "injected fault" in excluded[0]["excluded"]
    server = [r for r in rows if r["participant"] == "server" and r["split"] == "train"][0]
    assert server["clients_replied"] == 1


def test_compute_time_leaves_out_evaluation_and_waiting_for_clients(make_config):
    cfg = make_config("eval.every=2")  # round 1 trains only, round 2 also evaluates
    rows = _run(cfg, quiet=True)
    train = [r for r in rows if r["split"] == "train"]
    clients = {rnd: [r for r in train if r["round"] == rnd and r["participant"] != "server"]
               for rnd in (1, 2)}
    for r in train:
        assert 0 < r["compute_time"] <= r["wall_time"] + 1e-6, r
        assert r["compute_cpu"] > 0, r
    # Without evaluation a client's compute is its whole handler time; with it, less.
    assert all(r["wall_time"] - r["compute_time"] < 1e-5 for r in clients[1])
    assert all(r["wall_time"] - r["compute_time"] > 1e-3 for r in clients[2])
    for rnd in (1, 2):  # the server's compute leaves out the clients (who share its process)
        (server,) = [r for r in train if r["round"] == rnd and r["participant"] == "server"]
        assert server["compute_time"] < server["wall_time"] - sum(
            r["wall_time"] for r in clients[rnd])
        assert server["compute_cpu"] < sum(r["compute_cpu"] for r in clients[rnd])
