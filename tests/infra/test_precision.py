"""training.precision: autocast on the hardware's native low-precision type, fp32 master weights."""

from __future__ import annotations

import os

import pytest
import torch

from fedkt.config import ConfigError
from fedkt.infra import precision
from fedkt.infra.precision import autocast, default_threads, physical_cores, resolve_precision
from fedkt.train.lm import clear_cache, client_lm, train_lm
from tests.conftest import run_data_of

NATIVE_BF16 = precision.cpu_supports_bf16()


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        return next((set(line.split(":", 1)[1].split()) for line in fh
                     if line.startswith("flags")), set())


def test_native_bf16_detection_matches_the_cpu_flags():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo")
    assert bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"}) == precision._cpu_has_bf16()


@pytest.mark.parametrize(("cap", "allows"), [
    ("AVX2", False), ("avx512_core", False), ("AVX512_CORE_VNNI", False),
    ("AVX512_CORE_BF16", True), ("AVX512_CORE_AMX", True), ("", True)])
def test_an_isa_cap_below_avx512_bf16_makes_auto_fp32(monkeypatch, cap, allows):
    """Emulating a lower machine kind (ONEDNN_MAX_CPU_ISA=AVX2 on an AMX host) must give
    that kind's precision: bf16 under an AVX2 cap is emulated (measured: a demo round's
    client training past 5 CPU-minutes on an AMX host, against 8 s native)."""
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: True)
    assert precision.cpu_supports_bf16() is allows
    assert resolve_precision("auto", "cpu") is (torch.bfloat16 if allows else None)
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: False)  # no cap adds bf16
    assert precision.cpu_supports_bf16() is False


def test_resolve_each_option_on_cpu():
    assert resolve_precision("fp32", "cpu") is None
    assert resolve_precision("bf16", "cpu") is torch.bfloat16
    assert resolve_precision("auto", "cpu") is (torch.bfloat16 if NATIVE_BF16 else None)
    with pytest.raises(ConfigError, match=r"training\.precision: fp16 needs a CUDA GPU"):
        resolve_precision("fp16", "cpu")
    with pytest.raises(ConfigError, match=r"training\.precision: 'fp8' is not one of"):
        resolve_precision("fp8", "cpu")


def test_auto_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    assert resolve_precision("auto", "cpu") is None
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    assert resolve_precision("auto", torch.device("cpu")) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", "cuda") is torch.bfloat16
    assert resolve_precision("fp16", "cuda:0") is torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_precision("auto", "cuda") is None


def test_bf16_on_a_cpu_that_emulates_it_warns_once(monkeypatch, caplog):
    precision._warn_emulated_bf16.cache_clear()
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    with caplog.at_level("WARNING", logger="fedkt.infra.precision"):
        assert resolve_precision("bf16", "cpu") is torch.bfloat16  # still what was asked
        resolve_precision("bf16", "cpu")
        resolve_precision("auto", "cpu")
    assert [r.getMessage() for r in caplog.records if "emulated" in r.getMessage()] == [
        caplog.records[0].getMessage()]
    assert "'auto' picks fp32 here" in caplog.records[0].getMessage()
    caplog.clear()
    precision._warn_emulated_bf16.cache_clear()
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    with caplog.at_level("WARNING", logger="fedkt.infra.precision"):
        resolve_precision("bf16", "cpu")
    assert not caplog.records  # native bf16: nothing to say


def test_fp16_on_a_cpu_run_is_a_config_error(make_config):
    with pytest.raises(ConfigError, match=r"training\.precision: fp16 needs a CUDA GPU"):
        make_config("training.precision=fp16", "runtime.device=cpu")
    with pytest.raises(ConfigError, match=r"training\.precision"):
        make_config("training.precision=half")


def test_autocast_is_a_no_op_for_fp32():
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    with autocast("fp32", "cpu") as dtype:
        assert dtype is None and not torch.is_autocast_enabled("cpu")
        assert (x @ w).dtype == torch.float32
    with autocast("bf16", "cpu") as dtype:
        assert dtype is torch.bfloat16 and (x @ w).dtype == torch.bfloat16


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16")
def test_auto_trains_in_bf16_with_fp32_weights_and_optimiser_state(make_config):
    """Under ``auto`` the linear layers compute in bf16; everything that is kept stays fp32."""
    cfg = make_config("training.max_steps=2")
    assert cfg.training.precision == "auto"
    clear_cache()
    lm = client_lm(cfg, 0)
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda _m, _args, out: seen.append(out.dtype))
             for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    captured: dict[str, torch.optim.Optimizer] = {}
    step = torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        captured["opt"] = self
        return step(self, *args, **kwargs)

    try:
        torch.optim.AdamW.step = spy
        train_lm(cfg, lm, lm_records(cfg), seed=0, data=run_data_of(cfg))
    finally:
        torch.optim.AdamW.step = step
        for h in hooks:
            h.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in lm.model.parameters())
    state = captured["opt"].state
    assert state and all(v.dtype == torch.float32 for s in state.values()
                         for k, v in s.items() if k != "step")
    assert any(not torch.equal(v, lm.initial[k]) for k, v in lm.trainable().items())


