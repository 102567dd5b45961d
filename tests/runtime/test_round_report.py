"""One round's typed report (``fedkt.runtime.report``) and its rows: which rows, in which
order, with which fields, from the server's metrics, its evaluation and the traffic."""

from __future__ import annotations

from fedkt.infra.timing import Clock
from fedkt.runtime.base import Traffic
from fedkt.runtime.report import ClientReport, round_report, split_metrics


def _traffic() -> Traffic:
    t = Traffic()
    for cid, (down, up, secs) in {0: (100, 40, 1.5), 2: (100, 0, 0.5)}.items():
        t.sent[cid], t.received[cid], t.seconds[cid] = down, up, secs
        t.compute[cid] = Clock(wall=secs - 0.25, cpu=secs - 0.5)
    t.metrics[0] = {"train/loss": 1.25, "test/accuracy": 0.5, "round": 99}
    t.excluded[2] = "TimeoutError: no reply within 1 s"
    t.eval_bytes[0] = 7
    return t


def test_round_rows_server_then_models_then_clients():
    server = {"train": {"loss": 1.25, "server_loss": 0.75}, "test": {"own": 1.0}}
    evaluated = {"server": {"accuracy": 0.25}, "global_slm": {"accuracy": 0.5}}
    timing = {"wall_time": 3.0, "compute_time": 1.0, "compute_cpu": 0.5}
    report = round_report(4, server, evaluated, [0, 1, 2], _traffic(), timing)
    # Typed: the asked clients the round sent something, each number once.
    assert [c.cid for c in report.clients] == [0, 2] and report.clients_replied == 2
    assert report.clients[0] == ClientReport(
        cid=0, metrics={"train": {"loss": 1.25}, "test": {"accuracy": 0.5}}, bytes_sent=40,
        bytes_received=100, wall_time=1.5, compute_time=1.25, compute_cpu=1.0, eval_bytes=7)
    assert report.clients[1].excluded.startswith("TimeoutError")
    assert (report.bytes_sent, report.bytes_received) == (200, 40)
    rows = report.rows()
    assert [(r["participant"], r["split"]) for r in rows] == [
        ("server", "train"), ("server", "test"), ("global_slm", "test"),
        ("client_0", "train"), ("client_0", "test"), ("client_2", "train")]
    assert all(r["round"] == 4 for r in rows)
    assert rows[0] == {"round": 4, "participant": "server", "split": "train", "loss": 1.25,
                       "server_loss": 0.75, "bytes_sent": 200, "bytes_received": 40,
                       "clients_replied": 2, **timing}  # 3 asked, 1 excluded
    assert rows[1] == {"round": 4, "participant": "server", "split": "test", "own": 1.0,
                       "accuracy": 0.25}
    # A client's bytes from its own side; its metrics never stand in for row keys.
    assert rows[3] == {"round": 4, "participant": "client_0", "split": "train", "loss": 1.25,
                       "bytes_sent": 40, "bytes_received": 100, "wall_time": 1.5,
                       "compute_time": 1.25, "compute_cpu": 1.0, "eval_bytes": 7}
    assert rows[4] == {"round": 4, "participant": "client_0", "split": "test",
                       "accuracy": 0.5}
    assert rows[5]["excluded"].startswith("TimeoutError") and "loss" not in rows[5]
    # Inputs are not changed (the evaluation is read, not popped).
    assert "server" in evaluated and server["test"] == {"own": 1.0}


def test_round_rows_without_evaluation_has_no_test_rows():
    rows = round_report(1, {"train": {"loss": 2.0}}, {}, [0], _traffic(), {"wall_time": 1.0}).rows()
    assert [(r["participant"], r["split"]) for r in rows] == [
        ("server", "train"), ("client_0", "train"), ("client_0", "test")]


def test_split_metrics_by_split_without_row_keys():
    got = split_metrics({"train/loss": 1.0, "test/accuracy": 0.5, "kd_steps": 3.0,
                         "train/participant": 7.0, "round": 2.0})
    assert got == {"train": {"loss": 1.0, "kd_steps": 3.0}, "test": {"accuracy": 0.5}}


def test_round0_rows_are_test_rows_with_the_seconds_on_the_first_and_each_clients():
    t = _traffic()
    t.metrics[0]["train/eval_seconds"] = 0.75  # its evaluation's seconds, by phase
    timing = {"wall_time": 2.0, "eval_seconds": 1.5}
    evaluated = {"server": {"accuracy": 0.25}, "global_slm": {"accuracy": 0.5}}
    rows = round_report(0, {}, evaluated, [0, 1, 2], t, timing).evaluation_rows()
    assert rows == [
        {"round": 0, "participant": "server", "split": "test", "accuracy": 0.25, **timing},
        {"round": 0, "participant": "global_slm", "split": "test", "accuracy": 0.5},
        # client 0 evaluated; client 1 was sent nothing; client 2 reported no test metrics
        {"round": 0, "participant": "client_0", "split": "test", "accuracy": 0.5,
         "eval_seconds": 0.75}]
