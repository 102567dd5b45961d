"""Model scoring on a tiny GPT-2 with a tokenizer trained in the test (no hub)."""

from __future__ import annotations

import copy
import sys
import types
import warnings

import pytest
import torch

from fedkt.eval.evaluate import eval_classifier, evaluate_causal_lm
from fedkt.eval.generation import _cut, generate
from fedkt.eval.scorer import mc_accuracy, mc_predictions, score_choices, target_loss

SENTENCES = [
    "The sky is blue and the grass is green.",
    "A cat sat on the mat near the door.",
    "Question: what colour is the sky?\nAnswer: blue",
    "Dogs bark loudly at night, cats sleep all day.",
    "Is this review positive or negative? Great film.",
]

CONTEXTS = [
    "The sky is",
    "Question: what colour is the sky?\nAnswer:",
    "A cat sat on the",
    "",  # empty context: conditioned on the EOS/BOS token
]
CHOICES = [
    [" blue", " green and red", " loud"],
    [" blue", " the grass is green at night"],
    [" mat", " door", " dog barks", " x"],
    ["Dogs bark", "A"],
]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 3, vocab_size=320, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>")


def _gpt2(tokenizer, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=128,
                        vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    return GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def model(tokenizer):
    return _gpt2(tokenizer)


def manual_scores(model, tokenizer, contexts, choices, max_length=10_000):
    """One forward per (context, choice): the reference the batched code must equal."""
    out = []
    model.eval()
    with torch.no_grad():
        for ctx, conts in zip(contexts, choices, strict=True):
            row = []
            for cont in conts:
                ctx_text, cont_text = ctx.rstrip(), ctx[len(ctx.rstrip()):] + cont
                ctx_ids = tokenizer.encode(ctx_text, add_special_tokens=False)
                whole = tokenizer.encode(ctx_text + cont_text, add_special_tokens=False)
                cont_ids = whole[len(ctx_ids):]
                ctx_ids = ctx_ids or [tokenizer.eos_token_id]
                seq = (ctx_ids + cont_ids)[-(max_length + 1):]
                n = min(len(cont_ids), len(seq) - 1)
                logits = model(input_ids=torch.tensor([seq[:-1]])).logits[0]
                logprobs = torch.log_softmax(logits.float(), -1)
                row.append(sum(logprobs[len(seq) - 1 - n + k, seq[len(seq) - n + k]].item()
                               for k in range(n)))
            out.append(row)
    return out


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_score_choices_matches_one_forward_per_choice(model, tokenizer, batch_size):
    expected = manual_scores(model, tokenizer, CONTEXTS, CHOICES)
    got = score_choices(model, tokenizer, CONTEXTS, CHOICES, batch_size=batch_size)
    assert [len(r) for r in got] == [len(r) for r in CHOICES]
    for g_row, e_row in zip(got, expected, strict=True):
        assert g_row == pytest.approx(e_row, abs=1e-5)
    # Distinct choices get distinct scores (the gather is not reading padding).
    assert len(set(got[2])) == len(got[2])


def test_score_choices_truncates_context_from_the_left(model, tokenizer):
    expected = manual_scores(model, tokenizer, CONTEXTS[:3], CHOICES[:3], max_length=6)
    got = score_choices(model, tokenizer, CONTEXTS[:3], CHOICES[:3], batch_size=4, max_length=6)
    for g_row, e_row in zip(got, expected, strict=True):
        assert g_row == pytest.approx(e_row, abs=1e-5)


def test_trailing_space_of_context_moves_to_continuation(model, tokenizer):
    a = score_choices(model, tokenizer, ["The sky is "], [["blue"]])
    b = score_choices(model, tokenizer, ["The sky is"], [[" blue"]])
    assert a[0] == pytest.approx(b[0], abs=1e-6)


@pytest.mark.parametrize("kind", ["lora", "prefix"])
def test_peft_models_score_like_their_single_forward(model, tokenizer, kind):
    from peft import LoraConfig, PrefixTuningConfig, get_peft_model

    config = (LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM")
              if kind == "lora" else PrefixTuningConfig(num_virtual_tokens=4,
                                                        task_type="CAUSAL_LM"))
    with warnings.catch_warnings():  # peft notes GPT-2's Conv1D layout
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(copy.deepcopy(model), config)
    if kind == "lora":  # make the adapter non-zero so it matters
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
    peft_model.train()
    got = score_choices(peft_model, tokenizer, CONTEXTS[:3], CHOICES[:3], batch_size=5)
    assert peft_model.training  # mode restored
    expected = manual_scores(peft_model, tokenizer, CONTEXTS[:3], CHOICES[:3])
    for g_row, e_row in zip(got, expected, strict=True):
        assert g_row == pytest.approx(e_row, abs=1e-5)
    base = score_choices(model, tokenizer, CONTEXTS[:3], CHOICES[:3])
    assert got[0] != pytest.approx(base[0], abs=1e-4)  # the adapter is really used


def test_mode_is_restored_per_module(tokenizer):
    model = _gpt2(tokenizer)
    model.train()
    model.transformer.h[0].eval()  # a frozen block stays in eval mode
    score_choices(model, tokenizer, ["The sky is"], [[" blue"]])
    assert model.training and model.transformer.h[1].training
    assert not model.transformer.h[0].training


def test_fine_tuned_model_prefers_the_trained_choice(tokenizer):
    model = _gpt2(tokenizer, seed=1)
    context, choices = "The sky is", [" blue", " green", " loud", " on the mat"]
    before = score_choices(model, tokenizer, [context], [choices])[0]
    gold = min(range(len(choices)), key=lambda i: before[i])  # the least likely choice
    assert mc_accuracy(model, tokenizer, [context], [choices], [gold])["accuracy"] == 0.0

    ids = tokenizer.encode(context + choices[gold])
    n_ctx = len(tokenizer.encode(context))
    labels = torch.tensor([[-100] * n_ctx + ids[n_ctx:]])
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(15):
        loss = model(input_ids=torch.tensor([ids]), labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    result = mc_accuracy(model, tokenizer, [context], [choices], [gold])
    assert result == {"accuracy": 1.0, "accuracy_norm": 1.0}
    assert model.training


def test_acc_norm_divides_by_characters_without_leading_space():
    scores = [[-4.0, -6.0], [-3.0, -3.5]]
    conts = [[" ab", " abcdef"], [" a", " abc"]]
    preds, preds_norm = mc_predictions(scores, conts)
    # -4/2=-2 vs -6/6=-1 ; -3/1 vs -3.5/3
    assert preds == [0, 0] and preds_norm == [1, 1]


def test_acc_norm_counts_a_choices_own_leading_whitespace_as_lm_eval():
    # lm-eval's acc_norm divides by len(choice): only the delimiter space is not counted
    scores = [[-4.0, -5.0]]
    conts = [["    ab", " abcd"]]  # lengths 5 and 4 (lstrip would give 2: -2 > -1.25)
    assert mc_predictions(scores, conts)[1] == [0]  # -0.8 > -1.25


def test_target_loss_is_mean_token_cross_entropy(model, tokenizer):
    prompts, targets = ["The sky is", "A cat"], [" blue and the grass", " sat"]
    sums = manual_scores(model, tokenizer, prompts, [[t] for t in targets])
    tokens = sum(len(tokenizer.encode(p + t)) - len(tokenizer.encode(p))
                 for p, t in zip(prompts, targets, strict=True))
    expected = -(sums[0][0] + sums[1][0]) / tokens
    assert target_loss(model, tokenizer, prompts, targets, batch_size=2) == pytest.approx(
        expected, abs=1e-5)


def test_batched_generation_equals_one_by_one(model, tokenizer):
    prompts = ["The sky is", "Question: what colour is the sky?\nAnswer:", "A"]
    batched = generate(model, tokenizer, prompts, max_new_tokens=6, batch_size=3, stop=())
    single = [generate(model, tokenizer, [p], max_new_tokens=6, batch_size=1, stop=())[0]
              for p in prompts]
    assert batched == single
    assert any(batched)


def test_generation_cut():
    assert _cut("  Paris is big.\nQuestion: next", ("\n",)) == "Paris is big."
    assert _cut("\n\nParis\nx", ("\n",)) == "Paris"
    assert _cut("a b", ()) == "a b"


def test_generation_stops_at_eos(tokenizer):
    model = _gpt2(tokenizer)
    with torch.no_grad():  # make EOS the only likely token
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[tokenizer.eos_token_id].fill_(5.0)
    assert generate(model, tokenizer, ["The sky is"], max_new_tokens=4) == [""]


def test_eval_classifier_matches_manual(tokenizer):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=128, num_labels=2,
                        vocab_size=len(tokenizer), pad_token_id=tokenizer.eos_token_id)
    clf = GPT2ForSequenceClassification(config)
    texts = ["Great film.", "The sky is blue and the grass is green.", "A cat", "Dogs bark."]
    labels = [1, 0, 1, 0]
    got = eval_classifier(clf, tokenizer, texts, labels, batch_size=3, max_length=64)
    clf.eval()
    with torch.no_grad():
        logits = torch.cat([clf(input_ids=torch.tensor([tokenizer.encode(t)])).logits
                            for t in texts])
    preds = logits.argmax(-1).tolist()
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels)).item()
    assert got["loss"] == pytest.approx(loss, abs=1e-5)
    assert got["accuracy"] == sum(p == y for p, y in zip(preds, labels, strict=True)) / 4
    assert set(got) >= {"accuracy", "precision", "recall", "f1", "loss"}


