"""Tiny presets and ``load_causal_lm`` / ``load_tokenizer`` on presets and local folders."""

from __future__ import annotations

import pytest
import torch

from fedkt.config import ModelConfig
from fedkt.models import ModelError, build_tiny_causal_lm, load_causal_lm, load_tokenizer
from fedkt.models.tiny import TINY_PRESETS

CAUSAL = sorted(TINY_PRESETS)
TEXTS = ["#Person1#: How are you today?", "Fine, thanks."]


def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", CAUSAL)
def test_preset_builds_and_runs(name):
    model, tok = load_causal_lm(ModelConfig(name=name), seed=0)
    assert model.config.vocab_size == len(tok)
    assert model.config.model_type == name.removeprefix("tiny-")
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (2, batch["input_ids"].shape[1], len(tok))
    assert torch.isfinite(out.loss) and out.loss.item() > 0
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    gen = model.generate(**tok(["Hello"], return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert gen.shape[1] == tok(["Hello"], return_tensors="pt")["input_ids"].shape[1] + 3


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_grouped_query_attention(name):
    model, _ = build_tiny_causal_lm(name)
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == 64 and attn.k_proj.out_features == 32


def test_seed_controls_weights_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, _ = build_tiny_causal_lm("tiny-opt", seed=7)
    b, _ = build_tiny_causal_lm("tiny-opt", seed=7)
    c, _ = build_tiny_causal_lm("tiny-opt", seed=8)
    assert torch.equal(torch.rand(3), expected)
    assert _weights_equal(a, b)
    assert not _weights_equal(a, c)


def test_overrides():
    cfg = ModelConfig(
        name="tiny-llama",
        tiny={
            "hidden_size": 32,
            "num_layers": 3,
            "num_heads": 2,
            "num_kv_heads": 1,
            "rope_theta": 500.0,
        },
    )
    model, tok = load_causal_lm(cfg)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (32, 3, 2)
    assert c.num_key_value_heads == 1 and len(model.model.layers) == 3
    assert c.rope_parameters["rope_theta"] == 500.0
    model, tok = load_causal_lm(ModelConfig(name="tiny-gpt2", tiny={"vocab_size": 1200}))
    assert len(tok) == 1200 and model.get_input_embeddings().num_embeddings == 1200
    with pytest.raises(ModelError, match="'bogus'"):
        load_causal_lm(ModelConfig(name="tiny-gpt2", tiny={"bogus": 1}))
    with pytest.raises(ModelError, match="num_kv_heads"):
        load_causal_lm(ModelConfig(name="tiny-bloom", tiny={"num_kv_heads": 2}))
    with pytest.raises(ModelError, match="divisible"):
        load_causal_lm(ModelConfig(name="tiny-opt", tiny={"hidden_size": 30}))
    with pytest.raises(ModelError, match="positive integer"):
        load_causal_lm(ModelConfig(name="tiny-opt", tiny={"num_layers": 0}))


def test_dtype():
    model, _ = load_causal_lm(ModelConfig(name="tiny-qwen2", dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_load_tokenizer_matches_model_tokenizer():
    for name in CAUSAL:
        _, tok = load_causal_lm(ModelConfig(name=name))
        alone = load_tokenizer(ModelConfig(name=name))
        assert alone.get_vocab() == tok.get_vocab()
        assert alone(TEXTS[0])["input_ids"] == tok(TEXTS[0])["input_ids"]
    assert len(load_tokenizer(ModelConfig(name="tiny-bert"))) == 2000


def test_unknown_preset_lists_allowed():
    with pytest.raises(ModelError) as err:
        load_causal_lm(ModelConfig(name="tiny-mistral"))
    for name in CAUSAL:
        assert name in str(err.value)
    with pytest.raises(ModelError, match="tiny-llama"):
        load_tokenizer(ModelConfig(name="tiny-mistral"))


def test_missing_local_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelError, match="no-such-model"):
        load_causal_lm(ModelConfig(name=str(missing)))
    with pytest.raises(ModelError, match="not found"):
        load_tokenizer(ModelConfig(name="./nowhere/model.gguf"))


def test_unreachable_hub_id_explains(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as err:
        load_causal_lm(ModelConfig(name="fedkt-test/definitely-not-a-model"))
    msg = str(err.value)
    assert "hub id" in msg and "smollm2-135m" in msg and "tiny-gpt2" in msg
    assert "fedkt models install" not in msg
    # The hub id of an offline alias, with no network: the message names the install command.
    with pytest.raises(ModelError, match="`fedkt models install qwen2.5-0.5b`"):
        load_tokenizer(ModelConfig(name="Qwen/Qwen2.5-Coder-0.5B-Instruct"))


def test_local_folder_round_trip(tmp_path):
    model, tok = build_tiny_causal_lm("tiny-bloom", seed=3)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, tok2 = load_causal_lm(ModelConfig(name=str(tmp_path / "m")))
    assert _weights_equal(model, loaded)
    assert tok2(TEXTS[0])["input_ids"] == tok(TEXTS[0])["input_ids"]
    assert tok2.pad_token == tok.pad_token
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
