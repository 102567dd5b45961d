"""The scorer's two layouts (a shared context vs whole sequences) and the choice between them."""

from __future__ import annotations

import pytest
import torch

from fedkt.eval.inputs import _encode_example, _special_prefix, encode_scored
from fedkt.eval.layout import ATTENTION_COST, CALL_COST, _head_share, plan_layout
from fedkt.eval.scorer import score_choices
from fedkt.models.tiny import build_tiny_causal_lm

# Long contexts with short choices (intents), short contexts with long choices of uneven
# length (PIQA), two contexts of one token length, an empty choice list and a context
# too long for max_length (scored as whole sequences, context cut from the left).
CONTEXTS = [
    "Text: play the new album by the band from the radio this evening please\nLabel:",
    "Text: book a table for four people near the station tomorrow at noon\nLabel:",
    "Question: how to boil an egg?\nAnswer:",
    "Question: how to dry a wet phone?\nAnswer:",
    "A cat sat on the",
    "The sky is",
    " ".join(["word"] * 60),
]
CHOICES = [
    [" play_music", " book_restaurant", " get_weather", " rate_book"],
    [" play_music", " book_restaurant", " get_weather", " rate_book"],
    [" Put it in a pot of boiling water for nine minutes, then cool it in cold water.",
     " Fry it."],
    [" Leave it in a bowl of dry rice overnight.",
     " Put it in the oven at a high heat for an hour and then shake it hard."],
    [" mat", " door"],
    [],
    [" end", " of the long sentence here"],
]
MAX_LENGTH = 48


def one_by_one(model, tokenizer, contexts, choices, max_length):
    """One forward per (context, choice), encoded as the scorer encodes: the reference."""
    out = []
    with torch.no_grad():
        for ctx, conts in zip(contexts, choices, strict=True):
            row = []
            for cont in conts:
                seq, n = encode_scored(tokenizer, ctx, cont, max_length)
                logprobs = model(input_ids=torch.tensor([seq[:-1]])).logits[0].float()
                logprobs = logprobs.log_softmax(-1)
                row.append(sum(logprobs[len(seq) - 1 - n + k, seq[len(seq) - n + k]].item()
                               for k in range(n)))
            out.append(row)
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bloom"])
def test_every_layout_gives_the_same_log_likelihoods(name):
    model, tokenizer = build_tiny_causal_lm(name)
    model.eval()
    expected = one_by_one(model, tokenizer, CONTEXTS, CHOICES, MAX_LENGTH)
    prefix = _special_prefix(tokenizer)
    encoded = [_encode_example(tokenizer, c, conts, prefix)
               for c, conts in zip(CONTEXTS, CHOICES, strict=True)]
    for layout in ("shared", "pairs", "auto"):
        plan = plan_layout(encoded, batch_size=4, max_length=MAX_LENGTH, layout=layout)
        shared = {i for chunk in plan.shared for i in chunk}
        if layout == "shared":  # every example that fits is shared, the long one is not
            assert shared == {0, 1, 2, 3, 4}
        if layout == "pairs":
            assert not shared
        got = score_choices(model, tokenizer, CONTEXTS, CHOICES, batch_size=4,
                            max_length=MAX_LENGTH, layout=layout)
        assert [len(r) for r in got] == [len(r) for r in CHOICES]
        for g_row, e_row in zip(got, expected, strict=True):
            assert g_row == pytest.approx(e_row, abs=1e-4), layout
        assert len(set(got[2])) == 2 and len(set(got[0])) == 4  # no row reads another's


def _examples(n: int, context: int, choices: list[int], start: int = 0):
    """``n`` encoded examples: a context of ``context`` tokens, choices of those lengths
    (each its own first token: no two begin alike)."""
    return [[(list(range(start + i, start + i + context)), [500 + k] + [7] * (c - 1))
             for k, c in enumerate(choices)] for i in range(n)]


def test_short_choices_after_long_contexts_share_the_context():
    encoded = _examples(16, 40, [4, 5, 3, 4, 6, 4, 5])  # 7 intents of ~4 tokens
    plan = plan_layout(encoded, batch_size=32, max_length=256, head=0.27)
    assert sorted(i for chunk in plan.shared for i in chunk) == list(range(16))
    assert not plan.pairs
    assert plan.cost["shared"] < plan.cost["pairs"] / 3  # 40 + 7*5 vs 7 * 44 per item


def _piqa(n: int, start: int = 0):
    """PIQA: goals of 8-13 tokens, two sentence-long solutions of uneven lengths."""
    return [[(list(range(start, start + 8 + i % 6)), [8] + [7] * (9 + 7 * (i % 9))),
             (list(range(start, start + 8 + i % 6)), [9] + [7] * (9 + 7 * (i * 5 % 9)))]
            for i in range(n)]


