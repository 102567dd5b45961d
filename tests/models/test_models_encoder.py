"""Encoder classifiers (tiny-bert, all-MiniLM-L6-v2) and truncation for FedKD students."""

from __future__ import annotations

import pytest
import torch

from fedkt.config import ModelConfig, TrainingConfig
from fedkt.models import (
    ModelError,
    adapter_state,
    apply_peft,
    build_tiny_causal_lm,
    load_encoder_classifier,
    truncate_encoder,
)
from tests.conftest import needs_models

TEXTS = ["what a lovely day", "this is terrible news"]


def test_tiny_bert_classifier():
    model, tok = load_encoder_classifier(ModelConfig(name="tiny-bert"), num_labels=3, seed=0)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.vocab_size == len(tok) == 2000 and model.config.num_labels == 3
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    assert "token_type_ids" in batch
    out = model(**batch, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and torch.isfinite(out.loss)
    same, _ = load_encoder_classifier(ModelConfig(name="tiny-bert"), num_labels=3, seed=0)
    other, _ = load_encoder_classifier(ModelConfig(name="tiny-bert"), num_labels=3, seed=1)
    sd, ss, so = model.state_dict(), same.state_dict(), other.state_dict()
    assert all(torch.equal(sd[k], ss[k]) for k in sd)
    assert not all(torch.equal(sd[k], so[k]) for k in sd)
    deeper, _ = load_encoder_classifier(
        ModelConfig(name="tiny-bert", tiny={"num_layers": 4, "hidden_size": 32}), 2
    )
    assert len(deeper.bert.encoder.layer) == 4 and deeper.config.hidden_size == 32


def test_encoder_errors():
    with pytest.raises(ModelError, match="tiny-bert"):
        load_encoder_classifier(ModelConfig(name="tiny-roberta"), 2)
    with pytest.raises(ModelError, match="not an encoder.*all-minilm-l6-v2"):
        load_encoder_classifier(ModelConfig(name="smollm2-135m"), 2)
    with pytest.raises(ModelError, match="num_labels"):
        load_encoder_classifier(ModelConfig(name="tiny-bert"), 0)


def test_truncate_encoder_keeps_first_layers():
    model, tok = load_encoder_classifier(
        ModelConfig(name="tiny-bert", tiny={"num_layers": 4}), num_labels=2, seed=0
    )
    student = truncate_encoder(model, 2)
    assert len(model.bert.encoder.layer) == 4 and model.config.num_hidden_layers == 4
    assert len(student.bert.encoder.layer) == 2 and student.config.num_hidden_layers == 2
    ms, ss = model.state_dict(), student.state_dict()
    assert set(ss) < set(ms)
    assert all(torch.equal(ss[k], ms[k]) for k in ss)
    assert not any(k.startswith("bert.encoder.layer.2.") for k in ss)
    # A copy: training the student leaves the teacher alone.
    with torch.no_grad():
        student.classifier.weight.add_(1.0)
    assert not torch.equal(student.classifier.weight, model.classifier.weight)
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    assert student(**batch).logits.shape == (2, 2)
    lora = adapter_state(apply_peft(student, TrainingConfig(peft="lora"), seed=0))
    assert any("classifier" in k for k in lora) and any("query.lora_A" in k for k in lora)
    for bad in (0, 5):
        with pytest.raises(ModelError, match="between 1 and"):
            truncate_encoder(model, bad)


def test_truncate_works_on_decoders_too():
    model, tok = build_tiny_causal_lm("tiny-llama", {"num_layers": 3})
    small = truncate_encoder(model, 1)
    assert len(small.model.layers) == 1 and small.config.num_hidden_layers == 1
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    assert small(**batch).logits.shape[-1] == len(tok)


@needs_models("all-minilm-l6-v2")
def test_all_minilm_alias():
    model, tok = load_encoder_classifier(ModelConfig(name="all-minilm-l6-v2"), 4, seed=0)
    assert model.config.hidden_size == 384 and len(model.bert.encoder.layer) == 6
    assert len(tok) == 30522 and tok("hello world")["input_ids"] == [101, 7592, 2088, 102]
    again, _ = load_encoder_classifier(ModelConfig(name="all-minilm-l6-v2"), 4, seed=0)
    assert torch.equal(model.classifier.weight, again.classifier.weight)
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 4)
    student = truncate_encoder(model, 3)
    assert len(student.bert.encoder.layer) == 3
