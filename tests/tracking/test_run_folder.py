"""The run folder: one writer at a time, and a resume that checks before it deletes.

* A lock (``.fedkt.lock``, flock) is held for a run's whole life: a second ``fedkt run``
  or ``fedkt resume`` on the folder is refused with the folder and the holder named,
  and leaves the first run's data alone.
* ``fedkt resume`` reads and checks the last checkpoint (present, readable, SHA-256 as
  recorded, a round the run has, no later rounds in the folder, the same seed) before
  it changes anything; each failure names the file, and the folder is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from fedkt.cli import main
from fedkt.errors import CheckpointError
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import LOCK_FILE, RunFolderBusy, read_rows, run_lock
from tests.conftest import ROOT, copy_of, finished_run, small_config
from tests.support.paused_run import PAUSE_LINE

ROUNDS = 3


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-round FedAvg run (tiny models), its folder copied by each test."""
    return finished_run(tmp_path_factory, f"rounds={ROUNDS}", "eval.plots=false")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file's SHA-256 (the lock file's content aside)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK_FILE}


def resume(run_dir: Path, *sets: str) -> list[dict]:
    cfg = small_config(run_dir, f"rounds={ROUNDS}", "eval.plots=false", *sets)
    return run_job(cfg, LocalTransport(default_state_root(cfg)), resume=True, quiet=True)


def latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest.json"


def edit_latest(run_dir: Path, **values) -> None:
    info = json.loads(latest(run_dir).read_text())
    info.update(values)
    info = {k: v for k, v in info.items() if v is not None}
    latest(run_dir).write_text(json.dumps(info))


def flip_bit(path: Path, at: int = -8) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- resume


def state_of(run_dir: Path, rnd: int = ROUNDS) -> Path:
    return run_dir / "checkpoints" / f"round_{rnd:04d}" / "server.safetensors"


def holdings_of(run_dir: Path, rnd: int = ROUNDS) -> Path:
    return run_dir / "checkpoints" / f"round_{rnd:04d}" / "holdings.json"


def _missing_state(d: Path) -> None:
    state_of(d).unlink()


def _pruned_earlier_round(d: Path) -> None:
    edit_latest(d, round=1, checkpoint="round_0001")  # round_0001 was pruned (keep=2)


def _round_9_of_3(d: Path) -> None:
    edit_latest(d, round=9, checkpoint="round_0009")


def _flipped_state(d: Path) -> None:
    flip_bit(state_of(d))


def _flipped_holdings(d: Path) -> None:
    holdings_of(d).write_text(holdings_of(d).read_text().replace("}", " }", 1))


def _rehash(d: Path) -> None:
    """Record the checkpoint's files' current SHA-256 (a corrupt file that matches)."""
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (state_of(d), holdings_of(d))}
    edit_latest(d, sha256=sums)
    (state_of(d).parent / "sha256.json").write_text(json.dumps(sums))


def _corrupt_state_unrecorded(d: Path) -> None:
    state_of(d).write_bytes(b"\x00" * 40)
    _rehash(d)


def _corrupt_holdings_unrecorded(d: Path) -> None:
    holdings_of(d).write_text("{not json")
    _rehash(d)


def _latest_not_json(d: Path) -> None:
    latest(d).write_text("{round: 3")


def _no_latest_but_rounds(d: Path) -> None:
    latest(d).unlink()


def _other_seed(d: Path) -> None:
    edit_latest(d, seed=7)


