"""Tokenised training pairs mask the prompt; batches pad correctly.

Tokenizers are trained here with ``tokenizers`` on vendored text, in GPT-2 style
(byte-level BPE, no BOS, no pad) and Llama style (Metaspace BPE, BOS prefix).
"""

from __future__ import annotations

import json
from functools import cache

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from fedkt.config import DatasetConfig
from fedkt.data import (
    IGNORE_INDEX,
    lm_pair,
    load_dataset_records,
    make_batches,
    pad_token_id,
    special_prefix,
    tokenize_pairs,
)
from fedkt.data.builtin import VENDORED


def _corpus() -> list[str]:
    path = VENDORED / "tweeteval" / "hate" / "train.jsonl"
    with path.open(encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for _, line in zip(range(400), fh, strict=False)]
    return texts + ["Text: x\nLabel: not-hate hate\nQuestion: A. B. C.\nAnswer:"] * 5


@cache
def gpt2_style() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@cache
def llama_style() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


TOKENIZERS = {"gpt2": gpt2_style, "llama": llama_style}


def _pairs() -> list[tuple[str, str]]:
    hate = load_dataset_records(DatasetConfig(name="tweeteval_hate:val", max_records=6))
    mc = load_dataset_records(DatasetConfig(name="social_iqa", max_records=6))
    pairs = [lm_pair(r, hate.task, hate.label_names) for r in hate.records]
    return pairs + [lm_pair(r, mc.task, None) for r in mc.records]


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_labels_mask_prompt_and_keep_target(kind: str) -> None:
    tok = TOKENIZERS[kind]()
    pairs = _pairs()
    items = tokenize_pairs(tok, pairs, max_length=256)
    prefix = special_prefix(tok)
    assert prefix == ([] if kind == "gpt2" else [tok.bos_token_id])
    for (prompt, target), item in zip(pairs, items, strict=True):
        ids, labels = item["input_ids"], item["labels"]
        assert len(ids) == len(labels) <= 256
        assert ids[: len(prefix)] == prefix
        assert ids[-1] == tok.eos_token_id and labels[-1] == tok.eos_token_id
        n_masked = labels.index(next(x for x in labels if x != IGNORE_INDEX))
        assert all(x == IGNORE_INDEX for x in labels[:n_masked])
        assert labels[n_masked:] == ids[n_masked:]
        target_text = tok.decode(labels[n_masked:-1])
        prompt_text = tok.decode(ids[len(prefix) : n_masked])
        if kind == "gpt2":  # byte-level BPE decodes exactly
            assert target_text == target
            assert prompt_text == prompt
        else:  # Metaspace drops the first token's leading space when decoding alone
            assert target_text.strip() == target.strip()
            assert tok.decode(ids[len(prefix) : -1]) == prompt + target


def test_left_truncation_keeps_target() -> None:
    tok = gpt2_style()
    ds = load_dataset_records(DatasetConfig(name="dialogsum", max_records=4))
    pairs = [lm_pair(r, ds.task, None, ds.template) for r in ds.records]
    full = tokenize_pairs(tok, pairs, max_length=4096)
    short = tokenize_pairs(tok, pairs, max_length=64)
    for (_, target), f, s in zip(pairs, full, short, strict=True):
        assert len(f["input_ids"]) > 64 and len(s["input_ids"]) == 64
        n_target = sum(x != IGNORE_INDEX for x in f["labels"])
        if n_target <= 64:
            assert s["input_ids"][-n_target:] == f["input_ids"][-n_target:]  # same target
            assert s["input_ids"][:-n_target] == f["input_ids"][-64:-n_target]  # prompt's end
            assert tok.decode(s["labels"][-n_target:-1]) == target
    tiny = tokenize_pairs(tok, [("Text: a\nLabel:", " " + "hate " * 40)], max_length=16)[0]
    assert len(tiny["input_ids"]) == 16
    assert tiny["labels"] == tiny["input_ids"]  # only target left, cut on the right
    assert tok.eos_token_id not in tiny["input_ids"]


def test_boundary_merge_is_kept_in_target() -> None:
    tok = gpt2_style()
    # "ha" + "te": the full text tokenises "hate" as one token across the boundary.
    item = tokenize_pairs(tok, [("Label: ha", "te")], max_length=32)[0]
    unmasked = [x for x in item["labels"] if x != IGNORE_INDEX][:-1]
    assert tok.decode(unmasked).endswith("te")
    assert tok.decode(item["input_ids"][:-1]) == "Label: hate"


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_make_batches_padding_and_shuffle(kind: str) -> None:
    tok = TOKENIZERS[kind]()
    assert tok.pad_token_id is None
    pad = pad_token_id(tok)
    assert pad == tok.eos_token_id
    items = tokenize_pairs(tok, _pairs(), max_length=256)
    batches = make_batches(items, batch_size=5, seed=None, pad_id=pad)
    assert [b["input_ids"].shape[0] for b in batches] == [5, 5, 2]
    for b, start in zip(batches, (0, 5, 10), strict=True):
        assert b["input_ids"].dtype == torch.long
        assert b["input_ids"].shape == b["labels"].shape == b["attention_mask"].shape
        for row in range(b["input_ids"].shape[0]):
            item = items[start + row]
            n = len(item["input_ids"])
            assert b["input_ids"][row, :n].tolist() == item["input_ids"]
            assert b["labels"][row, :n].tolist() == item["labels"]
            assert b["attention_mask"][row].tolist() == [1] * n + [0] * (
                b["input_ids"].shape[1] - n
            )
            assert (b["input_ids"][row, n:] == pad).all()
            assert (b["labels"][row, n:] == IGNORE_INDEX).all()
    index = {tuple(x["input_ids"]): i for i, x in enumerate(items)}
    assert len(index) == len(items)

    def order(bs: list[dict[str, torch.Tensor]]) -> list[int]:
        return [
            index[tuple(ids[mask == 1].tolist())]
            for b in bs
            for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
        ]

    one = order(make_batches(items, batch_size=4, seed=3, pad_id=None))
    assert sorted(one) == list(range(len(items)))
    assert one != list(range(len(items)))
    assert one == order(make_batches(items, batch_size=4, seed=3, pad_id=None))
    assert one != order(make_batches(items, batch_size=4, seed=4, pad_id=None))
    assert (make_batches(items[:2], 2, None, None)[0]["input_ids"] == 0).any()
