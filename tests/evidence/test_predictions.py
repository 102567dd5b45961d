"""Per-example predictions of every kind of evaluation reproduce the reported metrics."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedkt.data.splits import run_data
from fedkt.eval import predictions
from fedkt.eval.evaluate import eval_classifier, evaluate_causal_lm
from fedkt.eval.predictions import Predictions, pack, unpack
from fedkt.evidence.stats import components, metric_names
from fedkt.train.lm import client_lm, evaluate_lm
from fedkt.train.vision import evaluate_vision as evaluate_images
from tests.conftest import run_data_of


def _check(table: Predictions, metrics: dict[str, float]) -> None:
    names = metric_names(table)
    assert names and set(names) <= set(metrics)
    for name in names:
        comp, metric = components(table, name)
        assert float(metric.fn(comp.sum(0))) == pytest.approx(metrics[name], abs=1e-9), name


def test_multiple_choice_and_classification_tables_match_metrics(make_config):
    cfg = make_config()
    lm = client_lm(cfg, 0)
    test = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).test
    with predictions.capture() as tables:
        metrics = evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    table = tables[""]
    assert table.ids == [r["id"] for r in test]
    assert len(table.columns["scores"][0]) == 7  # one log-likelihood per intent
    assert all(p == max(range(7), key=lambda c, s=s: (s[c], -c))
               for p, s in zip(table.columns["pred"], table.columns["scores"], strict=True))
    _check(table, metrics)
    # The same table survives the trip a client reply makes.
    again = unpack(pack(tables))[""]
    assert again.columns == table.to_json()["columns"]


def test_generation_table_holds_text_and_per_example_rouge(make_config):
    cfg = make_config()
    lm = client_lm(cfg, 0)
    records = [{"id": f"g{i}", "prompt": f"Say {w}:", "target": f" {w}",
                "references": [w, f"{w} now"]} for i, w in enumerate(["yes", "no", "maybe"])]
    with predictions.capture() as tables:
        metrics = evaluate_causal_lm(lm.model, lm.tokenizer, records, "generation",
                              max_new_tokens=4, max_length=32)
    table = tables[""]
    assert table.ids == ["g0", "g1", "g2"] and table.columns["gold"] == ["yes", "no", "maybe"]
    assert all(isinstance(t, str) for t in table.columns["pred"])
    _check(table, metrics)


class _Logits(nn.Module):
    """A bag-of-tokens linear classifier: enough to exercise the classifier evaluation."""

    def __init__(self, vocab: int, classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(vocab, classes, mode="sum")

    def forward(self, input_ids, attention_mask):
        out = self.emb(input_ids, per_sample_weights=attention_mask.float())
        return type("Out", (), {"logits": out})()


def test_encoder_and_image_classifier_tables_match_metrics(make_config):
    cfg = make_config()
    tok = client_lm(cfg, 0).tokenizer
    texts = [f"text number {i} {'good' if i % 3 else 'bad'}" for i in range(40)]
    labels = [i % 2 for i in range(40)]
    with predictions.capture() as tables:
        metrics = eval_classifier(_Logits(len(tok), 2), tok, texts, labels,
                                  ids=[f"t{i}" for i in range(40)])
    assert tables[""].meta["task"] == "classifier"
    _check(tables[""], metrics)

    images, y = torch.randn(50, 1, 4, 4), torch.arange(50) % 3
    with predictions.capture() as tables, predictions.scope("small"):
        metrics = evaluate_images(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), images, y,
                                  ids=[f"img{i}" for i in range(50)])
    table = tables["small"]
    assert table.columns["gold"] == y.tolist()
    assert pytest.approx(metrics["accuracy"]) == float(
        components(table, "accuracy")[1].fn(components(table, "accuracy")[0].sum(0)))


def test_nothing_is_collected_outside_a_capture(make_config):
    cfg = make_config()
    lm = client_lm(cfg, 0)
    test = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).test
    evaluate_lm(cfg, lm, test, data=run_data_of(cfg))  # no capture open: emit is a no-op
    with predictions.capture() as tables:
        pass
    assert tables == {}
