"""The command line as a user meets it: run, errors, resume, eval, report, list."""

from __future__ import annotations

import json

import pytest
import yaml

from fedkt.cli import main
from fedkt.tracking import without_timings
from tests.conftest import small_config
from tests.support.fault_injection import client_faults


def write_config(tmp_path, *overrides, name="run"):
    cfg = small_config(tmp_path / name, *overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(cfg.to_yaml())
    return path, cfg


def rows(run_dir):
    return without_timings(json.loads(line) for line in
                           (run_dir / "metrics.jsonl").read_text().splitlines())


def test_bad_config_value_names_key(tmp_path, capsys):
    path, _ = write_config(tmp_path)
    assert main(["run", str(path), "--set", "training.batch_size=0"]) == 2
    err = capsys.readouterr().err
    assert "training.batch_size" in err and "greater than or equal to 1" in err


def test_missing_data_file_is_named(tmp_path, capsys):
    path, _ = write_config(tmp_path, "data.dataset={path: nowhere/data.jsonl, task: classification}")
    assert main(["run", str(path)]) == 2
    assert "nowhere/data.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_dataset_missing_mapped_field_is_named(tmp_path, capsys):
    data = tmp_path / "tweets.jsonl"
    data.write_text("\n".join(json.dumps({"tweet": f"t{i}", "y": i % 2}) for i in range(9))
                    + "\n" + json.dumps({"text": "oops", "y": 1}) + "\n")
    path, _ = write_config(
        tmp_path, f"data.dataset={{path: {data}, task: classification, "
        "fields: {text: tweet, label: y}, label_names: [neg, pos]}")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tweets.jsonl" in err and "'tweet'" in err


def test_client_failure_then_resume_matches_uninterrupted_run(tmp_path, capsys):
    clean_path, clean = write_config(tmp_path, "rounds=3", name="clean")
    assert main(["run", str(clean_path), "-q"]) == 0
    path, cfg = write_config(tmp_path, "rounds=3", name="faulty")
    with client_faults("fedavg", "0:2"):
        assert main(["run", str(path), "-q"]) == 1
    err = capsys.readouterr().err
    assert "round 2" in err and "client 0" in err and f"fedkt resume {cfg.run_dir}" in err
    assert main(["resume", str(cfg.run_dir), "-q"]) == 0
    assert rows(cfg.run_dir) == rows(clean.run_dir)
    # A finished run is not overwritten by accident.
    assert main(["run", str(path)]) == 2
    assert "fedkt resume" in capsys.readouterr().err


def test_eval_report_and_list(tmp_path, capsys):
    path, cfg = write_config(tmp_path, "rounds=1")
    assert main(["run", str(path), "-q"]) == 0
    capsys.readouterr()
    assert main(["eval", str(cfg.run_dir)]) == 0
    out = capsys.readouterr().out
    last = [r for r in rows(cfg.run_dir) if r["participant"] == "server" and r["split"] == "test"]
    assert f"{last[-1]['accuracy']:.4f}" in out
    assert main(["report", str(cfg.run_dir), "-o", str(tmp_path / "r.md")]) == 0
    table = (tmp_path / "r.md").read_text()
    assert "fedavg" in table and "|" in table
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "fedavg" in listing and "intent_recognition" in listing and "tiny-llama" in listing


def test_resume_needs_a_run_folder(tmp_path, capsys):
    assert main(["resume", str(tmp_path)]) == 2
    assert "not a fedkt run folder" in capsys.readouterr().err


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("run", "resume", "eval", "report", "list"):
        assert command in out
    assert yaml  # imported for config writing helpers


def test_list_imports_no_torch_and_lists_every_entry():
    """`fedkt list` in a fresh interpreter reads the by-name tables: no torch, no method
    package, no config schema; yet every method (with its summary), dataset and preset is
    listed, and a plugin's method (FEDKT_PLUGINS) too."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    code = ("import sys; from fedkt.cli import main; rc = main(['list']); "
            "heavy = sorted(m for m in sys.modules if m in ('torch', 'transformers', "
            "'fedkt.config.schema') or (m.startswith('fedkt.methods.') and m.count('.') >= 2 "
            "and m not in ('fedkt.methods.registry', 'fedkt.config.method_catalog', "
            "'fedkt.methods.errors'))); "
            "print(rc, heavy)")
    env = {**os.environ, "FEDKT_PLUGINS": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    listing, last = out.stdout.rsplit("\n", 2)[0], out.stdout.splitlines()[-1]
    assert last == "0 []", last
    # What the imported tables hold (this process may import them all).
    from fedkt.data import list_builtin
    from fedkt.data.image_records import list_image_builtin
    from fedkt.methods import available, get_method
    from fedkt.models import OFFLINE_ALIASES, TINY_PRESETS

    for name in available():
        assert f"  {name:<18} {get_method(name).docs.summary}\n" in listing + "\n", name
    for name, desc in (list_builtin() | list_image_builtin()).items():
        assert f"  {name:<18} {desc}" in listing, name
    assert f"tiny model presets: {', '.join(sorted(TINY_PRESETS))}" in listing
    assert ", ".join(sorted(OFFLINE_ALIASES)) in listing
    # A plugin registers a method: `fedkt list` imports it and shows it.
    env["FEDKT_PLUGINS"] = "tests.support.plugin_method"
    out = subprocess.run([sys.executable, "-m", "fedkt.cli", "list"], capture_output=True,
                         text=True, cwd=root, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "fedavg_plugin_variant" in out.stdout and "under a plugin's name" in out.stdout
    env["FEDKT_PLUGINS"] = "tests.no_such_plugin"
    out = subprocess.run([sys.executable, "-m", "fedkt.cli", "list"], capture_output=True,
                         text=True, cwd=root, env=env, timeout=300)
    assert out.returncode == 2 and "FEDKT_PLUGINS='tests.no_such_plugin'" in out.stderr