def test_long_uneven_choices_after_short_contexts_are_scored_whole():
    # Priced as one padded forward of choices (calls dear), sharing loses to whole
    # sequences; with free calls each choice length gets its own forward and nothing is
    # padded, so sharing saves the contexts' positions.
    plan = plan_layout(_piqa(32), batch_size=32, max_length=256, head=0.27, call=1e4)
    assert plan.cost["pairs"] < plan.cost["shared"]
    assert len(plan.pairs) >= 0.8 * 64  # most rows; a chunk of equal-length choices may share
    assert plan.cost["chosen"] <= plan.cost["pairs"]
    free = plan_layout(_piqa(32), batch_size=32, max_length=256, head=0.27)
    assert free.cost["shared"] < free.cost["pairs"] and not free.pairs


def test_the_choice_is_made_per_batch():
    examples = _examples(8, 40, [4] * 7) + _piqa(32, 100)  # intents, then PIQA
    plan = plan_layout(examples, batch_size=32, max_length=256, head=0.27, call=1e3)
    shared = {i for chunk in plan.shared for i in chunk}
    assert set(range(8)) <= shared
    assert len({i for i, _ in plan.pairs}) >= 0.8 * 32
    assert plan.cost["chosen"] < min(plan.cost["shared"], plan.cost["pairs"])
    for chunk in plan.shared:  # at most batch_size rows a chunk, one context length each
        assert sum(len(examples[i]) for i in chunk) <= 32
        assert len({len(examples[i][0][0]) for i in chunk}) == 1
    # Forced, the same examples go where they are told, whatever they cost.
    assert not plan_layout(examples, batch_size=32, max_length=256, layout="shared").pairs
    assert not plan_layout(examples, batch_size=32, max_length=256, layout="pairs").shared


def test_the_output_layer_counts_where_it_runs():
    # One-token choices: shared runs the output layer on one position per context, whole
    # sequences from the first choice token on; a heavy output layer favours sharing more.
    encoded = _examples(4, 6, [1, 1])
    light = plan_layout(encoded, batch_size=8, max_length=64, head=0.0)
    heavy = plan_layout(encoded, batch_size=8, max_length=64, head=10.0,
                        logits_to_keep=False)
    assert light.cost["shared"] == 4 * 6 and light.cost["pairs"] == 8 * 6
    assert heavy.cost["shared"] == 4 * 6 * 11  # no logits_to_keep: every context position
    assert heavy.cost["pairs"] == 8 * 6 * 11


def test_bad_layout_is_named():
    with pytest.raises(ValueError, match="layout 'fast'"):
        plan_layout([], batch_size=8, max_length=8, layout="fast")
    model, tokenizer = build_tiny_causal_lm("tiny-gpt2")
    with pytest.raises(ValueError, match="layout 'fast'"):
        score_choices(model, tokenizer, ["a"], [[" b"]], layout="fast")


def test_head_share_of_a_tied_and_an_untied_head():
    model, _ = build_tiny_causal_lm("tiny-llama")
    head = model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - head
    if model.get_input_embeddings().weight is not model.get_output_embeddings().weight:
        body -= model.get_input_embeddings().weight.numel()
    assert _head_share(model) == pytest.approx(head / body)
    assert _head_share(model) > 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_cache_is_passed_under_the_installed_releases_name(name):
    """The shared layout hands the context's cache on as the forward's own keyword
    (``cache`` from transformers 5.2x, ``past_key_values`` before; the old name goes in
    5.40), and reads it back from the output under the same name."""
    import inspect

    from fedkt.models.kv_cache import CACHE_KWARG, returned_cache

    model, _ = build_tiny_causal_lm(name, seed=0)
    assert CACHE_KWARG in inspect.signature(model.forward).parameters
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=True)
    assert returned_cache(out).get_seq_length() == 3


def test_a_forward_calls_cost_keeps_small_savings_whole():
    # Two 3-token contexts with 20-token choices: sharing saves 6 positions and costs a
    # second forward call; counted, the rows go whole; long contexts still share.
    small = _examples(2, 3, [20, 20])
    assert plan_layout(small, batch_size=32, max_length=256).shared  # positions alone
    priced = plan_layout(small, batch_size=32, max_length=256, call=CALL_COST,
                         attention=ATTENTION_COST)
    assert not priced.shared and len(priced.pairs) == 4
    assert priced.cost["shared"] - priced.cost["pairs"] > CALL_COST / 2
    intents = _examples(16, 40, [4, 5, 3, 4, 6, 4, 5])
    assert not plan_layout(intents, batch_size=32, max_length=256, head=0.27,
                           call=CALL_COST, attention=ATTENTION_COST).pairs


def test_attention_makes_long_rows_dearer_per_position():
    one_long = _examples(1, 60, [59])
    two_short = _examples(2, 30, [30])
    for plan in (plan_layout(one_long, batch_size=8, max_length=256, layout="pairs"),
                 plan_layout(two_short, batch_size=8, max_length=256, layout="pairs")):
        assert plan.cost["pairs"] == 118  # 118 positions either way
    long_cost = plan_layout(one_long, batch_size=8, max_length=256, layout="pairs",
                            attention=ATTENTION_COST).cost["pairs"]
    short_cost = plan_layout(two_short, batch_size=8, max_length=256, layout="pairs",
                             attention=ATTENTION_COST).cost["pairs"]
    assert long_cost > short_cost > 118
