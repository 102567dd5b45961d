"""Faults of the machine and of files a run reads back: each ends in a named error that
says which path (file, record) is at fault, never a traceback, a hang or a silent loss.

* disk full while the checkpoint is written (``OSError(ENOSPC)`` or safetensors' own
  error) names the checkpoint file and leaves no temporary file;
* a lone surrogate in a dataset string names the file and the record;
* ``fedkt report`` stops reading a predictions file that inflates beyond a bound;
* ``fedkt resume`` refuses a run whose ``metrics.jsonl`` is gone or lost completed rounds,
  and a ``metrics.jsonl`` that is not UTF-8 is named.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from fedkt.cli import main
from tests.conftest import ROOT, copy_of, finished_run, small_config

ROUNDS = 2


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round FedAvg run (tiny models), copied by each test."""
    return finished_run(tmp_path_factory, f"rounds={ROUNDS}")


def write_config(tmp_path: Path, *overrides: str) -> Path:
    cfg = small_config(tmp_path / "run", *overrides)
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.to_yaml())
    return path


def failed(capsys, *argv: str, quiet: bool = True) -> str:
    assert main([*argv, "-q"] if quiet else list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------- disk full


def _no_space(kind: str):
    def save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x00" * 64)  # part of the file was written
        if kind == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        from safetensors import SafetensorError

        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')
    return save_file


@pytest.mark.parametrize("kind", ["oserror", "safetensors"])
def test_disk_full_during_the_checkpoint_names_the_file(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setattr("fedkt.tracking.checkpoint.save_file", _no_space(kind))
    path = write_config(tmp_path, "rounds=1", "eval.round0=false")
    err = failed(capsys, "run", str(path))
    state = tmp_path / "run" / "checkpoints" / "round_0001" / "server.safetensors"
    assert f"fedkt: error: {state}: " in err and "No space left on device" in err
    assert "SafetensorError" not in err
    folder = state.parent
    assert not state.exists() and not list(folder.glob(".*.tmp"))
    assert not (folder.parent / "latest.json").exists()  # the round is not marked complete


# --------------------------------------------------------------------------- data


def test_a_lone_surrogate_in_the_data_names_file_and_record(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    rows = [{"text": f"hello number {i}", "label": i % 2} for i in range(60)]
    lines = [json.dumps(r) for r in rows]
    lines[6] = '{"text": "broken \\ud800 text", "label": 0}'  # valid JSON, no valid UTF-8
    data.write_text("\n".join(lines) + "\n")
    path = write_config(tmp_path, f"data.dataset={{path: {data}, task: classification}}",
                        "rounds=1")
    err = failed(capsys, "run", str(path))
    assert f"fedkt: error: {data} record 7 (line 7): field 'text'" in err
    assert "lone surrogate" in err


# --------------------------------------------------------------------------- report


def gzip_bomb(path: Path, mib: int) -> None:
    """A gzip file that inflates to ``mib`` MiB (of a JSON string's body), written in
    chunks (it never needs that much memory)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"0" * (1 << 20)
    with path.open("wb") as fh:
        fh.write(deflate.compress(b'{"meta": {}, "columns": {"id": ["'))
        for _ in range(mib):
            fh.write(deflate.compress(chunk))
        fh.write(deflate.compress(b'"]}}') + deflate.flush())


MAXRSS = ("import resource, sys\nfrom fedkt.cli import main\ncode = main(sys.argv[1:])\n"
          "print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
          "file=sys.stderr)\nsys.exit(code)\n")


def report_maxrss(run: Path) -> tuple[int, str, int]:
    """``fedkt report RUN --baseline RUN@0`` (which reads every participant's predictions)
    in a fresh process: (rc, stderr, peak RSS in MiB)."""
    done = subprocess.run([sys.executable, "-c", MAXRSS, "report", str(run), "--baseline",
                           f"{run}@0", "--bootstrap", "200"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    peak = int(done.stderr.rsplit("maxrss ", 1)[1].split()[0]) // 1024
    return done.returncode, done.stderr, peak


def test_report_stops_reading_a_gzip_bomb_early(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    code, err, clean = report_maxrss(run_dir)
    assert code == 0, err[-2000:]
    target = run_dir / "predictions" / f"round_{ROUNDS:04d}" / "server.json.gz"
    gzip_bomb(target, 400)
    assert target.stat().st_size < 1 << 20
    code, err, peak = report_maxrss(run_dir)
    assert code == 2, err[-2000:]
    assert f"fedkt: error: {target}: predictions decompress to more than" in err
    assert peak - clean < 150, (peak, clean)


# --------------------------------------------------------------------------- resume


def test_resume_without_metrics_is_refused(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    (run_dir / "metrics.jsonl").unlink()
    err = failed(capsys, "resume", str(run_dir), "--set", "rounds=3")
    assert (f"fedkt: error: {run_dir / 'metrics.jsonl'}: missing, but "
            f"{run_dir / 'checkpoints' / 'latest.json'} marks round {ROUNDS} complete") in err
    assert not (run_dir / "checkpoints" / "round_0003").exists()


def test_resume_with_rows_of_completed_rounds_lost_is_refused(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines()
            if json.loads(line)["round"] < ROUNDS]
    metrics.write_text("\n".join(kept) + "\n")  # cut at a line's end: no torn line
    before = metrics.read_bytes()
    err = failed(capsys, "resume", str(run_dir), "--set", "rounds=3")
    assert f"fedkt: error: {metrics}: has no rows of round {ROUNDS}" in err
    assert metrics.read_bytes() == before
    assert not (run_dir / "checkpoints" / "round_0003").exists()


def test_a_metrics_file_that_is_not_utf8_is_named(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'"server"', b'"serv\xffer"', 1).replace(
        b'"client_', b'"cli\xffent_', 1)
    metrics.write_bytes(b"".join(lines))
    err = failed(capsys, "resume", str(run_dir), "--set", "rounds=3")
    assert f"fedkt: error: {metrics} line 4: not UTF-8" in err
    err = failed(capsys, "report", str(run_dir), quiet=False)
    assert f"fedkt: error: {metrics} line 4: not UTF-8" in err
