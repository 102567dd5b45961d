"""The run folder: metrics log, tables, plots and checkpoint bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.tracking import RunRecorder, atomic_write, main_metric, metric_keys, run_wall_time


def _log_run(rec: RunRecorder, rounds: int = 3) -> None:
    for rnd in range(1, rounds + 1):
        rec.log({"round": rnd, "participant": "server", "split": "train", "loss": 2.0 / rnd,
                 "bytes_sent": 2_000_000 * rnd, "bytes_received": 1_000_000,
                 "clients_replied": 2, "wall_time": 10.0})
        rec.log({"round": rnd, "participant": "server", "split": "test", "loss": 1.5 / rnd,
                 "accuracy": 0.25 * rnd})
        for cid in range(2):
            rec.log({"round": rnd, "participant": f"client_{cid}", "split": "train",
                     "loss": 3.0 / rnd, "bytes_sent": 500_000, "bytes_received": 1_000_000 * rnd,
                     "wall_time": 4.0 + cid})
            rec.log({"round": rnd, "participant": f"client_{cid}", "split": "test",
                     "accuracy": 0.1 * rnd + 0.05 * cid})


def test_log_rows_truncate_roundtrip(tmp_path):
    rec = RunRecorder(tmp_path / "run")
    _log_run(rec)
    rows = rec.rows()
    assert len(rows) == 18
    assert rows[1] == {"round": 1, "participant": "server", "split": "test", "loss": 1.5,
                       "accuracy": 0.25}
    rec.truncate_after(2)
    assert {r["round"] for r in rec.rows()} == {1, 2}
    assert len(rec.rows()) == 12
    # A resumed recorder keeps the rows and appends after them.
    again = RunRecorder(tmp_path / "run", resume=True)
    again.log({"round": 3, "participant": "server", "split": "test", "accuracy": 0.9})
    assert len(again.rows()) == 13 and again.rows()[-1]["accuracy"] == 0.9


def test_tensor_values_are_logged_as_numbers(tmp_path):
    import torch

    rec = RunRecorder(tmp_path)
    rec.log({"round": 1, "participant": "server", "loss": torch.tensor(0.5)})
    assert rec.rows() == [{"round": 1, "participant": "server", "loss": 0.5}]


def test_resume_drops_half_written_line_and_fresh_start_clears(tmp_path):
    rec = RunRecorder(tmp_path)
    rec.log({"round": 1, "participant": "server", "loss": 1.0})
    with open(rec.metrics_path, "a") as fh:
        fh.write('{"round": 2, "partic')  # crash mid-write
    with pytest.warns(UserWarning, match="half-written"):
        assert len(rec.rows()) == 1
    resumed = RunRecorder(tmp_path, resume=True)
    resumed.log({"round": 2, "participant": "server", "loss": 0.5})
    assert [r["round"] for r in resumed.rows()] == [1, 2]
    resumed.mark_complete(2)
    with pytest.raises(FileExistsError, match=str(tmp_path)):
        RunRecorder(tmp_path, overwrite=False)
    fresh = RunRecorder(tmp_path)
    assert fresh.rows() == [] and fresh.last_complete_round() == 0


def test_round_table_and_summary_contain_logged_numbers(tmp_path):
    rec = RunRecorder(tmp_path)
    rec.save_config("name: demo\nmethod:\n  name: fedmkt\n")
    _log_run(rec)
    table = rec.round_table(2)
    lines = table.splitlines()
    assert lines[0] == "round 2"
    assert lines[1].split()[:4] == ["participant", "train", "loss", "test"]
    assert [ln.split()[0] for ln in lines[2:]] == ["server", "client_0", "client_1"]
    server = lines[2].split()
    # train loss 1.0, test loss 0.75, accuracy 0.5, 4 MB sent, 1 MB received, 10 s
    assert server[1:] == ["1.0000", "0.7500", "0.5000", "4.000", "1.000", "10.0"]
    assert len({len(ln) for ln in lines[1:3]}) == 1  # fixed width

    text = rec.summary()
    assert text == (tmp_path / "summary.md").read_text()
    assert "demo" in text and "fedmkt" in text
    server_row = next(ln for ln in text.splitlines() if ln.startswith("| server"))
    cells = [c.strip() for c in server_row.strip("|").split("|")]
    # last eval round, train loss, test loss, accuracy, best, MB sent (2+4+6), MB recv, time
    assert cells == ["server", "3", "0.6667", "0.5000", "0.7500", "0.7500 (3)", "12.000",
                     "3.000", "30.0"]
    client1 = next(ln for ln in text.splitlines() if ln.startswith("| client_1"))
    assert "0.3500" in client1 and "1.500" in client1  # accuracy, MB sent 3 x 0.5
    assert "wall time: 30.0 s" in text


def test_metric_selection():
    rows = [{"split": "test", "rougeL": 30.0, "loss": 1.0, "f1": 0.4, "bytes_sent": 3},
            {"split": "train", "kd_loss": 1.0}]
    assert metric_keys(rows) == ["rougeL", "f1"]
    assert main_metric(rows) == "rougeL"
    assert main_metric([{"split": "test", "loss": 1.0}]) == "loss"
    assert run_wall_time([{"round": 1, "participant": "client_0", "wall_time": 2.0},
                          {"round": 1, "participant": "client_1", "wall_time": 3.0},
                          {"round": 2, "participant": "client_0", "wall_time": 1.0}]) == 4.0


def _timed_rows() -> list[dict]:
    """Rows as a real run logs them: phases' seconds on train and test rows."""
    rows = []
    for rnd in (0, 1):
        rows.append({"round": rnd, "participant": "server", "split": "test", "accuracy": 0.2 + rnd,
                     "eval_seconds": 3.0, "eval_saved_seconds": 1.5, "comm_seconds": 0.25,
                     "wall_time": 4.0})
        rows.append({"round": rnd, "participant": "client_0", "split": "test", "accuracy": 0.1,
                     "eval_seconds": 2.0, "wall_time": 2.5})
        if rnd:
            rows.append({"round": rnd, "participant": "client_0", "split": "train", "loss": 1.0,
                         "train_seconds": 6.0, "step_seconds": 0.5, "wall_time": 7.0,
                         "compute_time": 6.5})
        rows.append({"round": rnd, "participant": "global_slm", "split": "test", "accuracy": 0.3})
    return rows


