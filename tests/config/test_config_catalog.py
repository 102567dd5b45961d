"""Shipped configs: found by name from any folder, listed, printed, run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import fedkt
from fedkt.cli import build_parser, main
from fedkt.config import load_config
from fedkt.configs.catalog import (
    CONFIGS_DIR,
    DEFAULT_CONFIG,
    UnknownConfigError,
    config_description,
    packaged_configs,
    resolve_config,
)
from fedkt.evidence.suite import load_suite
from tests.conftest import ROOT


def test_every_shipped_config_resolves_and_validates_from_an_empty_folder(tmp_path, monkeypatch):
    """What a pip user without a clone has: names resolve inside the package, from anywhere."""
    monkeypatch.chdir(tmp_path)
    shipped = packaged_configs()
    assert len(shipped) >= 40 and {"demo", "fedmkt/hetero", "fedkd/quick"} <= set(shipped)
    package = CONFIGS_DIR.parent
    assert package.resolve() == Path(fedkt.__file__).resolve().parent
    for name, path in shipped.items():
        resolved = resolve_config(name)
        assert resolved == path and resolved.is_relative_to(package), name
        # The docs' path form resolves to the same file outside a clone too.
        assert resolve_config(f"configs/{name}.yaml") == path, name
        if name.startswith("suites/"):  # a suite: every (arm, seed) config validates
            suite = load_suite(resolved, tmp_path / "unused")
            assert suite.runs and all(c.rounds >= 1 for c in suite.runs.values()), name
            continue
        cfg = load_config(resolved)
        assert cfg.name and cfg.rounds >= 1, name
    assert not list(tmp_path.iterdir())  # nothing was copied or written


def test_repo_configs_folder_is_the_package_one():
    """A clone's `configs/` is the same files (a link), not a copy that could drift."""
    repo = ROOT / "configs"
    assert repo.resolve() == CONFIGS_DIR.resolve()
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*.yaml")) == sorted(
        p.relative_to(CONFIGS_DIR).as_posix() for p in packaged_configs().values())


def test_existing_path_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((CONFIGS_DIR / "demo.yaml").read_text())
    (tmp_path / "demo").write_text(yaml.safe_dump({**data, "name": "mine"}))
    assert resolve_config("demo") == tmp_path.joinpath("demo").relative_to(tmp_path)
    assert load_config(resolve_config("demo")).name == "mine"
    (tmp_path / "demo").unlink()
    assert resolve_config("demo") == packaged_configs()["demo"]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text(yaml.safe_dump({**data, "name": "local"}))
    assert load_config(resolve_config("configs/demo.yaml")).name == "local"


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownConfigError, match="did you mean: fedmkt/hetero") as err:
        resolve_config("fedmkt/hetro")
    assert "fedkt configs list" in str(err.value)
    with pytest.raises(UnknownConfigError, match="neither a file nor a shipped config") as err:
        resolve_config("zzzz/qqqq")
    assert "did you mean" not in str(err.value)


def test_default_is_one_constant():
    assert DEFAULT_CONFIG in packaged_configs()
    assert resolve_config(None) == packaged_configs()[DEFAULT_CONFIG]
    assert build_parser().parse_args(["run"]).config is None  # -> resolve_config(None)