# --------------------------------------------------------------------------- dispatcher


def _fake_formatting() -> types.ModuleType:
    mod = types.ModuleType("fedkt.data.formatting")

    def mc_view(record, task, label_names, template=None, chat=None):
        if task == "classification":
            return f"{record['text']}\nLabel:", [" " + n for n in label_names], record["label"]
        return record["prompt"], [" " + c for c in record["choices"]], record["label"]

    def lm_pair(record, task, label_names, template=None, chat=None):
        if task == "generation":
            return record["prompt"], " " + record["target"]
        ctx, conts, gold = mc_view(record, task, label_names, template)
        return ctx, conts[gold]

    mod.mc_view, mod.lm_pair = mc_view, lm_pair
    return mod


@pytest.fixture
def fake_formatting(monkeypatch):
    monkeypatch.setitem(sys.modules, "fedkt.data.formatting", _fake_formatting())


def test_evaluate_lm_multiple_choice(model, tokenizer, fake_formatting):
    records = [{"prompt": c, "choices": [x.strip() for x in ch], "label": 0}
               for c, ch in zip(CONTEXTS[:3], CHOICES[:3], strict=True)]
    out = evaluate_causal_lm(model, tokenizer, records, "multiple_choice", None, batch_size=4,
                      max_length=64, max_new_tokens=4)
    assert set(out) == {"loss", "accuracy", "accuracy_norm"}
    direct = mc_accuracy(model, tokenizer, CONTEXTS[:3], CHOICES[:3], [0, 0, 0], max_length=64)
    assert out["accuracy"] == direct["accuracy"]
    assert out["loss"] == pytest.approx(target_loss(
        model, tokenizer, CONTEXTS[:3], [ch[0] for ch in CHOICES[:3]], max_length=64))


