"""FedSP's gradient-agreement probe (benchmarks/fedsp_probe.py): its grid on a tiny LLM."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from fedkt.config import load_config
from fedkt.errors import ConfigError
from tests.conftest import load_benchmark

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def probe():
    """benchmarks/fedsp_probe.py as a module."""
    return load_benchmark("fedsp_probe")


def test_slot_cosines_are_per_prefix_layer():
    fp = probe()
    a = torch.randn(4, 3 * 10, generator=torch.Generator().manual_seed(0))
    b = a.clone().view(4, 3, 10)
    b[:, 1] *= -1  # slot 1 reversed, slots 0 and 2 unchanged
    b = b.reshape(4, 30)
    assert fp.slot_cosines(a, b, 3) == pytest.approx([1.0, -1.0, 1.0], abs=1e-6)
    assert -1.0 < fp.cosine(a, b) < 1.0


def test_random_controls_take_the_aux_paths_step_norms_and_distance():
    fp = probe()
    cfg = load_config(ROOT / "fedkt" / "configs" / "fedsp" / "tiny.yaml")
    p0 = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    target = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    path = fp.optimiser_path(lambda p: p - target, cfg, p0, steps=5, lr=0.05)
    norms = fp.step_norms(path)
    assert len(path) == 6 and all(n > 0 for n in norms)
    assert (path[-1] - target).norm() < (p0 - target).norm()  # descends the quadratic
    walk = fp.random_steps(p0, norms, seed=0)
    assert fp.step_norms(walk) == pytest.approx(norms, rel=1e-4)  # the same norm, step by step
    assert abs(fp.cosine(walk[1] - p0, path[1] - p0)) < 0.5  # but not the same direction
    assert torch.equal(walk[-1], fp.random_steps(p0, norms, seed=0)[-1])  # seeded
    assert not torch.equal(walk[-1], fp.random_steps(p0, norms, seed=1)[-1])
    far = fp.random_at(p0, float((path[-1] - p0).norm()), seed=0)
    assert float((far - p0).norm()) == pytest.approx(float((path[-1] - p0).norm()), rel=1e-4)


def test_grid_on_a_tiny_llm_the_whole_llm_as_auxiliary_model_agrees_exactly(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path / "cache"))
    fp = probe()
    cfg = load_config(ROOT / "fedkt" / "configs" / "fedsp" / "tiny.yaml")
    args = argparse.Namespace(inits="text", cells="n1,all", client=0, examples=8, heldout=8,
                              steps=3, adam_lr=1e-2, seeds=2, ref_kd_steps=4, align=2,
                              paths=None, json=str(tmp_path / "grid.json"))
    rows = fp.run_grid(cfg, args)
    one, full = rows
    assert one["cell"].startswith("N=1") and full["cell"] == "N=4 (all), no KD"
    # N = all layers is the LLM: the same gradient in every slot, the same path
    assert full["cosine"] == pytest.approx(1.0, abs=1e-5)
    assert full["slot_cosines"] == pytest.approx([1.0] * 4, abs=1e-5)
    assert full["heldout_aux"] == pytest.approx(full["heldout_llm"], abs=1e-5)
    # a one-layer cut of a random tiny LLM is not: its gradient differs
    assert one["cosine"] < 0.9 and one["kd"]["kd_steps"] == 8
    # the random controls move as far as the auxiliary model's path does, step by step
    assert len(one["step_norms"]) == 3 and len(one["heldout_random_steps"]) == 2
    assert one["distance"] <= sum(one["step_norms"]) + 1e-6
    assert (tmp_path / "grid.json").is_file()


def test_server_only_control_moves_its_prompts_further_at_a_larger_budget(capsys):
    fp = probe()
    cfg = load_config(ROOT / "fedkt" / "configs" / "fedsp" / "tiny.yaml")
    cfg = cfg.model_copy(update={"method": cfg.method.model_copy(update={"server_only": True})})
    small, large = fp.server_only_moves(cfg, [(1, 1, 1e-4), (2, 3, 1e-2)], heldout=8,
                                        evaluate=6)
    assert 0 < small["moved"] < large["moved"]
    assert large["heldout_pt"] != large["heldout_p0"]
    assert 0 <= small["changed"] <= 6 and small["accuracy_p0"] == large["accuracy_p0"]
    assert "| 2 × 3 | 0.01 |" in capsys.readouterr().out


def probe_args(*argv: str) -> argparse.Namespace:
    """The probe's arguments as its command line parses them (parsed, not run)."""
    fp = probe()
    seen: dict[str, argparse.Namespace] = {}

    def keep(args: argparse.Namespace) -> None:
        seen["args"] = args

    fp.cut_mode, saved = keep, fp.cut_mode
    try:
        fp.main(list(argv))
    finally:
        fp.cut_mode = saved
    return seen["args"]


