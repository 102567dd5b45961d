"""Per-group metrics (eval.class_groups): accuracy_<name> over the items of a group of classes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedkt.config import ConfigError
from fedkt.data import DataError
from fedkt.data.splits import run_data
from fedkt.eval import predictions
from fedkt.eval.evaluate import eval_classifier
from fedkt.eval.groups import group_accuracies, resolve_groups
from fedkt.evidence.stats import components, metric_names
from fedkt.train.lm import client_lm, evaluate_lm
from tests.conftest import run_data_of

GROUPS = "eval.class_groups={srv: '0-2', cli: [3, 4, 5, 6]}"


def test_group_accuracies_by_hand() -> None:
    preds = [0, 1, 2, 3, 3, 0]
    golds = [0, 2, 2, 3, 4, 5]
    got = group_accuracies(preds, golds, {"srv": [0, 1, 2], "cli": [3, 4, 5, 6], "six": [6]})
    # srv: items 0-2 (2 of 3 right); cli: items 3-5 (1 of 3); six: no item, not reported.
    assert got == {"accuracy_srv": pytest.approx(2 / 3), "accuracy_cli": pytest.approx(1 / 3)}


def test_groups_are_checked_against_the_classes() -> None:
    assert resolve_groups({"a": "0-1,4", "b": 3, "c": [6, 5]}, 7) == {
        "a": [0, 1, 4], "b": [3], "c": [6, 5]}
    with pytest.raises(DataError, match=r"eval.class_groups.cli: '3-7' must name distinct "
                                        r"classes in 0..6 \(out of range: \[7\]\)"):
        resolve_groups({"srv": "0-2", "cli": "3-7"}, 7)


@pytest.mark.parametrize(("groups", "message"), [
    ("{1st: '0'}", "eval.class_groups: group name '1st' must be a letter"),
    ("{a-b: '0'}", "eval.class_groups: group name 'a-b' must be a letter"),
    ("{norm: '0'}", "accuracy_norm, which is already a metric"),
    ("{srv: '0-'}", "eval.class_groups.srv: expected class indices"),
])
def test_group_names_and_classes_are_validated(make_config, groups: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config(f"eval.class_groups={groups}")


def _by_hand(table: predictions.Predictions, classes: set[int]) -> float:
    rows = [(p, g) for p, g in zip(table.columns["pred"], table.columns["gold"], strict=True)
            if g in classes]
    return sum(p == g for p, g in rows) / len(rows)


def test_llm_scorer_reports_group_accuracies_and_writes_the_groups(make_config) -> None:
    cfg = make_config(GROUPS)
    lm = client_lm(cfg, 0)
    test = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).test
    with predictions.capture() as tables:
        metrics = evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    table = tables[""]
    assert table.meta["class_groups"] == {"srv": [0, 1, 2], "cli": [3, 4, 5, 6]}
    assert metrics["accuracy_srv"] == pytest.approx(_by_hand(table, {0, 1, 2}))
    assert metrics["accuracy_cli"] == pytest.approx(_by_hand(table, {3, 4, 5, 6}))
    n_srv = sum(g <= 2 for g in table.columns["gold"])
    assert 0 < n_srv < len(table)  # both groups have items: the two are different subsets
    # The suites' components give the same numbers.
    assert {"accuracy_srv", "accuracy_cli"} <= set(metric_names(table))
    for name in ("accuracy_srv", "accuracy_cli"):
        comp, metric = components(table, name)
        assert float(metric.fn(comp.sum(0))) == pytest.approx(metrics[name], abs=1e-12)
    # Without groups: no group metric, no meta.
    with predictions.capture() as tables:
        plain_cfg = make_config(name="plain")
        plain = evaluate_lm(plain_cfg, lm, test, data=run_data_of(plain_cfg))
    assert not any(k.startswith("accuracy_") and k != "accuracy_norm" for k in plain)
    assert "class_groups" not in tables[""].meta


class _Logits(nn.Module):
    """A bag-of-tokens linear classifier (as in test_predictions)."""

    def __init__(self, vocab: int, classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(vocab, classes, mode="sum")

    def forward(self, input_ids, attention_mask):
        out = self.emb(input_ids, per_sample_weights=attention_mask.float())
        return type("Out", (), {"logits": out})()


def test_encoder_classifier_reports_group_accuracies(make_config) -> None:
    tok = client_lm(make_config(), 0).tokenizer
    texts = [f"text number {i} {'good' if i % 3 else 'bad'}" for i in range(40)]
    labels = [i % 4 for i in range(40)]
    with predictions.capture() as tables:
        metrics = eval_classifier(_Logits(len(tok), 4), tok, texts, labels,
                                  class_groups={"low": "0,1", "top": [3]})
    table = tables[""]
    assert table.meta["class_groups"] == {"low": [0, 1], "top": [3]}
    assert metrics["accuracy_low"] == pytest.approx(_by_hand(table, {0, 1}))
    assert metrics["accuracy_top"] == pytest.approx(_by_hand(table, {3}))
    with pytest.raises(DataError, match="eval.class_groups.top: .* in 0..3"):
        eval_classifier(_Logits(len(tok), 4), tok, texts, labels, class_groups={"top": [4]})
