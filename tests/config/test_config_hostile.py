"""Hostile config files and command lines: each is refused early, with the key, line or
path named, in bounded time and memory, and nothing outside a run folder is touched.

* YAML alias bombs ("billion laughs"), anywhere in the file (an unknown key, ``name:``,
  a ``--set`` value), are refused while loading; error messages never build a whole
  ``repr`` to cut it;
* nesting deeper than a bound is a named error, not a ``RecursionError``;
* a key given twice is refused with both lines;
* ``name`` is a safe file name (``../../x`` cannot move the run folder);
* a FIFO as the dataset path is refused (reading it would block for ever);
* ``--overwrite`` empties only a fedkt run folder.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedkt.cli import main
from fedkt.config import ConfigError, load_config
from fedkt.config.messages import _short
from tests.conftest import ROOT, small_config


def write_config(tmp_path: Path, *overrides: str, extra: str = "") -> Path:
    """A small run config as a file (into ``tmp_path/run``), with ``extra`` YAML text
    appended."""
    cfg = small_config(tmp_path / "run", *overrides)
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.to_yaml() + extra)
    return path


def bomb(levels: int = 9, width: int = 9, indent: str = "  ") -> str:
    """A "billion laughs" YAML mapping body: ``width ** levels`` strings from ~1 KB."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _limited(mib: int):
    def limit() -> None:  # the child process only: an unfixed loader dies, never the host
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))
    return limit


def fedkt_cli(*args: str, mem_mib: int = 4096, timeout: float = 120
              ) -> subprocess.CompletedProcess:
    """``python -m fedkt.cli ARGS`` under an address-space cap and a timeout."""
    return subprocess.run([sys.executable, "-m", "fedkt.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, preexec_fn=_limited(mem_mib))


# --------------------------------------------------------------------------- alias bombs


@pytest.mark.parametrize("where", ["unknown_key", "name"])
def test_an_alias_bomb_is_refused_fast_with_bounded_memory(tmp_path, where):
    body = bomb()
    if where == "unknown_key":
        path = write_config(tmp_path, extra="bomb:\n" + body)
    else:
        text = write_config(tmp_path).read_text().replace("name: test\n", "")
        path = tmp_path / "cfg.yaml"
        path.write_text(text + "name:\n" + body)
    assert len(path.read_bytes()) < 4096
    t0 = time.perf_counter()
    try:
        done = fedkt_cli("run", str(path), "-q")
    except subprocess.TimeoutExpired:
        pytest.fail("fedkt did not stop within 120 s on a 1 KB alias bomb")
    seconds = time.perf_counter() - t0
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"fedkt: error: config file {path}" in done.stderr
    assert "aliases expand to more than" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr) < 2000 and seconds < 60
    assert not (tmp_path / "run").exists()


def test_an_alias_bomb_in_a_set_value_is_refused(tmp_path):
    path = write_config(tmp_path)
    value = "{" + bomb(indent="").replace("\n", ", ").rstrip(", ") + "}"
    with pytest.raises(ConfigError, match=r"override data.dataset.fields: .*aliases expand"):
        load_config(path, [f"data.dataset.fields={value}"])


def test_modest_anchors_still_load(tmp_path):
    """Anchors and aliases as people use them (one model's settings twice) load as before."""
    file = tmp_path / "anchors.yaml"
    file.write_text("method: fedcollm\ndata: {dataset: {name: intent_recognition}}\n"
                    "server: &m {name: tiny-llama, dtype: bfloat16}\n"
                    "clients: {num_clients: 2, models: [*m]}\n")
    cfg = load_config(file)
    assert cfg.server is not None and cfg.server.dtype == "bfloat16"
    assert cfg.clients.models[0] == cfg.server


def test_short_never_builds_a_whole_repr():
    """``_short`` of a shared structure of 9**9 leaves returns at once, cut to its limit."""
    leaf: list = ["lol"] * 9
    for _ in range(8):
        leaf = [leaf] * 9
    t0 = time.perf_counter()
    text = _short({"bomb": leaf})
    assert time.perf_counter() - t0 < 1
    assert text.startswith("{'bomb': [[[[") and text.endswith("...") and len(text) == 80
    assert _short("x" * 10**7, 20) == "'xxxxxxxxxxxxxxxx..."
    assert _short(10**5000) == "<int of 16610 bits>"
    assert _short({"a": [1, 2.5, None, True]}) == "{'a': [1, 2.5, None, True]}"


# --------------------------------------------------------------------------- nesting, duplicates


@pytest.mark.parametrize("deep", ["[" * 5000 + "]" * 5000, "{a: " * 3000 + "1" + "}" * 3000])
def test_deep_nesting_is_a_named_error_not_a_recursion_error(tmp_path, capsys, deep):
    path = write_config(tmp_path, extra=f"deep: {deep}\n")
    assert main(["run", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"fedkt: error: config file {path}: nested more than 64 levels deep" in err
    assert "line " in err and "Recursion" not in err and len(err) < 1000


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, capsys):
    path = write_config(tmp_path)
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, start=1) if line.startswith("rounds:"))
    path.write_text("\n".join(lines) + "\nrounds: 9\n")
    assert main(["run", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert (f"fedkt: error: config file {path}: key 'rounds' is given twice, on lines {first} "
            f"and {len(lines) + 1}") in err
    nested = tmp_path / "nested.yaml"
    nested.write_text("method: fedavg\ntraining:\n  lr: 1\n  batch_size: 2\n  lr: 3\n")
    with pytest.raises(ConfigError, match=r"key 'lr' is given twice, on lines 3 and 5"):
        load_config(nested)


# --------------------------------------------------------------------------- name, data path


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "x" * 300, "a\x00b", "a\\b"])
def test_name_must_be_a_safe_file_name(tmp_path, capsys, name):
    path = write_config(tmp_path)
    parent = tmp_path / "runs"
    code = main(["run", str(path), "-q", "--set", f"name={name!r}" if "\x00" not in name
                 else 'name="a\\0b"', "--output-dir", str(parent / "{name}")])
    assert code == 2
    err = capsys.readouterr().err
    assert "  name: " in err and "safe file name" in err
    assert not parent.exists() and not (tmp_path.parent / "x").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_as_the_dataset_is_refused_not_read(tmp_path, capsys):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    path = write_config(tmp_path, f"data.dataset={{path: {fifo}, task: classification}}")
    done = fedkt_cli("run", str(path), "-q", timeout=90)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"fedkt: error: {fifo}: not a regular file" in done.stderr