BAD_FOLDERS = {
    "missing_state": (_missing_state, r"round_0003/server.safetensors: missing"),
    "pruned_earlier_round": (_pruned_earlier_round,
                             r"latest.json: round 1 is the last complete one, but the folder "
                             r"holds round 3 .*resuming would delete it"),
    "round_9_of_3": (_round_9_of_3, r"latest.json: round 9 is marked complete, but the run "
                                    r"has 3 rounds"),
    "flipped_state": (_flipped_state, r"round_0003/server.safetensors: its SHA-256 differs"),
    "flipped_holdings": (_flipped_holdings, r"round_0003/holdings.json: its SHA-256 differs"),
    "corrupt_state": (_corrupt_state_unrecorded,
                      r"round_0003/server.safetensors: not a readable safetensors file"),
    "corrupt_holdings": (_corrupt_holdings_unrecorded,
                         r"round_0003/holdings.json: not valid JSON"),
    "latest_not_json": (_latest_not_json, r"latest.json is not valid JSON"),
    "no_latest_but_rounds": (_no_latest_but_rounds,
                             r"latest.json: no round is complete, but the folder holds round "
                             r"3"),
    "other_seed": (_other_seed, r"seed: the run was checkpointed with seed 7 .*the config "
                                r"now says 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_resume_refuses_a_bad_folder_naming_the_file_and_changes_nothing(finished, tmp_path,
                                                                         case):
    run_dir = copy_of(finished, tmp_path)
    damage, reason = BAD_FOLDERS[case]
    damage(run_dir)
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=reason):
        resume(run_dir)
    assert snapshot(run_dir) == before  # no metrics, predictions or checkpoint lost
    assert not (run_dir / "checkpoints" / "round_0009").exists()