def test_timings_are_not_metrics_and_have_their_own_table_and_plot(tmp_path):
    rows = _timed_rows()
    assert metric_keys(rows) == ["accuracy"]
    rec = RunRecorder(tmp_path)
    rec.save_config("name: timed\nmethod:\n  name: fedavg\n")
    for row in rows:
        rec.log(row)
    text = rec.summary()
    results, timings = text.split("## Where the time went")
    header = next(ln for ln in results.splitlines() if ln.startswith("| participant"))
    assert "seconds" not in header and "eval (s)" not in header and "comm" not in header
    lines = [ln for ln in timings.splitlines() if ln.startswith("|")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cols == ["participant", "time (s)", "compute (s)", "eval (s)", "train (s)",
                    "comm (s)", "step (s)", "spared by reuse (s)"]
    server = [c.strip() for c in lines[2].strip("|").split("|")]
    assert server == ["server", "8.0", "-", "6.0", "-", "0.5", "-", "3.0"]
    client = [c.strip() for c in lines[3].strip("|").split("|")]
    assert client == ["client_0", "12.0", "6.5", "4.0", "6.0", "-", "0.5", "0.0"]
    assert len(lines) == 4  # global_slm: no timings of its own, no line
    names = {p.name for p in rec.plot()}
    assert names == {"test_accuracy.png", "train_loss.png", "time.png"}  # no bytes logged


def test_a_run_without_timings_has_no_timing_table(tmp_path):
    rec = RunRecorder(tmp_path)
    rec.log({"round": 1, "participant": "server", "split": "test", "accuracy": 0.5})
    assert "time went" not in rec.summary()


def test_plot_writes_non_empty_pngs(tmp_path):
    rec = RunRecorder(tmp_path)
    _log_run(rec)
    written = rec.plot()
    names = {p.name for p in written}
    assert names == {"test_accuracy.png", "test_loss.png", "train_loss.png",
                     "communication.png", "time.png"}
    for path in written:
        data = path.read_bytes()
        assert path.parent == tmp_path / "plots"
        assert data.startswith(b"\x89PNG") and len(data) > 2000


def test_checkpoints_latest_and_prune(tmp_path, monkeypatch):
    rec = RunRecorder(tmp_path)
    assert rec.last_complete_round() == 0 and rec.latest() is None
    for rnd in range(1, 5):
        folder = rec.checkpoint_dir(rnd)
        assert folder == tmp_path / "checkpoints" / f"round_{rnd:04d}" and folder.is_dir()
        (folder / "state.bin").write_bytes(b"x")
        rec.mark_complete(rnd, {"state": "state.bin"})
    latest = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert latest["round"] == 4 and latest["state"] == "state.bin" and "time" in latest
    assert rec.last_complete_round() == 4
    rec.checkpoint_dir(5)  # an interrupted round: not complete, left alone
    rec.prune_checkpoints(keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest.json", "round_0003", "round_0004", "round_0005"]

    # Atomic: a failing replace leaves the previous latest.json intact, no temp files stay.
    def boom(src, dst):
        assert json.loads(Path(src).read_text())["round"] == 5  # fully written before the swap
        raise OSError("disk full")

    monkeypatch.setattr("fedkt.tracking.folder.os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        rec.mark_complete(5)
    monkeypatch.undo()
    assert rec.last_complete_round() == 4
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_of_text_bytes_and_a_writer_function(tmp_path, monkeypatch):
    """The one temp-file-then-rename write: text, bytes (with the file's mode from its
    creation on: a private key), or a function writing the temporary path
    (safetensors); a failure leaves the old file and no temporary file."""
    import os
    import stat

    import torch
    from safetensors.torch import load_file, save_file

    atomic_write(tmp_path / "a.txt", "é\n")
    assert (tmp_path / "a.txt").read_bytes() == "é\n".encode()
    key = tmp_path / "node.key"
    atomic_write(key, b"secret", mode=0o600)
    assert key.read_bytes() == b"secret" and stat.S_IMODE(key.stat().st_mode) == 0o600
    state = {"w": torch.arange(3.0)}
    path = tmp_path / "s.safetensors"
    atomic_write(path, lambda tmp: save_file(state, str(tmp)), mode=0o640, durable=False)
    assert torch.equal(load_file(str(path))["w"], state["w"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o640

    def fail(tmp):
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail)
    monkeypatch.setattr("fedkt.tracking.folder.os.replace", lambda src, dst: (_ for _ in ()).throw(
        OSError("read-only")))
    with pytest.raises(OSError, match="read-only"):
        atomic_write(tmp_path / "a.txt", "new")
    monkeypatch.undo()
    assert torch.equal(load_file(str(path))["w"], state["w"])
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "é\n"
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "node.key", "s.safetensors"]


def test_corrupt_latest_is_reported(tmp_path):
    rec = RunRecorder(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.json").write_text("{not json")
    with pytest.raises(ValueError, match="latest.json"):
        rec.last_complete_round()