def test_evaluate_lm_classification_and_generation(model, tokenizer, fake_formatting):
    cls = [{"text": "Great film.", "label": 1}, {"text": "Dogs bark.", "label": 0}]
    out = evaluate_causal_lm(model, tokenizer, cls, "classification", ["negative", "positive"],
                      batch_size=2, max_length=64, max_new_tokens=4, positive_label=1)
    assert set(out) == {"loss", "accuracy", "accuracy_norm", "precision", "recall", "f1",
                        "macro_f1"}
    gen = [{"prompt": "The sky is", "target": "blue", "references": ["blue", "green"]},
           {"prompt": "A cat", "target": "sat on the mat"}]
    out = evaluate_causal_lm(model, tokenizer, gen, "generation", None, batch_size=2, max_length=64,
                      max_new_tokens=4)
    assert set(out) == {"loss", "rougeL"} and 0.0 <= out["rougeL"] <= 100.0
    with pytest.raises(ValueError, match="unknown task"):
        evaluate_causal_lm(model, tokenizer, gen, "ranking", None)


def test_tokenizer_that_adds_bos_is_scored_with_bos(tokenizer, model):
    """Llama-style tokenizers put BOS before the text; the context starts with it."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    eos = tokenizer.eos_token_id
    backend.post_processor = TemplateProcessing(single="<|endoftext|> $A",
                                                special_tokens=[("<|endoftext|>", eos)])
    bos_tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                                      bos_token="<|endoftext|>")
    assert bos_tok.encode("The sky")[0] == eos  # the default encoding adds BOS
    got = score_choices(model, bos_tok, ["The sky is"], [[" blue", " green and red"]])
    # Same as scoring with a plain tokenizer and an explicit BOS in front of the context.
    model.eval()
    with torch.no_grad():
        for score, cont in zip(got[0], [" blue", " green and red"], strict=True):
            ctx = [eos] + tokenizer.encode("The sky is")
            cont_ids = tokenizer.encode("The sky is" + cont)[len(ctx) - 1:]
            seq = ctx + cont_ids
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([seq[:-1]])).logits[0], -1)
            n = len(cont_ids)
            manual = sum(logprobs[len(seq) - 1 - n + k, seq[len(seq) - n + k]].item()
                         for k in range(n))
            assert score == pytest.approx(manual, abs=1e-5)


def test_evaluate_lm_with_the_real_formatting(model, tokenizer):
    formatting = pytest.importorskip("fedkt.data.formatting")
    records = [{"prompt": "What colour is the sky?", "choices": ["blue", "green", "loud"],
                "label": 0},
               {"prompt": "Where did the cat sit?", "choices": ["mat", "door"], "label": 1}]
    out = evaluate_causal_lm(model, tokenizer, records, "multiple_choice", None, batch_size=3,
                      max_length=128)
    views = [formatting.mc_view(r, "multiple_choice", None) for r in records]
    direct = mc_accuracy(model, tokenizer, [v[0] for v in views], [v[1] for v in views],
                         [v[2] for v in views], max_length=128)
    assert {k: out[k] for k in direct} == direct
    assert out["loss"] > 0
