"""Big-model settings: gradient checkpointing, bf16 weights, quantisation, placement."""

from __future__ import annotations

import sys

import pytest
import torch

from fedkt.config import ModelConfig, TrainingConfig
from fedkt.data.splits import run_data
from fedkt.errors import ConfigError
from fedkt.infra.placement import client_device, placed_by_loader, plan_device_map, server_device
from fedkt.models import ModelError, adapter_state
from fedkt.models.adapters import enable_gradient_checkpointing
from fedkt.models.causal_lm import load_causal_lm
from fedkt.runtime.base import client_view
from fedkt.train.lm import clear_cache, get_lm, train_lm
from tests.conftest import run_data_of

MODEL = ModelConfig(name="tiny-llama", tiny={"num_layers": 4})


def _model(settings: dict) -> ModelConfig:
    """MODEL with these settings, validated."""
    return ModelConfig.model_validate({**MODEL.model_dump(), **settings})


def _loss_grads_saved(peft: str, checkpointing: bool) -> tuple[float, list[torch.Tensor], int]:
    """One training forward/backward: the loss, the gradients, and the bytes autograd
    saved for the backward pass (the activation memory of training)."""
    training = TrainingConfig(peft=peft, gradient_checkpointing=checkpointing,
                              lora={"target_modules": "all-linear"})
    lm = get_lm(MODEL, training, seed=0)
    lm.model.train()
    ids = torch.randint(3, 400, (4, 48), generator=torch.Generator().manual_seed(0))
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    torch.manual_seed(0)  # the same LoRA dropout masks in both runs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm.model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad.clone() for p in lm.model.parameters() if p.requires_grad]
    lm.model.zero_grad(set_to_none=True)
    lm.model.eval()
    return loss.item(), grads, saved[0]


@pytest.mark.parametrize("peft", ["lora", "full"])
def test_gradient_checkpointing_same_loss_and_grads_less_saved_memory(peft):
    loss, grads, saved = _loss_grads_saved(peft, False)
    loss_gc, grads_gc, saved_gc = _loss_grads_saved(peft, True)
    assert loss_gc == pytest.approx(loss, abs=1e-6)
    assert len(grads) == len(grads_gc) > 0
    for g, h in zip(grads, grads_gc, strict=True):
        torch.testing.assert_close(h, g, rtol=1e-5, atol=1e-7)
    # 4 layers: only the layer inputs are kept, the rest is recomputed in backward.
    assert saved_gc < 0.5 * saved, (saved_gc, saved)


def test_gradient_checkpointing_trains_to_the_same_loss(make_config):
    cfg = make_config("training.precision=fp32")
    cfg_gc = make_config("training.precision=fp32", "training.gradient_checkpointing=true",
                         name="gc")
    records = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).private[0][:16]
    out = train_lm(cfg, get_lm(MODEL, cfg.training, 0), records, seed=1, data=run_data_of(cfg))
    out_gc = train_lm(cfg_gc, get_lm(MODEL, cfg_gc.training, 0), records, seed=1, data=run_data_of(cfg_gc))
    assert out["steps"] == out_gc["steps"] > 1
    assert out_gc["loss"] == pytest.approx(out["loss"], abs=1e-5)
    clear_cache()


def test_gradient_checkpointing_refuses_prefix_tuning(make_config):
    with pytest.raises(ConfigError, match="training.gradient_checkpointing: prefix tuning"):
        make_config("training.peft=prefix", "training.gradient_checkpointing=true")
    with pytest.raises(ConfigError, match="training.gradient_checkpointing: fedsp trains"):
        make_config("training.gradient_checkpointing=true", "server={name: tiny-llama}",
                    "clients.models=[]", method="fedsp")
    lm = get_lm(MODEL, TrainingConfig(peft="prefix", prefix_tokens=2), seed=0)
    with pytest.raises(ModelError, match="prefix/prompt tuning"):
        enable_gradient_checkpointing(lm.model)


