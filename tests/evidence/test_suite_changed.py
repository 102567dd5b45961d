"""An edited suite file re-run into a folder of finished runs: the runs it changed are
refused by name with the keys that differ, before anything runs (or re-run on request)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedkt.cli import main
from fedkt.evidence.suite import SuiteChangedError, config_changes, load_suite, plan_runs
from fedkt.evidence.suite_keep import suite_status
from fedkt.evidence.suite_run import run_suite

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, lr: float, threads: int | None = 1) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "suites" / "quick.yaml").read_text())
    data["base"]["training"]["lr"] = lr
    if threads is None:
        del data["base"]["runtime"]
    data["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _finish(path: Path, threads: int | None = None) -> None:
    """Each run's folder as a finished run leaves it: its config.yaml, its last round."""
    suite = load_suite(path)
    for (arm, seed), cfg in suite.runs.items():
        run = suite.run_dir(arm, seed)
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "latest.json").write_text(json.dumps({"round": cfg.rounds}))
        (run / "metrics.jsonl").write_text("")
        saved = cfg.model_dump(mode="json")
        if threads is not None:  # as `fedkt run --set runtime.torch_threads=N` keeps it
            saved["runtime"]["torch_threads"] = threads
        (run / "config.yaml").write_text(yaml.safe_dump(saved))


def test_an_edited_suite_file_is_refused_by_run_and_key(tmp_path, capsys):
    path = _write(tmp_path, 5e-3)
    _finish(path)
    suite = load_suite(path)
    assert all(config_changes(suite.run_dir(a, s), c) == [] for (a, s), c in suite.runs.items())
    assert plan_runs(suite) == []  # all done, nothing changed
    _write(tmp_path, 5e-1)  # the same file, edited: base lr 5e-3 -> 5e-1
    with pytest.raises(SuiteChangedError) as err:
        run_suite(path, quiet=True)
    text = str(err.value)
    for arm in ("fedavg", "standalone"):
        for seed in (0, 1):
            assert f"{arm} seed {seed}: training.lr" in text
    assert "--rerun-changed" in text and "--output-dir" in text
    assert not (tmp_path / "out" / "suite.yaml").exists()  # refused before anything ran
    assert main(["suite", "run", str(path), "-q"]) == 2
    assert "fedavg seed 0: training.lr" in capsys.readouterr().err
    assert [s for _, _, s in suite_status(path)] == ["done, config changed: training.lr"] * 4
    todo = plan_runs(load_suite(path), rerun_changed=True)
    assert [(a, s, state) for a, s, _, state in todo] == [
        ("fedavg", 0, "new"), ("fedavg", 1, "new"), ("standalone", 0, "new"),
        ("standalone", 1, "new")]
    assert all(cfg.training.lr == 0.5 for _, _, cfg, _ in todo)


def test_threads_the_suite_gave_a_run_are_no_change(tmp_path):
    path = _write(tmp_path, 5e-3, threads=None)  # the suite splits the cores at run time
    _finish(path, threads=2)
    assert plan_runs(load_suite(path)) == []
