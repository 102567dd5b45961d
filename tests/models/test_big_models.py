"""Big-model settings: gradient checkpointing, bf16 weights, quantisation, placement."""

from __future__ import annotations

import pytest
import torch

from fedkt.config import ModelConfig, TrainingConfig
from fedkt.data.splits import run_data
from fedkt.errors import ConfigError
from fedkt.models import ModelError, adapter_state
from fedkt.models.adapters import enable_gradient_checkpointing
from fedkt.train.lm import clear_cache, get_lm, train_lm

MODEL = ModelConfig(name="tiny-llama", tiny={"num_layers": 4})


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
    out = train_lm(cfg, get_lm(MODEL, cfg.training, 0), records, seed=1)
    out_gc = train_lm(cfg_gc, get_lm(MODEL, cfg_gc.training, 0), records, seed=1)
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
    bf16 = get_lm(MODEL.model_copy(update={"dtype": "bfloat16"}), TrainingConfig(), seed=0)

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
