"""Many-way choice scoring: labels after one shared context, cut into forwards of similar
lengths, give the whole sequences' log-likelihoods and answers on every preset family."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutput

from fedkt.eval.inputs import _encode_example, _special_prefix
from fedkt.eval.layout import (
    CALL_COST,
    carriers,
    choice_groups,
    model_plan,
    plan_layout,
    row_widths,
)
from fedkt.eval.scorer import _score_grouped, mc_predictions, score_choices
from fedkt.models.tiny import build_tiny_causal_lm
from tests.conftest import run_data_of

# Labels sharing leading words, of 1 to many tokens (Banking77-like), after utterances; one
# context too long for MAX_LENGTH (cut from the left: whole sequences), one empty choice
# list; contexts of one token length so that chunks hold several examples.
LABELS = ["card", "card arrival", "card linking", "card payment fee charged",
          "card payment wrong exchange rate", "cash", "cash withdrawal charge",
          "top up", "top up failed", "top up by bank transfer charge", "transfer",
          "transfer not received by recipient", "pin blocked", "age limit", "x"]
CONTEXTS = [
    "Text: my card has still not arrived after two weeks\nLabel:",
    "Text: why was I charged a fee for my cash withdrawal\nLabel:",
    "Text: the money I sent has not reached my friend\nLabel:",
    "Text: how old do I need to be\nLabel:",
    "Text: " + " ".join(["please"] * 50) + "\nLabel:",
    "Text: nothing\nLabel:",
]
CHOICES = [[" " + name for name in LABELS]] * 5 + [[]]
MAX_LENGTH = 40
FAMILIES = ["tiny-gpt2", "tiny-opt", "tiny-llama", "tiny-bloom", "tiny-qwen2"]


def _both(model, tokenizer, batch_size=4):
    return [_score_grouped(model, tokenizer, CONTEXTS, CHOICES, batch_size=batch_size,
                           max_length=MAX_LENGTH, layout=layout)
            for layout in ("shared", "pairs")]


@pytest.mark.parametrize("name", FAMILIES)
def test_many_labels_after_a_shared_context_equal_whole_sequences(name):
    model, tokenizer = build_tiny_causal_lm(name, seed=0)
    prefix = _special_prefix(tokenizer)
    encoded = [_encode_example(tokenizer, c, conts, prefix)
               for c, conts in zip(CONTEXTS, CHOICES, strict=True)]
    plan = model_plan(model, encoded, batch_size=4, max_length=MAX_LENGTH, layout="shared")
    shared = {i for chunk in plan.shared for i in chunk}
    assert {0, 1, 2, 3} <= shared and 4 not in shared  # the cut one goes whole
    assert max(len(groups) for groups in plan.groups) > 1  # labels split by length
    for chunk, groups in zip(plan.shared, plan.groups, strict=True):
        # one row per distinct beginning of the labels (the trie): fewer than the labels
        # of more than one token
        widths = row_widths([[cont for _, cont in encoded[i]] for i in chunk])
        grouped = sorted(r for group in groups for r in group)
        assert grouped == [r for r, w in enumerate(widths) if w > 0]
        assert len(grouped) < sum(len(cont) > 1 for i in chunk for _, cont in encoded[i])
    new, old = _both(model, tokenizer)
    for row_new, row_old in zip(new, old, strict=True):
        assert [n for _, n in row_new] == [n for _, n in row_old]  # tokens scored
        assert [s for s, _ in row_new] == pytest.approx([s for s, _ in row_old], abs=1e-4)
    scores = [[[s for s, _ in row] for row in rows] for rows in (new, old)]
    keep = [i for i, conts in enumerate(CHOICES) if conts]
    answers = [mc_predictions([s[i] for i in keep], [CHOICES[i] for i in keep])
               for s in scores]
    assert answers[0] == answers[1]


@pytest.mark.parametrize("batch_size", [1, 3, 16, 200])
def test_batch_boundaries_do_not_move_the_scores(batch_size):
    model, tokenizer = build_tiny_causal_lm("tiny-llama", seed=1)
    reference = score_choices(model, tokenizer, CONTEXTS, CHOICES, batch_size=2,
                              max_length=MAX_LENGTH, layout="pairs")
    for layout in ("shared", "auto"):
        got = score_choices(model, tokenizer, CONTEXTS, CHOICES, batch_size=batch_size,
                            max_length=MAX_LENGTH, layout=layout)
        for row, ref in zip(got, reference, strict=True):
            assert row == pytest.approx(ref, abs=1e-4)


def test_bf16_autocast_gives_the_same_answers():
    model, tokenizer = build_tiny_causal_lm("tiny-llama", seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new, old = _both(model, tokenizer)
    for row_new, row_old in zip(new, old, strict=True):
        values_new, values_old = [s for s, _ in row_new], [s for s, _ in row_old]
        assert values_new == pytest.approx(values_old, abs=0.05)  # bf16 rounding
        if values_old:
            ranked = sorted(values_old, reverse=True)
            if ranked[0] - ranked[1] > 0.1:  # an answer bf16 rounding cannot flip
                assert values_new.index(max(values_new)) == values_old.index(ranked[0])


def test_the_label_trie_runs_each_beginning_once():
    # oil change when / oil change how / uber / oil / oil change / gas station / (empty)
    conts = [[1, 2, 3], [1, 2, 4], [5], [1], [1, 2], [6, 7], []]
    # The first two share their tokens but the last: one row scores both, and "oil change"
    # reads its second token from it too; one-token and empty choices need no row.
    assert carriers(conts) == [0, 0, -1, -1, 0, 5, -1]
    assert row_widths([conts]) == [2, 0, 0, 0, 0, 1, 0]
    assert row_widths([conts], trie=False) == [2, 2, 0, 0, 1, 1, 0]
    assert carriers(conts, trie=False) == [0, 1, -1, -1, 4, 5, -1]
    assert carriers([[1, 2], [1, 3, 4]]) == [1, 1]  # the longer row carries
    assert carriers([[1, 2, 3], [1, 2, 3]]) == [0, 0]  # the same label twice: the first


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_the_label_trie_scores_fewer_rows_with_the_same_log_likelihoods(name):
    model, tokenizer = build_tiny_causal_lm(name, seed=0)
    rows: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(int(kwargs["input_ids"].numel())), with_kwargs=True)
    got = {}
    try:
        for trie in (True, False):
            rows.clear()
            got[trie] = (score_choices(model, tokenizer, CONTEXTS[:4], CHOICES[:4],
                                       batch_size=64, max_length=MAX_LENGTH, layout="shared",
                                       trie=trie), sum(rows))
    finally:
        handle.remove()
    (with_trie, positions), (without, positions_without) = got[True], got[False]
    assert positions < positions_without  # token positions through the model
    reference = score_choices(model, tokenizer, CONTEXTS[:4], CHOICES[:4], batch_size=4,
                              max_length=MAX_LENGTH, layout="pairs")
    for a, b, ref in zip(with_trie, without, reference, strict=True):
        assert a == pytest.approx(ref, abs=1e-4) and b == pytest.approx(ref, abs=1e-4)
    assert mc_predictions(with_trie, CHOICES[:4]) == mc_predictions(reference, CHOICES[:4])


class _NoCache(torch.nn.Module):
    """A causal LM whose forward takes and returns no key/value cache."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, **_):
        return CausalLMOutput(logits=self.inner(input_ids=input_ids,
                                                attention_mask=attention_mask).logits)


