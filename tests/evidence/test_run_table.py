"""``fedkt report``: comparing run folders written through RunRecorder."""

from __future__ import annotations

import pytest

from fedkt.evidence.run_table import report
from fedkt.tracking import RunRecorder


def _fake_run(path, name, method, server_acc, client_acc, client_bytes, num_clients=2):
    rec = RunRecorder(path)
    rec.save_config(f"name: {name}\nmethod:\n  name: {method}\n"
                    f"clients:\n  num_clients: {num_clients}\n")
    for rnd, (s_acc, c_acc) in enumerate(zip(server_acc, client_acc, strict=True), 1):
        rec.log({"round": rnd, "participant": "server", "split": "train", "wall_time": 5.0,
                 "bytes_sent": 10, "bytes_received": 10})
        rec.log({"round": rnd, "participant": "server", "split": "test", "accuracy": s_acc,
                 "loss": 1.0})
        for cid in range(num_clients):
            rec.log({"round": rnd, "participant": f"client_{cid}", "split": "train",
                     "bytes_sent": client_bytes, "bytes_received": 2 * client_bytes,
                     "wall_time": 1.0})
            rec.log({"round": rnd, "participant": f"client_{cid}", "split": "test",
                     "accuracy": c_acc + 0.1 * cid, "rougeL": 40.0})
    return path


def _table(text):
    lines = text.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1]) <= {"|", "-", ":"}
    return header, [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def test_report_compares_two_runs(tmp_path):
    a = _fake_run(tmp_path / "a", "fedmkt-demo", "fedmkt", [0.4, 0.6, 0.5], [0.2, 0.3, 0.35],
                  1_000_000)
    b = _fake_run(tmp_path / "b", "fedavg-demo", "fedavg", [0.3, 0.35, 0.45], [0.1, 0.2, 0.25],
                  4_000_000)
    header, rows = _table(report([a, b]))
    assert header == ["run", "method", "rounds", "server accuracy", "clients accuracy (mean)",
                      "best round (accuracy)", "MB sent / client", "MB received / client",
                      "wall time (s)"]
    # final server acc 0.5; clients' final mean (0.35 + 0.45) / 2 = 0.4; best server round 2;
    # per client: 3 rounds x 1 MB sent, 3 x 2 MB received; wall time 3 x 5 s
    assert rows[0] == ["fedmkt-demo", "fedmkt", "3", "0.5000", "0.4000", "2", "3.000", "6.000",
                       "15.0"]
    assert rows[1] == ["fedavg-demo", "fedavg", "3", "0.4500", "0.3000", "3", "12.000",
                       "24.000", "15.0"]


def test_report_metric_choice(tmp_path):
    a = _fake_run(tmp_path / "a", "x", "fedmkt", [0.4], [0.2], 10)
    header, rows = _table(report([a], metric="rougeL,accuracy"))
    assert header[3:7] == ["server rougeL", "clients rougeL (mean)", "server accuracy",
                           "clients accuracy (mean)"]
    # no server rougeL: "-", clients 40; best round judged on the clients' mean
    assert rows[0][3:8] == ["-", "40.0000", "0.4000", "0.2500", "1"]


def test_report_names_the_folder_that_is_not_a_run(tmp_path):
    good = _fake_run(tmp_path / "good", "x", "fedmkt", [0.4], [0.2], 10)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.yaml").write_text("name: bad\n")
    with pytest.raises(FileNotFoundError, match=r"bad: no metrics\.jsonl"):
        report([good, bad])
    with pytest.raises(FileNotFoundError, match="missing: no such run folder"):
        report([tmp_path / "missing"])
    (bad / "config.yaml").unlink()
    (bad / "metrics.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"bad: no config\.yaml"):
        report([bad])