def test_cli_resume_with_another_seed_is_refused(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    before = snapshot(run_dir)
    assert main(["resume", str(run_dir), "--set", "seed=5", "-q"]) == 2
    err = capsys.readouterr().err
    assert "fedkt: error: seed: the run was checkpointed with seed 0" in err
    assert "now says 5" in err and "Traceback" not in err
    assert snapshot(run_dir) == before


def test_resume_with_a_changed_key_records_it(finished, tmp_path):
    """An override at resume is taken, and said: resumes.jsonl and config.yaml."""
    run_dir = copy_of(finished, tmp_path)
    edit_latest(run_dir, round=2, checkpoint="round_0002", sha256=None)  # killed in round 3
    resume(run_dir, "eval.max_new_tokens=7")
    [line] = (run_dir / "resumes.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["after_round"] == 2
    assert record["changed"] == {"eval.max_new_tokens": [48, 7]}
    assert "max_new_tokens: 7" in (run_dir / "config.yaml").read_text()
    rows = read_rows(run_dir / "metrics.jsonl")
    keys = Counter((r["round"], r["participant"], r["split"]) for r in rows)
    assert max(keys.values()) == 1 and {r["round"] for r in rows} == {0, 1, 2, 3}


def test_a_torn_row_of_a_completed_round_is_reported(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-20])  # the last row (round 3) torn
    with pytest.warns(UserWarning, match=r"metrics.jsonl: dropping a half-written last line "
                                         r".*a row of completed round 3 is lost"):
        resume(run_dir)


def test_checkpoint_records_checksums_and_seed(finished):
    info = json.loads(latest(finished).read_text())
    assert info["seed"] == 0 and info["round"] == ROUNDS
    for name, digest in info["sha256"].items():
        path = finished / "checkpoints" / f"round_{ROUNDS:04d}" / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


# --------------------------------------------------------------------------- the lock


HOLD = """
import sys, time
from fedkt.tracking import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_folder_locked_by_another_process_is_refused(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    before = snapshot(run_dir)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusy, match=rf"run folder .*run is in use by another "
                                                rf"fedkt process \(pid {holder.pid}, since"):
            resume(run_dir)
        cfg = small_config(run_dir, "eval.plots=false")
        with pytest.raises(RunFolderBusy):
            run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
        assert snapshot(run_dir) == before  # a fresh run would have cleared the folder
    finally:
        holder.kill()
        holder.wait()
    with run_lock(run_dir), run_lock(run_dir):  # free again (and re-entrant in one process)
        pass


def test_output_dir_that_is_a_file_is_an_error_not_a_traceback(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["run", "quickstart", "--output-dir", str(target), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"fedkt: error: output_dir: {target} is a file" in err and "Traceback" not in err


def test_read_only_folder_is_an_error_not_a_traceback(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        import os

        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        assert main(["run", "quickstart", "--output-dir", str(folder / "run"), "-q"]) == 2
        err = capsys.readouterr().err
        assert "fedkt: error: [Errno 13] Permission denied" in err and "Traceback" not in err
    finally:
        folder.chmod(0o700)


def _fedkt(*args: str, pause: int | None = None) -> subprocess.Popen:
    main_module = ["fedkt.cli"] if pause is None else ["tests.support.paused_run", str(pause)]
    return subprocess.Popen([sys.executable, "-m", *main_module, *args, "-q"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_fedkt_runs_into_one_folder_leave_one_runs_rows(tmp_path):
    """The failure this guards against: two `fedkt run` into one --output-dir both exited 0 with
    twice the rows.  Now the second (also with --overwrite), and a `fedkt resume` of the
    run that is still going, are refused; the first run's rows are there once each."""
    cfg = small_config(tmp_path / "run", f"rounds={ROUNDS}", "eval.plots=false")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cfg.to_yaml())
    first = _fedkt("run", str(config_file), pause=2)
    try:
        for line in first.stderr:  # blocks until the first run pauses in round 2
            if PAUSE_LINE.format(rnd=2) in line:
                break
        else:
            pytest.fail(f"the first run ended (rc {first.wait()}) without pausing")
        before = snapshot(cfg.run_dir)
        for args in (("run", str(config_file)), ("run", str(config_file), "--overwrite"),
                     ("resume", str(cfg.run_dir))):
            second = subprocess.run([sys.executable, "-m", "fedkt.cli", *args, "-q"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=300)
            assert second.returncode == 2, (args, second.stderr)
            assert f"is in use by another fedkt process (pid {first.pid}" in second.stderr
            assert snapshot(cfg.run_dir) == before, args
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        first.wait()
    time.sleep(0.1)
    done = subprocess.run([sys.executable, "-m", "fedkt.cli", "resume", str(cfg.run_dir), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = read_rows(cfg.run_dir / "metrics.jsonl")
    keys = Counter((r["round"], r["participant"], r["split"]) for r in rows)
    assert max(keys.values()) == 1 and sorted({r["round"] for r in rows}) == [0, 1, 2, 3]


def test_output_dir_below_a_file_is_an_error_not_a_traceback(tmp_path, capsys):
    """An OSError from the file system (here ENOTDIR) is reported, not raised."""
    (tmp_path / "file").write_text("x")
    assert main(["run", "quickstart", "--output-dir", str(tmp_path / "file" / "run"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "fedkt: error: [Errno 20] Not a directory" in err and "Traceback" not in err


def test_a_folder_left_with_only_the_lock_file_runs_again(tmp_path, capsys):
    """A run killed before it wrote its config leaves its folder holding only the lock
    file; `fedkt run --overwrite` (a suite's re-run) refused it as "not a fedkt run
    folder". It is empty of any run: it runs. A stray file beside the lock is still refused."""
    cfg = small_config(tmp_path / "run", "rounds=1", "eval.plots=false")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cfg.to_yaml())
    cfg.run_dir.mkdir()
    (cfg.run_dir / LOCK_FILE).write_text("pid 999999, since 2026-11-28T21:29:14+0000\n")
    (cfg.run_dir / "notes.txt").write_text("mine")
    assert main(["run", str(config_file), "--overwrite", "-q"]) == 2
    assert "is not a fedkt run folder" in capsys.readouterr().err
    (cfg.run_dir / "notes.txt").unlink()
    assert main(["run", str(config_file), "--overwrite", "-q"]) == 0
    assert {r["round"] for r in read_rows(cfg.run_dir / "metrics.jsonl")} >= {1}