def lm_records(cfg) -> list[dict]:
    return run_data_of(cfg).private[0]


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16")
def test_same_seed_gives_identical_bf16_runs(make_config):
    from fedkt.train.lm import evaluate_lm

    cfg = make_config("training.precision=bf16", "training.max_steps=3")
    results = []
    for _ in range(2):
        clear_cache()
        lm = client_lm(cfg, 0)
        stats = train_lm(cfg, lm, lm_records(cfg), seed=7, data=run_data_of(cfg))
        scores = evaluate_lm(cfg, lm, _test(cfg), data=run_data_of(cfg))
        results.append((stats["loss"], scores, {k: v.clone() for k, v in lm.trainable().items()}))
    (loss_a, eval_a, w_a), (loss_b, eval_b, w_b) = results
    assert loss_a == loss_b and eval_a == eval_b
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)
    # ... and bf16 is really in use: fp32 gives other numbers.
    clear_cache()
    fp32 = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"precision": "fp32"})})
    lm = client_lm(fp32, 0)
    assert train_lm(fp32, lm, lm_records(fp32), seed=7, data=run_data_of(fp32))["loss"] != loss_a


def _test(cfg) -> list[dict]:
    return run_data_of(cfg).test[:16]


def test_threads_default_to_physical_cores(monkeypatch):
    cores = physical_cores()
    assert 1 <= cores <= os.cpu_count()
    assert cores <= len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads() == cores
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # e.g. Ray's limit for a simulated client
    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(10 * os.cpu_count()))
    assert default_threads() == os.cpu_count()


def test_explicit_threads_are_kept():
    before = torch.get_num_threads()
    try:
        assert precision.set_threads(1) == 1 and torch.get_num_threads() == 1
        monkey = precision.set_threads(None)
        assert monkey == default_threads() and torch.get_num_threads() == monkey
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_import_fedkt_makes_openmp_wait_passively_unless_the_user_chose(preset, expected):
    """``import fedkt`` before torch sets OMP_WAIT_POLICY=PASSIVE for the OpenMP runtime
    torch then loads (spinning threads slow a loaded machine 3x); a user's choice stays."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    code = ("import os, sys, fedkt\nassert 'torch' not in sys.modules\n"
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-1] == expected


def _tiny_lora(tied: bool) -> torch.nn.Module:
    """A 2-layer Llama from a config, LoRA on every linear layer, its base frozen."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied))
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                           lora_dropout=0.0))


@pytest.mark.parametrize("tied", [True, False])
def test_frozen_linears_are_held_in_bf16_and_put_back_bit_for_bit(tied, monkeypatch):
    model = _tiny_lora(tied)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = model.get_output_embeddings().weight
    with precision.frozen_linears_as(model, torch.bfloat16) as n:
        frozen = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)
                  and not m.weight.requires_grad]
        assert n == len(frozen) == 15
        assert all(w.dtype == torch.bfloat16 for w in frozen)
        inside = model.get_output_embeddings().weight
        assert inside.dtype == torch.bfloat16 and torch.equal(inside, head.to(torch.bfloat16))
        if tied:  # the output layer's own copy: the embedding (the same tensor outside)
            assert inside is not head and head.dtype == torch.float32  # stays fp32
        assert model.get_input_embeddings().weight.dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    after = dict(model.named_parameters())
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], v)
               for k, v in before.items())
    assert model.get_output_embeddings().weight is head  # put back (the tie too)
    if tied:
        assert head is model.get_input_embeddings().weight
    with precision.frozen_linears_as(model, None) as n:  # fp32: nothing to hold
        assert n == 0
    monkeypatch.setenv(precision.FROZEN_CAST_ENV, "0")
    with precision.frozen_linears_as(model, torch.bfloat16) as n:
        assert n == 0 and all(p.dtype == torch.float32 for p in model.parameters())


def _frozen_numel(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
               and not m.weight.requires_grad)


def _bf16_loop(cast: torch.dtype | None, ids: torch.Tensor, steps: int
               ) -> tuple[list[float], list[torch.Tensor], int]:
    """``steps`` LoRA steps of a tiny tied Llama under bf16 autocast through ``run_steps``:
    the losses, the adapter, and the bytes autograd kept that are no parameter's own."""
    from fedkt.train.loop import run_steps

    model = _tiny_lora(tied=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    own: set[int] = set()  # the parameters' storages, as the loop holds them
    seen: set[int] = set()  # this forward's kept storages (addresses recur between steps)
    kept = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own | seen:
            seen.add(storage.data_ptr())
            kept[0] += storage.nbytes()
        return t

    def loss(i: int, batch: torch.Tensor) -> torch.Tensor:
        seen.clear()
        own.clear()
        own.update(p.untyped_storage().data_ptr() for p in model.parameters())
        with torch.autocast("cpu", dtype=torch.bfloat16), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return model(input_ids=batch, labels=batch).loss.float()

    def step(value: torch.Tensor) -> float:
        opt.zero_grad()
        value.backward()
        opt.step()
        return float(value.detach())

    stats = run_steps([ids] * steps, loss, step, modules=[model], seed=0, cast=cast)
    return stats.losses, [p.detach().clone() for p in params], kept[0]


def test_a_bf16_loop_with_frozen_weights_cast_once_is_the_same_loop_keeping_less():
    """The same losses and adapters to the bit, and what autograd keeps for a backward no
    longer holds a fresh bf16 copy of every frozen weight in each forward."""
    ids = torch.randint(0, 96, (4, 12), generator=torch.Generator().manual_seed(1))
    recast, once = _bf16_loop(None, ids, 3), _bf16_loop(torch.bfloat16, ids, 3)
    assert recast[0] == once[0]
    assert all(torch.equal(a, b) for a, b in zip(recast[1], once[1], strict=True))
    copies = 3 * 2 * _frozen_numel(_tiny_lora(tied=True))  # 3 forwards, 2 bytes a value
    # The first layer's q, k, v, gate and up projections keep nothing either way (their
    # input needs no gradient): a third of the weights; the rest kept a copy per forward.
    assert 0.6 * copies <= recast[2] - once[2] <= copies, (recast[2], once[2], copies)
