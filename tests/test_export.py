"""``fedkt export``: plain transformers + peft (a process that never imports fedkt) reload
the export and score every test item as fedkt's evaluation of the same checkpoint does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedkt.cli import main
from fedkt.config import load_config, parse_config
from fedkt.configs.catalog import resolve_config
from fedkt.data.formatting import mc_view
from fedkt.eval import predictions
from fedkt.export import ExportError, _participant_lm, export_model
from fedkt.runner import run
from fedkt.train.lm import evaluate_lm
from tests.conftest import run_data_of

RELOAD = Path(__file__).parent / "support" / "export_reload.py"
TOL = 1e-5  # fp32 on both sides


def _run(tmp_path: Path, config: str, *sets: str) -> Path:
    run_dir = tmp_path / "run"
    cfg = load_config(resolve_config(config), [
        "rounds=1", "training.precision=fp32", "eval.plots=false", "eval.round0=false",
        f"output_dir={run_dir}", *sets])
    run(cfg, quiet=True)
    return run_dir


def _fedkt_scores(run_dir: Path, participant: str) -> tuple[list[list[float]], dict]:
    """fedkt's per-choice log-likelihoods of the run's test items, for the participant's
    model after the last round, and the items as the reload script reads them."""
    cfg = load_config(run_dir / "config.yaml", [f"output_dir={run_dir}"])
    lm, _ = _participant_lm(cfg, run_dir, participant, 1)
    test = run_data_of(cfg).test
    with predictions.capture() as sink:
        evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    fd = run_data_of(cfg)
    views = [mc_view(r, fd.task, fd.label_names, fd.template) for r in test]
    items = {"max_length": cfg.data.max_length, "items": [[v[0], list(v[1])] for v in views]}
    return sink[""].columns["scores"], items


def _reloaded_scores(items: dict, tmp_path: Path, *outs: Path) -> list[list[list[float]]]:
    """Each export's scores of ``items``, from one process that never imports fedkt."""
    spec = tmp_path / "items.json"
    spec.write_text(json.dumps(items))
    done = subprocess.run([sys.executable, str(RELOAD), str(spec), *map(str, outs)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_same(ours: list[list[float]], theirs: list[list[float]]) -> None:
    assert len(ours) == len(theirs) > 0
    worst = max(abs(a - b) for r, s in zip(ours, theirs, strict=True)
                for a, b in zip(r, s, strict=True))
    assert worst <= TOL, f"largest score difference {worst:.2e} > {TOL}"


def test_lora_adapter_and_merged_model_reload_without_fedkt(tmp_path):
    run_dir = _run(tmp_path, "fedavg/tiny", "training.lora.target_modules=all-linear")
    ours, items = _fedkt_scores(run_dir, "server")
    adapter = tmp_path / "adapter"
    assert main(["export", str(run_dir), str(adapter)]) == 0
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
            "fedkt_export.json", "base_model"} <= {p.name for p in adapter.iterdir()}
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and any(v.abs().max() > 0 for v in lora_b), "B starts at 0: not trained"
    merged = tmp_path / "merged"
    res = export_model(run_dir, "server", merged, merge=True)
    assert res.kind == "merged" and not (merged / "adapter_config.json").exists()
    initial = export_model(run_dir, "server", tmp_path / "r0", round=0, merge=True)
    assert initial.round == 0
    from_adapter, from_merged, from_initial = _reloaded_scores(items, tmp_path, adapter, merged,
                                                               initial.path)
    _assert_same(ours, from_adapter)
    _assert_same(ours, from_merged)
    # The round-0 (initial) model is another model: its scores differ.
    assert max(abs(a - b) for r, s in zip(ours, from_initial, strict=True)
               for a, b in zip(r, s, strict=True)) > 1e-3


@pytest.mark.slow
def test_client_adapter_of_a_standalone_run(tmp_path):
    run_dir = _run(tmp_path, "fedavg/tiny", "method.name=standalone")
    ours, items = _fedkt_scores(run_dir, "client_1")
    out = tmp_path / "client_1"
    export_model(run_dir, "client_1", out)
    _assert_same(ours, _reloaded_scores(items, tmp_path, out)[0])


def test_prefix_tuning_exports_as_adapter_and_refuses_merge(tmp_path):
    run_dir = _run(tmp_path, "fedsp/tiny")
    ours, items = _fedkt_scores(run_dir, "server")
    out = tmp_path / "prefix"
    export_model(run_dir, "server", out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "PREFIX_TUNING"
    _assert_same(ours, _reloaded_scores(items, tmp_path, out)[0])
    with pytest.raises(ExportError, match="--merge: .*cannot be folded"):
        export_model(run_dir, "server", tmp_path / "m", merge=True)


def _unrun(tmp_path: Path, config: str, *sets: str) -> Path:
    """A run folder with only its config (nothing trained: round 0)."""
    run_dir = tmp_path / "unrun"
    cfg = load_config(resolve_config(config), [f"output_dir={run_dir}", *sets])
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    return run_dir


@pytest.mark.parametrize(("config", "participant", "message"), [
    ("fedkd/tiny", "server", "'fedkd' holds no causal LM .*transformers cannot load"),
    ("fedavg/tiny", "client_0", "'fedavg' keeps no causal LM per client"),
    ("fedavg/tiny", "global_slm", "'fedavg' has no global_slm"),
    ("fedavg/tiny", "client_7", "the run's clients are client_0, client_1, client_2"),
    ("fedavg/tiny", "clients", "expected server, global_slm or client_K"),
])
def test_refusals_name_the_participant_and_why(tmp_path, capsys, config, participant, message):
    run_dir = _unrun(tmp_path, config)
    with pytest.raises(ExportError, match=message):
        export_model(run_dir, participant, tmp_path / "out")
    assert main(["export", str(run_dir), str(tmp_path / "out2"), "--participant",
                 participant]) == 2
    assert participant in capsys.readouterr().err


def test_missing_round_and_non_empty_folder(tmp_path):
    run_dir = _unrun(tmp_path, "fedavg/tiny")
    with pytest.raises(ExportError, match="--round 3: .* no checkpoint"):
        export_model(run_dir, "server", tmp_path / "out", round=3)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        export_model(run_dir, "server", tmp_path / "full")


def test_full_fine_tuning_exports_the_whole_model(tmp_path):
    run_dir = _unrun(tmp_path, "fedavg/tiny", "training.peft=full")
    out = export_model(run_dir, "server", tmp_path / "out").path
    cfg = parse_config(json.loads(json.dumps(
        load_config(run_dir / "config.yaml").model_dump(mode="json"))))
    assert cfg.training.peft == "full"
    assert json.loads((out / "fedkt_export.json").read_text())["kind"] == "full"
    state = load_file(str(out / "model.safetensors"))
    assert not any("lora" in k for k in state) and all(
        v.dtype == torch.float32 for v in state.values())
