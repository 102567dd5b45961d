"""FedKD's classification head, learning rates and loss guards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fedkt.config import ConfigError, ModelConfig
from fedkt.methods.fedkd.config import STUDENT_LR_RATIO
from fedkt.methods.fedkd.losses import check_heads, fedkd_losses, loss_magnitudes
from fedkt.methods.fedkd.models import FedKDModels
from fedkt.train.encoder import build_encoder, feature_spread, text_batches, trainable_state
from tests.conftest import needs_models
from tests.methods.test_fedkd import fedkd_config, server_and_clients

ROOT = Path(__file__).resolve().parents[2]
OFFENSIVE = ROOT / "fedkt" / "data" / "vendored" / "tweeteval" / "offensive" / "train.jsonl"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _tweets(n: int) -> list[dict]:
    with OFFENSIVE.open() as fh:
        return [json.loads(line) for _, line in zip(range(n), fh, strict=False)]


@needs_models("all-minilm-l6-v2")
def test_pooled_features_vary_across_inputs_at_the_students_depth():
    # The 2-layer student of all-MiniLM-L6-v2: pooled token states vary across tweets
    # (relative spread ~0.7); the [CLS] state through BERT's pooler is nearly constant
    # (~0.003), the head that left the old student at F1 0. The criterion tells them apart.
    texts = [r["text"] for r in _tweets(32)]
    spread = {}
    for pooling in ("attention", "mean", "cls"):
        model, tok = build_encoder(ModelConfig(name="all-minilm-l6-v2"), 2, 0, layers=2,
                                   pooling=pooling, device="cpu")
        spread[pooling] = feature_spread(model, tok, texts, 64)
    assert spread["attention"] > 0.2 and spread["mean"] > 0.2, spread
    assert spread["cls"] < 0.02, spread  # a constant-feature head fails the criterion


def test_attentive_pooling_masks_padding_and_starts_as_mean():
    model, tok = build_encoder(ModelConfig(name="tiny-bert"), 2, 0, layers=2, device="cpu")
    mean, _ = build_encoder(ModelConfig(name="tiny-bert"), 2, 0, layers=2, pooling="mean",
                            device="cpu")
    records = [{"text": "a short one", "label": 0},
               {"text": "a much longer tweet with many more words in it", "label": 1}]
    batch = text_batches(tok, records, 2, 32, None)[0]
    alone = text_batches(tok, records[:1], 1, 32, None)[0]
    assert batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1]  # padded
    with torch.no_grad():
        padded = model.features(batch["input_ids"], batch["attention_mask"])
        single = model.features(alone["input_ids"], alone["attention_mask"])
        torch.testing.assert_close(padded[0], single[0], rtol=1e-5, atol=1e-6)
        # the query starts at 0: uniform weights over real tokens, i.e. masked mean pooling
        torch.testing.assert_close(padded, mean.features(batch["input_ids"],
                                                         batch["attention_mask"]))
        model.pooling.query.weight.normal_()
        assert not torch.allclose(model.features(batch["input_ids"], batch["attention_mask"]),
                                  padded)


def test_pooling_weights_are_part_of_the_travelling_student(tmp_path):
    cfg = fedkd_config(tmp_path)
    assert cfg.method.pooling == "attention"
    server, _ = server_and_clients(cfg)
    names = set(server.global_state)
    assert {"pooling.proj.weight", "pooling.proj.bias", "pooling.query.weight",
            "classifier.weight"} <= names
    assert not any("pooler" in n or "embeddings" in n for n in names)  # unused / frozen
    cls = fedkd_config(tmp_path, "method={name: fedavg_encoder, layers: 2, pooling: cls}",
                       name="cls")
    server, _ = server_and_clients(cls)
    assert "bert.pooler.dense.weight" in server.global_state
    assert not any(n.startswith("pooling.") for n in server.global_state)
    base, _ = build_encoder(ModelConfig(name="tiny-bert"), 2, 0, layers=2, pooling="mean",
                            device="cpu")
    assert not any(n.startswith(("pooling.", "bert.pooler")) for n in trainable_state(base))


def test_learning_rates_keep_the_papers_ratio(tmp_path):
    cfg = fedkd_config(tmp_path)
    assert STUDENT_LR_RATIO == 5.0
    assert cfg.method.rates(1e-4) == (1e-4, pytest.approx(5e-4))
    cfg = fedkd_config(tmp_path, "method={name: fedkd, teacher_lr: 2.0e-6}")
    assert cfg.method.rates(1e-4) == (2e-6, pytest.approx(1e-5))  # Table 6's SMM4H rates
    cfg = fedkd_config(tmp_path, "method={name: fedkd, teacher_lr: 1.0e-4, student_lr: 3.0e-4}")
    assert cfg.method.rates(1e-3) == (1e-4, 3e-4)


def test_attention_maps_are_compared_without_dropout(tmp_path):
    cfg = fedkd_config(tmp_path)
    models = FedKDModels.build(cfg, 2)
    for mod in models.student.modules():  # only attention dropout, and a strong one
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
    for layer in models.student.bert.encoder.layer:
        layer.attention.self.dropout.p = 0.5
    batch = text_batches(models.tokenizer, _tweets(4), 4, 32, None)[0]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    torch.manual_seed(0)
    with torch.no_grad():
        models.student.eval()
        clean = models.student(**inputs, output_attentions=True)
        models.student.train()
        noisy = models.student(**inputs, output_attentions=True)
    assert not torch.allclose(clean.logits, noisy.logits)  # dropout acted on the outputs
    # ... not on the maps Eq. 5 compares: layer 1's map is the clean softmax (deeper maps
    # read the outputs, which dropout changed), and every map's rows sum to 1
    torch.testing.assert_close(clean.attentions[0], noisy.attentions[0])
    for b in noisy.attentions:
        torch.testing.assert_close(b.sum(-1), torch.ones_like(b.sum(-1)))


def test_mismatched_head_counts_are_rejected():
    check_heads(torch.rand(2, 4, 5, 5), torch.rand(2, 4, 5, 5), (1, 3))
    with pytest.raises(ConfigError, match=r"attention_loss.*student layer 2.*teacher layer 6"
                                          r".*same number of heads"):
        check_heads(torch.rand(2, 12, 5, 5), torch.rand(2, 4, 5, 5), (2, 6))


def test_adaptive_denominator_is_guarded(tmp_path):
    # Both models fit the batch (task losses ~1e-22): the weight 1 / (L_t^t + L_s^t) of
    # Eqs. 3-5 is capped at 1 / min_task_loss_sum instead of growing to ~1e21.
    records = [{"text": t, "label": 1} for t in ("one tweet", "another tweet", "a third")]

    def hidden(*overrides: str) -> tuple[float, float]:
        cfg = fedkd_config(tmp_path, *overrides)
        models = FedKDModels.build(cfg, 2)
        for m in (models.teacher, models.student):
            with torch.no_grad():
                m.classifier.bias.copy_(torch.tensor([-25.0, 25.0]))
            m.eval()
        batch = text_batches(models.tokenizer, records, 3, 32, None)[0]
        out = fedkd_losses(models, cfg.method, batch)
        assert out.teacher_task.item() < 1e-15 and out.student_task.item() < 1e-15
        loose = fedkd_losses(models, cfg.method.model_copy(update={"min_task_loss_sum": 1e9}),
                             batch)
        return out.hidden.item(), loose.hidden.item() * 1e9  # the second: the raw Eq. 5 sum

    guarded, raw = hidden()
    assert raw > 0 and guarded == pytest.approx(raw / 0.1, rel=1e-5)  # weight 10, not 1e21
    unguarded, raw = hidden("method={name: fedkd, min_task_loss_sum: 1.0e-30}")
    assert unguarded > 1e12 * raw


def test_eq_5_magnitudes_and_its_ablation(tmp_path):
    cfg = fedkd_config(tmp_path)
    models = FedKDModels.build(cfg, 2)
    for m in (models.teacher, models.student):
        m.eval()
    batch = text_batches(models.tokenizer, _tweets(8), 8, 32, None)[0]
    terms = loss_magnitudes(models, cfg.method, batch)
    out = fedkd_losses(models, cfg.method, batch)
    assert terms["hidden"] == pytest.approx(out.hidden.item(), rel=1e-5) and terms["hidden"] > 0
    # Eq. 5 reaches the teacher's layers up to the deepest matched one (4 of 4)
    assert all(terms[f"grad_ratio/hidden/layer_{i}"] > 0 for i in range(4))
    off = fedkd_config(tmp_path, "method={name: fedkd, hidden_loss: false, attention_loss: false}")
    models = FedKDModels.build(off, 2)
    for m in (models.teacher, models.student):
        m.eval()
    terms = loss_magnitudes(models, off.method, batch)
    assert terms["hidden"] == 0 and all(terms[f"grad_ratio/hidden/layer_{i}"] == 0
                                        for i in range(4))
    assert terms["grad_ratio/kd/layer_0"] > 0


def test_oversample_balances_each_clients_classes(tmp_path):
    from fedkt.data.splits import client_splits

    cfg = fedkd_config(tmp_path, "data.dataset={name: tweeteval_offensive}",
                       "data.partition.scheme=iid", "data.max_private_per_client=40")
    plain = client_splits(cfg.data, 2, 0)
    balanced = client_splits(cfg.data.model_copy(update={"oversample": True}), 2, 0)
    for before, after in zip(plain.private, balanced.private, strict=True):
        counts = [sum(r["label"] == y for r in before) for y in (0, 1)]
        assert counts[0] != counts[1]  # offensive is imbalanced (a third offensive)
        assert [sum(r["label"] == y for r in after) for y in (0, 1)] == [max(counts)] * 2
        assert after[: len(before)] == before and all(r in before for r in after)
    assert balanced.test == plain.test
    gen = fedkd_config(tmp_path, "data.dataset={name: social_iqa}", "data.partition.scheme=iid")
    with pytest.raises(Exception, match="data.oversample balances classes"):
        client_splits(gen.data.model_copy(update={"oversample": True}), 2, 0)