def test_bf16_weights_keep_adapters_in_fp32():
    """``dtype: bfloat16`` loads the base weights in bf16 (half the bytes); the LoRA that
    trains and travels stays fp32, and a training step runs."""
    fp32 = get_lm(MODEL, TrainingConfig(), seed=0)
    bf16 = get_lm(_model({"dtype": "bfloat16"}), TrainingConfig(), seed=0)

    def base_bytes(lm):
        return sum(p.numel() * p.element_size() for p in lm.model.parameters()
                   if not p.requires_grad)

    assert {p.dtype for p in bf16.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert base_bytes(bf16) * 2 == base_bytes(fp32)
    state = adapter_state(bf16.model)
    assert state and {v.dtype for v in state.values()} == {torch.float32}
    bf16.model.train()
    ids = torch.randint(3, 400, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = bf16.model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.dtype == torch.float32
               for p in bf16.model.parameters() if p.requires_grad)
    bf16.model.zero_grad(set_to_none=True)
    bf16.model.eval()


# --------------------------------------------------------------------------- quantisation

bnb = pytest.importorskip("bitsandbytes", reason="pip install 'fedkt[quantization]'")


def test_quantization_without_bitsandbytes_fails_early_naming_the_key(make_config,
                                                                     monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"clients\.models\.0\.quantization: needs "
                       r"bitsandbytes.*pip install 'fedkt\[quantization\]'"):
        make_config("clients.models=[{name: tiny-llama, quantization: {bits: 4}}]")


def test_quantization_refuses_full_fine_tuning_and_unknown_bits(make_config):
    with pytest.raises(ConfigError, match=r"clients\.models\.0\.quantization: training\.peft "
                       "'full'"):
        make_config("clients.models=[{name: tiny-llama, quantization: {bits: 4}}]",
                    "training.peft=full")
    with pytest.raises(ConfigError, match=r"quantization\.bits"):
        make_config("clients.models=[{name: tiny-llama, quantization: {bits: 2}}]")


def test_bitsandbytes_that_cannot_run_is_a_clear_error(monkeypatch):
    import bitsandbytes.functional as bnbf

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this device")

    monkeypatch.setattr(bnbf, "quantize_4bit", broken)
    with pytest.raises(ModelError, match="quantization: bitsandbytes cannot quantise on 'cpu'"):
        load_causal_lm(_model({"quantization": {"bits": 4}}), device="cpu")


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_student_trains_a_full_precision_adapter(make_config, bits):
    """QLoRA: the base's linear layers are bitsandbytes', the adapter that trains and
    travels has the same keys, shapes and fp32 dtype as on the unquantised model, and
    training lowers the loss from the same start."""
    quant = {"bits": bits, "compute_dtype": "float32"}
    cfg = make_config("training.precision=fp32", "training.lr=1e-2")
    plain = get_lm(MODEL, cfg.training, 0)
    lm = get_lm(_model({"quantization": quant}), cfg.training, 0)
    layer = lm.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    assert type(layer).__name__ == ("Linear4bit" if bits == 4 else "Linear8bitLt")
    quantized, full = lm.model.get_base_model(), plain.model.get_base_model()
    assert quantized.get_memory_footprint() < full.get_memory_footprint()
    start = lm.trainable()
    assert {k: (v.shape, v.dtype) for k, v in start.items()} == {
        k: (v.shape, v.dtype) for k, v in plain.trainable().items()}
    assert {v.dtype for v in start.values()} == {torch.float32}
    records = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).private[0][:16]
    first = train_lm(cfg, lm, records, seed=1, data=run_data_of(cfg))["loss"]
    again = train_lm(cfg, lm, records, seed=1, data=run_data_of(cfg))["loss"]
    assert torch.isfinite(torch.tensor(first)) and again < first
    assert any(not torch.equal(start[k], v) for k, v in lm.trainable().items())


