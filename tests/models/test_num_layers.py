"""``ModelConfig.num_layers``: keep the first N decoder layers of a loaded causal LM."""

from __future__ import annotations

import pytest
import torch

from fedkt.config import ConfigError, ModelConfig, TrainingConfig, parse_config
from fedkt.models import ModelError, adapter_state, apply_peft, load_causal_lm

TEXT = "add this song to my playlist"


def _logits(model, tok) -> torch.Tensor:
    with torch.no_grad():
        return model(**tok(TEXT, return_tensors="pt")).logits


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
def test_first_layers_are_kept_and_the_model_still_runs(preset):
    tiny = {"num_layers": 3}
    full, tok = load_causal_lm(ModelConfig(name=preset, tiny=tiny), seed=0)
    pruned, _ = load_causal_lm(ModelConfig(name=preset, tiny=tiny, num_layers=2), seed=0)
    blocks = [m for n, m in pruned.named_modules() if n.endswith((".layers", ".h"))][0]
    assert len(blocks) == 2
    cfg = pruned.config
    assert getattr(cfg, "num_hidden_layers", getattr(cfg, "n_layer", None)) == 2
    if getattr(full.config, "layer_types", None) is not None:
        assert cfg.layer_types == full.config.layer_types[:2]
    # The kept layers are the full model's first two, weight for weight.
    full_params = dict(full.named_parameters())
    for name, p in pruned.named_parameters():
        assert torch.equal(p, full_params[name]), name
    assert len(full_params) > len(dict(pruned.named_parameters()))
    a, b = _logits(full, tok), _logits(pruned, tok)
    assert a.shape == b.shape and torch.isfinite(b).all()
    assert not torch.allclose(a, b)


def test_lora_applies_to_the_pruned_model_and_trains():
    model, tok = load_causal_lm(ModelConfig(name="tiny-llama", tiny={"num_layers": 4},
                                            num_layers=1), seed=0)
    model = apply_peft(model, TrainingConfig(peft="lora"), seed=0)
    state = adapter_state(model)
    assert state and all(".layers.0." in k for k in state)  # layer 1.. are gone
    batch = tok([TEXT], return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"])
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_bad_num_layers_name_the_field():
    with pytest.raises(ModelError, match="num_layers.*2 layers, got 3"):
        load_causal_lm(ModelConfig(name="tiny-llama", num_layers=3))
    with pytest.raises(ConfigError, match="server.num_layers"):
        parse_config({"method": {"name": "fedavg"}, "server": {"name": "x", "num_layers": 0},
                      "data": {"dataset": {"name": "intent_recognition"}}})
