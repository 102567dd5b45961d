"""Sequence alignment (FedMKT Appendix B): the paper's example, next-token shift, cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from fedkt.alignment import (
    TopKLogits,
    align_corpus,
    align_sequences,
    brute_force_mapping,
    clear_alignment_cache,
    normalize_vocab,
    project_topk,
    reference_dp_alignment,
    special_ids,
    special_token_mapping,
    vocab_mapping,
)
from fedkt.alignment import sequence as S

EXAMPLE = "we utilize the dynamic programming approach to align tokens"
WORDS = EXAMPLE.split()

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Federated knowledge transfer: a server's LLM and clients' SLMs learn together!",
    "we utilize the dynamic programming approach to align tokens",
    "Numbers like 12345 and symbols #@$ appear, too.\n\nNew paragraph here.",
] * 4


def llm_tokenizer() -> PreTrainedTokenizerFast:
    """WordPiece that splits 'utilize' into 'util' + '##ize' (the paper's LLM side)."""
    vocab = {"[UNK]": 0}
    for w in WORDS:
        if w != "utilize":
            vocab[w] = len(vocab)
    vocab["util"] = len(vocab)
    vocab["##ize"] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def slm_tokenizer() -> PreTrainedTokenizerFast:
    """Metaspace word-level vocabulary that has 'utilize' whole (the paper's SLM side)."""
    vocab = {"<unk>": 0, "<s>": 1}
    for w in WORDS:
        vocab["▁" + w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


def byte_level_bpe(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def lowercase_wordpiece() -> PreTrainedTokenizerFast:
    from tokenizers import normalizers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"],
                                        show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


# --------------------------------------------------------------------------- Appendix B


def test_paper_example_util_ize_vs_utilize():
    llm, slm = llm_tokenizer(), slm_tokenizer()
    src = llm(EXAMPLE)["input_ids"]
    tgt = slm(EXAMPLE)["input_ids"]
    assert llm.convert_ids_to_tokens(src)[:3] == ["we", "util", "##ize"]
    assert slm.convert_ids_to_tokens(tgt)[:3] == ["<s>", "▁we", "▁utilize"]
    a = align_sequences(src, tgt, llm, slm)
    # Many-to-1: 'util' and 'ize' both align to 'utilize' (target position 2).
    assert a.src_to_tgt.tolist() == [1, 2, 2, 3, 4, 5, 6, 7, 8, 9]
    # Every other token is 1-to-1; 'utilize' points back at 'util'; <s> has no partner.
    assert a.tgt_to_src.tolist() == [-1, 0, 1, 3, 4, 5, 6, 7, 8, 9]
    # Logits: the target's position j predicts token j+1.  <s> predicts 'we' (no source
    # position predicts the first token), 'we' predicts 'utilize' <- source 'we' predicts
    # 'util' (same start), 'utilize' predicts 'the' <- source '##ize' predicts 'the'.
    assert a.logit_map.tolist() == [-1, 0, 2, 3, 4, 5, 6, 7, 8, -1]
    # Reverse direction: source 'util' predicts 'ize', where no target token starts.
    assert a.logit_map_reverse.tolist() == [1, -1, 2, 3, 4, 5, 6, 7, 8, -1]
    assert a.reversed().logit_map.tolist() == a.logit_map_reverse.tolist()
    # Many-to-1 goes through the MinED table: the source logits at 'we' (predicting
    # 'util') are used for the target's 'we' (predicting 'utilize'), their ids mapped by
    # MinED.  In this tiny vocabulary ' util' is at distance 3 from both ' the' and
    # ' utilize', and the tie goes to the lexicographically smaller ' the'.
    nl, ns = normalize_vocab(llm), normalize_vocab(slm)
    mapping = vocab_mapping(llm, slm, cache=False)
    util = llm.convert_tokens_to_ids("util")
    # Text tokens: MinED among the target's text tokens; special tokens map by role.
    specials = special_token_mapping(llm, slm)
    assert specials[llm.unk_token_id] == slm.unk_token_id
    text = [i for i in range(len(nl)) if i not in specials]
    keep = [j for j in range(len(ns)) if j not in special_ids(slm)]
    ref = brute_force_mapping([nl[i] for i in text], [ns[j] for j in keep])
    assert mapping[text].tolist() == [keep[r] for r in ref]
    assert ns[mapping[util]] == " the"
    k = 2
    values = torch.zeros(1, len(src), k, dtype=torch.float16)
    values[0, :, 0] = 5.0
    indices = torch.zeros(1, len(src), k, dtype=torch.int32)
    indices[0, :-1, 0] = torch.tensor(src[1:], dtype=torch.int32)  # teacher predicts the truth
    top = TopKLogits(torch.tensor([7]), values, indices, torch.tensor([len(src)], dtype=torch.int32),
                     len(llm), torch.tensor([0.5]))
    proj, mask = project_topk(top, mapping, [a], tgt_vocab_size=len(slm))
    assert mask[0].tolist() == [False, True, True, True, True, True, True, True, True, False]
    assert int(proj.indices[0, 1, 0]) == mapping[util]  # 'we' -> next is 'util'/'utilize'
    assert int(proj.indices[0, 2, 0]) == slm.convert_tokens_to_ids("▁the")  # 'utilize' -> 'the'
    # The slow token-level DP agrees on the paper's example ('utilize' <- 'util').
    ref = reference_dp_alignment([nl[i] for i in src], [ns[i] for i in tgt[1:]])
    assert ref.tolist()[:2] == [0, 1]


def _starts(ids, tok) -> list[int]:
    """Start offset (whitespace removed) of each token, from its own surface bytes."""
    pieces = [S._layout(tok).stripped[i] for i in ids]
    out, pos = [], 0
    for p in pieces:
        out.append(pos)
        pos += len(p)
    return out


@pytest.mark.parametrize("text", CORPUS[:4])
def test_next_token_shift(text):
    """logit_map[j] = i  =>  source token i+1 starts where target token j+1 starts."""
    src_tok, tgt_tok = byte_level_bpe(300), byte_level_bpe(420)
    src = src_tok(text)["input_ids"]
    tgt = tgt_tok(text)["input_ids"]
    assert src != tgt  # the two vocabularies really tokenize differently
    a = align_sequences(src, tgt, src_tok, tgt_tok)
    s_start, t_start = _starts(src, src_tok), _starts(tgt, tgt_tok)
    linked = 0
    for j, i in enumerate(a.logit_map.tolist()):
        if i >= 0:
            linked += 1
            assert s_start[i + 1] == t_start[j + 1]
            # Same kind of token (text vs whitespace-only) on both sides.
            assert (S._layout(src_tok).nws[src[i + 1]] > 0) == (
                S._layout(tgt_tok).nws[tgt[j + 1]] > 0)
        elif j + 1 < len(tgt) and S._layout(tgt_tok).nws[tgt[j + 1]] > 0:
            assert t_start[j + 1] not in s_start  # nothing to link to
    assert a.logit_map[-1] == -1  # the last position predicts past the end
    assert linked >= len(tgt) // 2


def test_different_spellings_use_the_character_dp():
    """Lower-casing WordPiece vs byte-level BPE: texts differ, the DP fallback links them."""
    src_tok, tgt_tok = byte_level_bpe(400), lowercase_wordpiece()
    text = CORPUS[1]
    src, tgt = src_tok(text)["input_ids"], tgt_tok(text)["input_ids"]
    a = align_sequences(src, tgt, src_tok, tgt_tok)
    assert a.coverage() > 0.5
    s_words = [src_tok.decode([i]).strip().lower() for i in src]
    t_words = [tgt_tok.convert_ids_to_tokens(i).removeprefix("##") for i in tgt]
    for j, i in enumerate(a.tgt_to_src.tolist()):
        assert i >= 0
        # The linked source token shares the target token's first character.
        assert s_words[i] and t_words[j] and (t_words[j][0] in s_words[i])


def test_bad_ids_are_rejected():
    tok = byte_level_bpe(300)
    with pytest.raises(ValueError, match="outside"):
        align_sequences([0, 10**6], [0], tok, tok)
    with pytest.raises(ValueError, match="1-D"):
        align_sequences([[0, 1]], [0], tok, tok)


def test_identical_tokenizers_align_diagonally():
    tok = byte_level_bpe(350)
    ids = tok(CORPUS[3])["input_ids"]
    a = align_sequences(ids, ids, tok, tok)
    n = len(ids)
    assert a.src_to_tgt.tolist() == list(range(n))
    assert a.logit_map.tolist() == list(range(n - 1)) + [-1]


# --------------------------------------------------------------------------- corpus + cache


def test_align_corpus_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path))
    clear_alignment_cache()
    src_tok, tgt_tok = byte_level_bpe(300), byte_level_bpe(420)
    first = align_corpus(CORPUS, src_tok, tgt_tok)
    assert len(first) == len(CORPUS)
    assert all(x.logit_map.dtype == np.int32 for x in first)
    assert len(list((tmp_path / "alignments").glob("*.npz"))) == 1

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(S, "_align_ids", boom)
    again = align_corpus(CORPUS, src_tok, tgt_tok)  # memory
    clear_alignment_cache()
    from_disk = align_corpus(CORPUS, src_tok, tgt_tok)  # disk
    for a, b, c in zip(first, again, from_disk, strict=True):
        for f in ("src_to_tgt", "tgt_to_src", "logit_map", "logit_map_reverse"):
            assert getattr(a, f).tolist() == getattr(b, f).tolist() == getattr(c, f).tolist()
    with pytest.raises(AssertionError, match="recomputed"):
        align_corpus(CORPUS[:2], src_tok, tgt_tok, cache=False)
    clear_alignment_cache()


# --------------------------------------------------------------------------- real tokenizers


def _real(name: str):
    pytest.importorskip("gguf")
    from fedkt.config import ModelConfig
    from fedkt.models.causal_lm import load_tokenizer
    from fedkt.models.offline import ModelNotInstalled

    try:
        return load_tokenizer(ModelConfig(name=name))
    except ModelNotInstalled as exc:  # names `fedkt models install NAME`
        pytest.skip(str(exc))


def test_real_gpt2_vs_llama3_alignment():
    gpt2, llama3 = _real("gpt2-tokenizer"), _real("llama3-tokenizer")
    text = ("FedMKT aligns tokens between heterogeneous tokenizers, e.g. GPT-2 and Llama-3; "
            "naïve café façade — 東京 2024!\n\n    indented code()")
    src, tgt = gpt2(text)["input_ids"], llama3(text)["input_ids"]
    a = align_sequences(src, tgt, gpt2, llama3)
    assert a.coverage() > 0.7
    s_start, t_start = _starts(src, gpt2), _starts(tgt, llama3)
    for j, i in enumerate(a.logit_map.tolist()):
        if i >= 0:
            assert s_start[i + 1] == t_start[j + 1]
