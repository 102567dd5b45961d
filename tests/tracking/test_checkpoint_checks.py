"""Every reader of a checkpoint checks it: ``fedkt resume``, ``fedkt eval`` and ``fedkt
export`` load a server state only when its SHA-256 matches the one recorded when it was
written (``latest.json`` for the last round, ``round_NNNN/sha256.json`` for every kept
round), and a checksum that is not recorded is an error, not a pass.  Each refusal names
the file.  ``fedkt export`` also refuses a state holding NaN or infinity.  (``fedkt
report`` reads rows and predictions, never a checkpoint.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fedkt.cli import main
from fedkt.errors import CheckpointError
from fedkt.export import export_model
from tests.conftest import copy_of, finished_run
from tests.tracking.test_run_folder import (
    ROUNDS,
    edit_latest,
    flip_bit,
    latest,
    resume,
    snapshot,
    state_of,
)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-round FedAvg run (tiny models), its folder copied by each test."""
    return finished_run(tmp_path_factory, f"rounds={ROUNDS}", "eval.plots=false")


def sums_file(run_dir: Path, rnd: int = ROUNDS) -> Path:
    return run_dir / "checkpoints" / f"round_{rnd:04d}" / "sha256.json"


def rewrite_state(run_dir: Path, edit, rnd: int = ROUNDS, rehash: bool = False) -> None:
    """Load round ``rnd``'s server state, ``edit`` each tensor, save it as a valid file;
    ``rehash``: record the new file's SHA-256 wherever one is recorded (a planted file)."""
    path = state_of(run_dir, rnd)
    save_file({k: edit(v).contiguous() for k, v in load_file(str(path)).items()}, str(path))
    if rehash:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        info = json.loads(latest(run_dir).read_text())
        info["sha256"][path.name] = digest
        latest(run_dir).write_text(json.dumps(info))
        if sums_file(run_dir, rnd).exists():
            sums = json.loads(sums_file(run_dir, rnd).read_text())
            sums[path.name] = digest
            sums_file(run_dir, rnd).write_text(json.dumps(sums))


def doubled(t: torch.Tensor) -> torch.Tensor:
    return t * 2 if t.is_floating_point() else t


def nan(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        t = t.clone()
        t.view(-1)[0] = float("nan")
    return t


def test_every_kept_round_records_its_checksums(finished):
    for rnd in (ROUNDS - 1, ROUNDS):
        sums = json.loads(sums_file(finished, rnd).read_text())
        folder = sums_file(finished, rnd).parent
        assert set(sums) == {"server.safetensors", "holdings.json"}
        for name, digest in sums.items():
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest


def test_resume_without_the_checksum_in_latest_json_still_refuses_a_changed_state(
        finished, tmp_path):
    """Deleting ``sha256`` from latest.json let a tampered checkpoint load."""
    run_dir = copy_of(finished, tmp_path)
    edit_latest(run_dir, sha256=None)
    rewrite_state(run_dir, doubled)
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=r"round_0003/server.safetensors: its SHA-256 "
                                              r"differs from the one recorded in .*round_0003/"
                                              r"sha256.json"):
        resume(run_dir)
    assert snapshot(run_dir) == before


def test_resume_with_no_checksum_recorded_anywhere_is_refused(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    edit_latest(run_dir, sha256=None)
    sums_file(run_dir).unlink(missing_ok=True)
    rewrite_state(run_dir, doubled)
    with pytest.raises(CheckpointError, match=r"round_0003/server.safetensors: no SHA-256 is "
                                              r"recorded for it"):
        resume(run_dir)


def test_export_refuses_a_checkpoint_with_flipped_bits(finished, tmp_path):
    """``fedkt export`` exported a flipped checkpoint (adapter sum |x| 4.1e38) with rc 0."""
    run_dir = copy_of(finished, tmp_path)
    flip_bit(state_of(run_dir))
    with pytest.raises(CheckpointError, match=r"round_0003/server.safetensors: its SHA-256 "
                                              r"differs"):
        export_model(run_dir, "server", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_of_an_earlier_round_checks_that_rounds_checksum(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    flip_bit(state_of(run_dir, ROUNDS - 1))
    assert main(["export", str(run_dir), str(tmp_path / "out"), "--participant", "server",
                 "--round", str(ROUNDS - 1)]) == 2
    err = capsys.readouterr().err
    assert "round_0002/server.safetensors: its SHA-256 differs" in err
    assert "Traceback" not in err


def test_export_refuses_a_nan_checkpoint_even_with_matching_checksums(finished, tmp_path):
    """A NaN checkpoint (its checksums recorded again) exported as a merged model of NaN."""
    run_dir = copy_of(finished, tmp_path)
    rewrite_state(run_dir, nan, rehash=True)
    with pytest.raises(CheckpointError, match=r"round_0003/server.safetensors: '.*' holds "
                                              r"non-finite values"):
        export_model(run_dir, "server", tmp_path / "out", merge=True)


def test_export_of_a_missing_checkpoint_names_the_file(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    state_of(run_dir).unlink()
    with pytest.raises(CheckpointError, match=r"round_0003/server.safetensors: missing"):
        export_model(run_dir, "server", tmp_path / "out")


def test_eval_refuses_a_checkpoint_with_flipped_bits(finished, tmp_path, capsys):
    """``fedkt eval`` reported accuracy 0.175 instead of 0.375 for a flipped checkpoint."""
    run_dir = copy_of(finished, tmp_path)
    flip_bit(state_of(run_dir))
    assert main(["eval", str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert "round_0003/server.safetensors: its SHA-256 differs" in captured.err
    assert "accuracy" not in captured.out
