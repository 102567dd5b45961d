"""Planted symbolic links in a run or export folder: fedkt follows none of them.

A link where fedkt writes (the lock, ``checkpoints/``, ``predictions/``, ``clients/``,
a round folder, an export's temporary ``.adapter``) is refused with its path named,
before anything is written or deleted, and the link's target is left as it was.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from fedkt.cli import main
from fedkt.tracking import LOCK_FILE
from tests.conftest import copy_of, finished_run

ROUNDS = 2


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round FedAvg run (tiny models), copied by each test."""
    return finished_run(tmp_path_factory, f"rounds={ROUNDS}")


def tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (links not followed) with its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def target_with(tmp_path: Path, *files: str) -> Path:
    """A folder outside the run holding ``files`` (each with its own text)."""
    target = tmp_path / "elsewhere"
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text(f"precious {name}\n")
    target.mkdir(exist_ok=True)
    return target


def planted(finished: Path, tmp_path: Path, name: str, target: Path) -> Path:
    """A copy of the finished run whose ``name`` is a link to ``target``."""
    run_dir = copy_of(finished, tmp_path)
    where = run_dir / name
    if where.is_dir():
        shutil.rmtree(where)
    else:
        where.unlink(missing_ok=True)
    where.symlink_to(target)
    return run_dir


def refused(capsys, *argv: str, quiet: bool = True) -> str:
    assert main([*argv, "-q"] if quiet else list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_lock_file_that_is_a_link_is_refused(finished, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run_dir = planted(finished, tmp_path, LOCK_FILE, victim)
    err = refused(capsys, "resume", str(run_dir), "--set", "rounds=3")
    assert f"fedkt: error: {run_dir / LOCK_FILE}: a symbolic link" in err
    assert victim.read_text() == "precious\n"
    config = tmp_path / "cfg.yaml"
    config.write_text((run_dir / "config.yaml").read_text())
    err = refused(capsys, "run", str(config), "--output-dir", str(run_dir), "--overwrite")
    assert f"{run_dir / LOCK_FILE}: a symbolic link" in err
    assert victim.read_text() == "precious\n" and (run_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize("name, files", [
    ("checkpoints", ["round_0000/keep.txt", "round_0001/keep.txt", "latest.json"]),
    ("predictions", ["round_0004/keep.json.gz", "round_0001/server.json.gz"]),
    ("clients", ["client_0/keep.txt"]),
])
def test_a_run_subfolder_that_is_a_link_is_refused_and_its_target_kept(finished, tmp_path,
                                                                        capsys, name, files):
    target = target_with(tmp_path, *files)
    if name == "checkpoints":  # the real checkpoints, so that resume would get far
        shutil.copytree(finished / "checkpoints", target, dirs_exist_ok=True)
    before = tree(target)
    run_dir = planted(finished, tmp_path, name, target)
    err = refused(capsys, "resume", str(run_dir), "--set", "rounds=4")
    assert f"fedkt: error: {run_dir / name}: a symbolic link" in err
    assert "fedkt writes nothing through a link" in err
    assert tree(target) == before


@pytest.mark.parametrize("where", ["checkpoints/round_0001", "predictions/round_0002"])
def test_a_round_folder_that_is_a_link_is_refused(finished, tmp_path, capsys, where):
    target = target_with(tmp_path, "keep.txt")
    before = tree(target)
    run_dir = copy_of(finished, tmp_path)
    link = run_dir / where
    if link.exists():
        shutil.rmtree(link)
    link.symlink_to(target)
    err = refused(capsys, "resume", str(run_dir), "--set", "rounds=4")
    assert f"fedkt: error: {link}: a symbolic link" in err
    assert tree(target) == before and link.is_symlink()


def test_export_refuses_a_planted_adapter_link(finished, tmp_path, capsys):
    target = target_with(tmp_path, "a.txt", "b/c.txt")
    before = tree(target)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".adapter").symlink_to(target)
    err = refused(capsys, "export", str(finished), str(out), "--merge", "--overwrite",
                  quiet=False)
    assert f"fedkt: error: {out / '.adapter'}: a symbolic link" in err
    assert tree(target) == before


def test_pruning_never_deletes_through_a_link(finished, tmp_path):
    """The recorder itself refuses to prune a round folder that is a link."""
    from fedkt.tracking import RunRecorder
    from fedkt.tracking.folder import PlantedLink

    target = target_with(tmp_path, "keep.txt")
    run_dir = copy_of(finished, tmp_path)
    recorder = RunRecorder(run_dir, resume=True)  # (it refuses a folder with the link)
    (run_dir / "checkpoints" / "round_0000").symlink_to(target)  # planted while it runs
    with pytest.raises(PlantedLink, match=r"checkpoints/round_0000: a symbolic link"):
        recorder.prune_checkpoints(keep=1)
    assert (target / "keep.txt").read_text() == "precious keep.txt\n"