def test_a_model_without_a_cache_scores_whole_sequences():
    model, tokenizer = build_tiny_causal_lm("tiny-gpt2", seed=0)
    wrapped = _NoCache(model)
    got = score_choices(wrapped, tokenizer, CONTEXTS, CHOICES, batch_size=4,
                        max_length=MAX_LENGTH, layout="shared")
    ref = score_choices(model, tokenizer, CONTEXTS, CHOICES, batch_size=4,
                        max_length=MAX_LENGTH, layout="pairs")
    for row, want in zip(got, ref, strict=True):
        assert row == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-bloom", "tiny-qwen2"])
def test_every_family_takes_the_cache_by_name(name):
    from fedkt.models.kv_cache import CACHE_KWARG

    model, _ = build_tiny_causal_lm(name, seed=0)
    assert CACHE_KWARG in inspect.signature(model.forward).parameters


def test_choice_groups_trade_padding_for_forward_calls():
    widths = [0, 2, 16, 3, 2, 8, 15, 16, 3]
    free, cost = choice_groups(widths, 10)  # calls cost nothing: no padding at all
    assert all(len({widths[r] for r in g}) == 1 for g in free)
    assert cost == sum(widths)
    one, cost = choice_groups(widths, 10, call=1e6)  # calls dear: one padded forward
    assert len(one) == 1 and sorted(one[0]) == [r for r, w in enumerate(widths) if w]
    assert cost == 1e6 + 8 * 16
    some, cost = choice_groups(widths, 10, call=CALL_COST, head=0.27)
    assert sorted(r for g in some for r in g) == sorted(one[0])
    assert 1 < len(some) < len(free)
    assert cost < CALL_COST + 8 * 16 * 1.27  # cheaper than one padded forward
    assert choice_groups([0, 0], 5, call=CALL_COST) == ([], 0.0)