# --------------------------------------------------------------------------- --overwrite


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    precious = tmp_path / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "precious.txt").write_text("keep me")
    (precious / "sub" / "p2.txt").write_text("keep me too")
    path = write_config(tmp_path)
    assert main(["run", str(path), "-q", "--output-dir", str(precious)]) == 2
    err = capsys.readouterr().err
    assert f"run folder {precious} is not empty and is not a fedkt run" in err
    assert "--overwrite" not in err
    assert main(["run", str(path), "-q", "--output-dir", str(precious), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert (f"fedkt: error: --overwrite: {precious} is not a fedkt run folder (no "
            "config.yaml beside .fedkt.lock, metrics.jsonl or checkpoints/latest.json); "
            "--overwrite empties only run folders") in err
    assert (precious / "precious.txt").read_text() == "keep me"
    assert (precious / "sub" / "p2.txt").read_text() == "keep me too"
    assert sorted(p.name for p in precious.iterdir()) == ["precious.txt", "sub"]


def test_overwrite_replaces_a_run_folder(tmp_path, capsys):
    path = write_config(tmp_path, "rounds=1", "eval.round0=false")
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "-q"]) == 0
    (run_dir / "note.txt").write_text("x")
    assert main(["run", str(path), "-q"]) == 2
    assert "--overwrite starts afresh" in capsys.readouterr().err
    assert main(["run", str(path), "-q", "--overwrite"]) == 0
    assert not (run_dir / "note.txt").exists() and (run_dir / "metrics.jsonl").is_file()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rounds"] == 1