def test_description_is_the_leading_comment_sentence(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("# FedKD (Wu et al. 2022) on tweets: a\n# teacher per client. More text.\n"
                    "#   fedkt run x\nname: x\n")
    assert config_description(path) == "FedKD (Wu et al. 2022) on tweets: a teacher per client"
    path.write_text("# Baseline for configs/fedkd/fedkd.yaml, same data\nname: x\n")
    assert config_description(path) == "Baseline for fedkd/fedkd, same data"
    path.write_text("name: x\n# not leading\n")
    assert config_description(path) == ""
    path.write_text("# " + "word " * 40 + "\nname: x\n")
    assert len(config_description(path, width=30)) == 30


def test_cli_configs_list_and_show(capsys):
    assert main(["configs", "list"]) == 0
    out = capsys.readouterr().out
    lines = {line[2:].split()[0]: line for line in out.splitlines() if line[:2] in ("* ", "  ")}
    assert set(packaged_configs()) <= set(lines)
    assert lines[DEFAULT_CONFIG].startswith("* ")
    assert "FedKD on tiny-bert" in lines["fedkd/quick"]
    assert main(["configs", "show", "fedkd/quick"]) == 0
    assert capsys.readouterr().out == (CONFIGS_DIR / "fedkd" / "quick.yaml").read_text()
    assert main(["configs", "show", "--path", "demo"]) == 0
    assert capsys.readouterr().out.strip() == str(CONFIGS_DIR / "demo.yaml")
    assert main(["configs", "show", "fedkd/quik"]) == 2
    assert "did you mean: fedkd/quick" in capsys.readouterr().err


def test_cli_run_unknown_name_exits_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "fedmkt/hetro"]) == 2
    assert "did you mean: fedmkt/hetero" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_run_quickstart_by_name_from_an_empty_folder(tmp_path, monkeypatch, capsys):
    """`fedkt run quickstart` from a folder with nothing in it: runs/quickstart appears there
    (the default demo itself, on a real checkpoint, runs in tests/test_demo.py, slow)."""
    monkeypatch.chdir(tmp_path)
    small = ["--set", "clients.num_clients=2", "--set", "data.max_private_per_client=16",
             "--set", "data.split.test_size=16", "--set", "training.local_epochs=1",
             "--set", "data.max_length=48"]
    assert main(["run", "quickstart", "--rounds", "1", "-q", *small]) == 0
    run = tmp_path / "runs" / "quickstart"
    assert yaml.safe_load((run / "config.yaml").read_text())["name"] == "quickstart"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["round"] for r in rows} == {0, 1}  # round 0: eval.round0
    assert {r["participant"] for r in rows} >= {"client_0", "client_1"}
    assert "runs/quickstart" in capsys.readouterr().out


def test_cli_configs_explain_a_key_a_method_key_and_a_section(capsys):
    from fedkt.config import EvalConfig, TrainingConfig
    from fedkt.methods.fedmkt.config import FedMKTConfig

    assert main(["configs", "explain", "training.lr"]) == 0
    out = capsys.readouterr().out
    assert "type:     float" in out and "bounds:   > 0" in out and "default:  0.0003" in out
    assert " ".join(out.split()).endswith(TrainingConfig.model_fields["lr"].description)

    assert main(["configs", "explain", "method.selection", "--method", "fedmkt"]) == 0
    out = capsys.readouterr().out
    assert "allowed:  dual_min_ce, entropy, always" in out and "default:  'dual_min_ce'" in out
    assert FedMKTConfig.model_fields["selection"].description[:60] in " ".join(out.split())

    assert main(["configs", "explain", "training.peft"]) == 0
    assert "allowed:  lora, prefix, full, none" in capsys.readouterr().out
    assert main(["configs", "explain", "clients.models.1.lr"]) == 0  # a list's index
    assert capsys.readouterr().out.startswith("clients.models.lr\n")

    assert main(["configs", "explain", "eval"]) == 0
    out = capsys.readouterr().out
    listed = [line.split(":")[0].strip() for line in out.splitlines()
              if line.startswith("    eval.")]
    assert listed == [f"eval.{name}" for name in EvalConfig.model_fields]


def test_cli_configs_explain_unknown_key_names_the_closest_and_exits_nonzero(capsys):
    assert main(["configs", "explain", "trainig.lr"]) == 2
    err = capsys.readouterr().err
    assert "trainig.lr: unknown config key" in err and "closest: training.lr" in err
    assert main(["configs", "explain", "method.top_kk", "--method", "fedmkt"]) == 2
    err = capsys.readouterr().err
    assert "method.top_kk: unknown config key of method 'fedmkt'" in err
    assert "method.top_k" in err
    assert main(["configs", "explain", "method.top_k"]) == 2  # which method's?
    assert "add --method NAME (methods with it: fedcollm, fedmkt, llm2slm)" in \
        capsys.readouterr().err
    assert main(["configs", "explain", "method.top_k", "--method", "nosuch"]) == 2
    assert "unknown method 'nosuch'" in capsys.readouterr().err


def test_fedkt_configs_explain_imports_neither_torch_nor_the_method():
    """`fedkt configs explain` through the whole CLI (its parser, the deploy commands, the
    error handling of `main`) imports no torch and no method algorithm."""
    import subprocess
    import sys

    code = ("import sys; from fedkt.cli import main; "
            "rc = main(['configs', 'explain', 'method.top_k', '--method', 'fedmkt']); "
            "print(rc, 'torch' in sys.modules, 'fedkt.methods.fedmkt.algorithm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2], timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Logits kept per position" in out.stdout
    assert out.stdout.splitlines()[-1] == "0 False False"