def test_77_labels_of_uneven_length_share_their_context():
    # 77 labels of 3-17 tokens after 18-token contexts (Banking77): the planner's groups
    # pad less than one forward, and sharing costs well under whole sequences.
    widths = [2 + (k * 7) % 15 for k in range(77)]
    encoded = [[(list(range(18)), [100 + k] + [5] * w) for k, w in enumerate(widths)]
               for _ in range(4)]
    plan = plan_layout(encoded, batch_size=8, max_length=256, head=0.27, call=CALL_COST)
    assert sorted(i for chunk in plan.shared for i in chunk) == [0, 1, 2, 3]
    assert plan.cost["shared"] < plan.cost["pairs"] / 2
    padded = sum(len(g) * max(widths[r % 77] for r in g)
                 for groups in plan.groups for g in groups)
    assert padded < 4 * 77 * max(widths)


def test_the_scoring_setting_is_checked_and_reaches_the_scorer_and_the_key(make_config,
                                                                          monkeypatch):
    from fedkt.errors import ConfigError
    from fedkt.eval import evaluate, reuse
    from fedkt.train.lm import client_lm, evaluate_lm

    with pytest.raises(ConfigError, match="eval.scoring: .*'auto', 'shared' or 'pairs'"):
        make_config("eval.scoring=fast")
    assert make_config().eval.scoring == "auto"
    seen: dict[str, list] = {"layouts": [], "keys": []}
    real_score, real_store = evaluate._score_grouped, reuse.evaluation

    def score(*args, layout="auto", **kwargs):
        seen["layouts"].append(layout)
        return real_score(*args, layout=layout, **kwargs)

    def store(enabled, model, tokenizer, parts, compute):
        seen["keys"].append(dict(parts))
        return real_store(enabled, model, tokenizer, parts, compute)

    monkeypatch.setattr(evaluate, "_score_grouped", score)
    monkeypatch.setattr(reuse, "evaluation", store)
    records = [{"text": "play jazz", "label": 3, "id": "0"},
               {"text": "weather in Paris", "label": 2, "id": "1"}]
    results = []
    for layout in ("pairs", "shared", "pairs"):
        cfg = make_config(f"eval.scoring={layout}", name=layout)
        results.append(evaluate_lm(cfg, client_lm(cfg, 0), records, data=run_data_of(cfg)))
    # The second "pairs" is served from the store (not scored again); "shared" is not.
    assert seen["layouts"] == ["pairs", "shared"]
    assert [k["layout"] for k in seen["keys"]] == ["pairs", "shared", "pairs"]
    assert results[1]["accuracy"] == results[0]["accuracy"]
    assert results[1]["loss"] == pytest.approx(results[0]["loss"], abs=1e-3)  # bf16 here