def test_config_option_takes_a_fedsp_run_config_by_path_or_name():
    fp = probe()
    default = fp.base_config(probe_args())
    assert default.server.name == "smollm2-135m"  # the suite's fedsp arm, as before
    assert default.method.prompt_init == "text"
    for ref in ("fedsp/arc_easy_qwen", str(ROOT / "fedkt/configs/fedsp/arc_easy_qwen.yaml")):
        cfg = fp.base_config(probe_args("--config", ref))
        assert (cfg.server.name, cfg.data.dataset.name) == ("qwen2.5-0.5b", "arc_easy")
        assert cfg.method.prompt_init == "random"  # the config's (the paper's)
    cfg = fp.base_config(probe_args("--config", "fedsp/arc_easy_qwen", "--init", "text",
                                    "--server", "tiny-qwen2"))
    assert (cfg.method.prompt_init, cfg.server.name) == ("text", "tiny-qwen2")
    with pytest.raises(SystemExit, match="method.name is 'fedavg'"):
        fp.base_config(probe_args("--config", "quickstart"))


def test_cut_mode_runs_on_a_config_at_the_precision_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path / "cache"))
    fp = probe()
    tiny = str(ROOT / "fedkt" / "configs" / "fedsp" / "tiny.yaml")
    fp.main(["--config", tiny, "--cuts", "bot:0,2", "--cuts", "top:0", "--examples", "4",
             "--lr", "1e-2", "--precision", "bf16"])
    out = capsys.readouterr().out
    assert "tiny-llama (4 layers), intent_recognition, client 0's first 4 examples, text " \
           "prompts (4, 256), bf16 = bfloat16 gradients" in out
    rows = [line for line in out.splitlines() if line.startswith(("| BOT", "| TOP"))]
    assert [r.split("|")[1:3] for r in rows] == [[" BOT (0) ", " 0 "], [" BOT (0) ", " 2 "],
                                                 [" TOP (3) ", " 0 "]]
    cosines = [float(r.split("|")[5]) for r in rows]
    assert all(-1.0 <= c <= 1.0 for c in cosines) and cosines[0] != cosines[1]  # KD turned it
    assert " s CPU" in out


def test_set_overrides_the_configs_keys_and_needs_a_config():
    fp = probe()
    cfg = fp.base_config(probe_args("--config", "fedsp/arc_easy_qwen", "--set",
                                    "method.kd_steps=50", "--set", "method.kd_lr=1e-3"))
    assert (cfg.method.kd_steps, cfg.method.kd_lr) == (50, 1e-3)
    assert cfg.method.aux_layers == 1  # the rest is the config's
    with pytest.raises(SystemExit, match="--set .* --config"):
        fp.base_config(probe_args("--set", "method.kd_steps=50"))
    with pytest.raises(ConfigError, match="kd_steps"):
        fp.base_config(probe_args("--config", "fedsp/arc_easy_qwen", "--set",
                                  "method.kd_steps=-1"))