def test_quantized_frozen_teacher_only_runs(make_config):
    """A teacher (peft: none) on a 4-bit base is not prepared for training: nothing
    trains, and its next-token distribution stays close to the fp32 model's."""
    none = TrainingConfig(peft="none")
    teacher = get_lm(_model({"quantization": {"bits": 4, "compute_dtype":
                                                               "float32"}}), none, 0)
    full = get_lm(MODEL, none, 0)
    assert not any(p.requires_grad for p in teacher.model.parameters())
    ids = torch.randint(3, 400, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = full.model(input_ids=ids).logits.softmax(-1)
        q = teacher.model(input_ids=ids).logits.softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1).max().item()
    assert 0 < tv < 0.5, tv


# --------------------------------------------------------------------------- placement


def test_a_device_per_participant(make_config):
    cfg = make_config("clients.num_clients=3", "runtime.client_devices=[cuda:0, cuda:1]",
                      "server={name: tiny-llama, device: 'cuda:2'}")
    assert [client_device(cfg, c) for c in range(3)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert server_device(cfg) == "cuda:2"
    own = make_config("clients.num_clients=2", "runtime.client_devices=[cuda:1]",
                      "clients.models=[{name: tiny-llama, device: cpu}, {name: tiny-gpt2}]")
    assert [client_device(own, c) for c in range(2)] == ["cpu", "cuda:1"]
    plain = make_config()
    assert server_device(plain) == client_device(plain, 1) == plain.runtime.device == "auto"
    # Clients in other processes get the placement with the config they receive.
    assert client_view(cfg).runtime.client_devices == ["cuda:0", "cuda:1"]


def test_placement_errors_name_the_key(make_config):
    with pytest.raises(ConfigError, match=r"runtime\.client_devices: only the local runtime"):
        make_config("runtime.client_devices=[cuda:0]", "runtime.name=flower-sim")
    with pytest.raises(ConfigError, match=r"runtime\.client_devices: entry 1: 'gpu1' is not a "
                       "device"):
        make_config("runtime.client_devices=[cpu, gpu1]")
    with pytest.raises(ConfigError, match=r"server\.device: 'cuda;0' is not a device"):
        make_config("server={name: tiny-llama, device: 'cuda;0'}")


def test_cpu_device_map_gives_the_same_scores():
    """``device_map: auto`` goes through accelerate's loading; on a machine without GPUs
    every weight lands on the CPU and the model scores as the plain one. A quantised model
    is placed while it loads and is never moved afterwards."""
    mapped = get_lm(_model({"device_map": "auto"}), TrainingConfig(), 0)
    plain = get_lm(MODEL, TrainingConfig(), 0)
    assert {p.device.type for p in mapped.model.parameters()} == {"cpu"}
    ids = torch.randint(3, 400, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(mapped.model(input_ids=ids).logits,
                                   plain.model(input_ids=ids).logits)
    assert not placed_by_loader(plain.model)
    quantized = get_lm(_model({"quantization": {"bits": 8}}), TrainingConfig(), 0)
    assert placed_by_loader(quantized.model)


def test_a_7b_server_split_over_gpus_on_the_meta_device():
    """accelerate's plan for Llama-2-7B's layout in bf16 (13.5 GB of weights), from an
    empty model: on one 24 GB GPU it fits whole; over two 5 GiB GPUs and the CPU, its 32
    decoder layers go to GPU 0, then GPU 1, then the CPU, in order."""
    from transformers import LlamaConfig

    llama7b = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    model_cfg = ModelConfig(name="llama-2-7b-layout", dtype="bfloat16")
    whole = plan_device_map(model_cfg, {0: "24GiB", "cpu": "64GiB"}, config=llama7b)
    assert set(whole.values()) == {0}
    split = plan_device_map(model_cfg, {0: "5GiB", 1: "5GiB", "cpu": "64GiB"}, config=llama7b)
    layers = [split.get(f"model.layers.{i}", None) for i in range(32)]
    if None in layers:  # coarser keys: expand "model" etc. is not expected with these budgets
        pytest.fail(f"layers not mapped one by one: {split}")
    assert layers == sorted(layers, key=lambda d: {0: 0, 1: 1, "cpu": 2}[d])
    assert {0, 1, "cpu"} <= set(layers)
