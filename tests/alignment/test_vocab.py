"""MinED vocabulary mapping (FedMKT Appendix B): exactness, markers, cache."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from fedkt.alignment import (
    brute_force_mapping,
    detect_scheme,
    introspect,
    mined,
    mined_mapping,
    normalize_vocab,
    space_marker,
    vocab_hash,
    vocab_mapping,
)
from fedkt.alignment import vocab as V

CORPUS = [
    "we utilize the dynamic programming approach to align tokens",
    "the quick brown fox jumps over the lazy dog",
    "federated knowledge transfer between large and small language models",
    "a tokenizer splits text into pieces; pieces become ids",
] * 5


# --------------------------------------------------------------------------- builders


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]", "[CLS]",
                                                                         "[SEP]"],
                                        show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


# --------------------------------------------------------------------------- exactness


def _random_case(rng: random.Random) -> tuple[list[str], list[str]]:
    alphabet = rng.choice(["ab", "abc", "abcd ", "xyzé漢", "a b\n"])

    def word() -> str:
        n = rng.choice([0, 1, 1, 2, 3, 4, 5, 6, 8, 12])
        return "".join(rng.choice(alphabet) for _ in range(n))

    src = [word() for _ in range(rng.randint(1, 50))]
    tgt = [word() for _ in range(rng.randint(1, 50))]
    return src, tgt


def test_mined_equals_brute_force_on_random_sets():
    rng = random.Random(1234)
    for _ in range(60):  # plus the property tests below
        src, tgt = _random_case(rng)
        assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcé ", max_size=7), min_size=1, max_size=25),
       st.lists(st.text(alphabet="abcé ", max_size=7), min_size=1, max_size=25))
def test_mined_equals_brute_force_property(src, tgt):
    assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab\u4e00\u4e01\u00e9x", max_size=7), min_size=1, max_size=30),
       st.lists(st.text(alphabet="ab ", max_size=7), min_size=1, max_size=25))
def test_foreign_characters_fold_without_changing_the_answer(src, tgt):
    # Source characters absent from every target (CJK, 'é', 'x' here) are folded into one
    # sentinel before the search: the answers stay the brute force's.
    assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


def test_foreign_only_tokens_map_to_the_smallest_target_no_longer():
    # A query none of whose characters occur in the targets is at distance
    # max(len(q), len(t)) from every t: the lexicographically smallest t with len <= len(q).
    tgt = ["zz", "c", "abc", "ba", "d"]
    assert mined_mapping(["\u4e00\u4e01", "\u4e00"], tgt).tolist() == [3, 1] == (
        brute_force_mapping(["\u4e00\u4e01", "\u4e00"], tgt).tolist())


def test_ties_go_to_lexicographically_smallest_then_smallest_id():
    # 'ab' is at distance 1 from 'bb', 'aa', 'ac'; smallest string is 'aa'.
    assert mined_mapping(["ab"], ["bb", "ac", "aa"]).tolist() == [2]
    # Duplicate target strings: the smaller id wins.
    assert mined_mapping(["x"], ["y", "q", "q"]).tolist() == [1]
    # Empty and one-character tokens.
    src, tgt = ["", "a", "zz"], ["bcd", "e", ""]
    assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist() == [2, 2, 2]


def test_long_tokens_take_the_bucket_path():
    rng = random.Random(7)
    tgt = ["".join(rng.choice("ab-") for _ in range(rng.randint(30, 60))) for _ in range(80)]
    src = ["".join(rng.choice("ab-") for _ in range(rng.randint(41, 70))) for _ in range(30)]
    src += [t[:-1] for t in tgt[:10]] + [t + "x" for t in tgt[10:20]]
    assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


def _scan(src: list[str], tgt: list[str]) -> list[int]:
    """The exhaustive path alone (``mined._bucket_scan``) on every query, as target ids."""
    order = sorted(range(len(tgt)), key=lambda j: (tgt[j], j))
    uniq, uid = [], []
    for j in order:
        if not uniq or tgt[j] != uniq[-1]:
            uniq.append(tgt[j])
            uid.append(j)
    ranks = mined._bucket_scan(list(src), uniq, np.array([len(t) for t in uniq]), workers=1)
    return [uid[r] for r in ranks]


def test_bucket_scan_equals_brute_force_on_edge_cases():
    # The bucket scan's bounds (length gap, the buckets' character envelopes, the first
    # ranks as a starting best) and its target folding, against the definition.
    cases = [
        (["", "a", "abc"], ["", "b", "xyz"]),  # empty query and target
        (["abcdef", "zzzzzz"], ["uvw", "ab", "abcxyz", "fedcba"]),  # distance 3+
        (["abc"], ["xyz", "\u00fc", "\u00e9", "pqr"]),  # all at 3; ties by string
        (["abc"], ["\u00fc", "\u00e9"]),  # targets that fold to one stand-in: 'é' wins
        (["\u4e00\u4e01\u4e02", "a\u4e00"], ["\u4e00x", "b", "ab", "\u4e01\u4e00"]),
        (["\U0001f600\U0001f601ab", "\u0301e"], ["\U0001f601", "e\u0301", "ab", ""]),
        (["aaaa", "aaab"], ["bbbb", "bbba", "abbb", "a"]),  # repeats: envelope counts
        (["hello"], ["help", "help", "hell", "yellow", "hel"]),  # duplicates: smaller id
    ]
    for src, tgt in cases:
        assert _scan(src, tgt) == brute_force_mapping(src, tgt).tolist(), (src, tgt)
        assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


def test_distance_three_and_more_queries_equal_brute_force(monkeypatch):
    # Queries with no target within distance 2 take the bucket scan inside mined_mapping:
    # targets from one half of the alphabet, queries mostly from the other.
    rng = random.Random(11)
    tgt = ["".join(rng.choice("abcde ") for _ in range(rng.randint(0, 9))) for _ in range(300)]
    src = ["".join(rng.choice("fghij\u4e00ab ") for _ in range(rng.randint(3, 14)))
           for _ in range(400)]
    ref = brute_force_mapping(src, tgt)
    far = [i for i, j in enumerate(ref) if mined.Levenshtein.distance(src[i], tgt[j]) >= 3]
    src, ref = [src[i] for i in far], ref[far]
    dist = [mined.Levenshtein.distance(q, tgt[j]) for q, j in zip(src, ref, strict=True)]
    assert len(src) >= 200 and max(dist) >= 8  # the cases this test is about
    assert mined_mapping(src, tgt).tolist() == ref.tolist()
    assert _scan(src, tgt) == ref.tolist()

    # One thread and two (the joins' families and the scan's lengths side by side) agree.
    assert mined_mapping(src, tgt, workers=1).tolist() == ref.tolist()
    seen = []
    original = mined._threaded
    monkeypatch.setattr(mined, "_threaded", lambda fn, items, workers: seen.append(len(items))
                        or original(fn, items, workers))
    assert mined_mapping(src, tgt, workers=2).tolist() == ref.tolist()
    assert max(seen) >= 6  # the scan split its query lengths over the threads


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(alphabet="ab\u00e9\u4e00 ", max_size=9), min_size=1, max_size=20),
       st.lists(st.text(alphabet="abc\u00e9 ", max_size=9), min_size=1, max_size=30))
def test_bucket_scan_equals_brute_force_property(src, tgt):
    assert _scan(src, tgt) == brute_force_mapping(src, tgt).tolist()


def test_hash_collisions_are_caught(monkeypatch):
    """With a deliberately terrible hash every join is full of false pairs; still exact."""
    original = mined._Families._hash

    def weak(codes, keep):
        return original(codes, keep) % np.uint64(5)

    monkeypatch.setattr(mined._Families, "_hash", staticmethod(weak))
    rng = random.Random(99)
    for _ in range(40):
        src, tgt = _random_case(rng)
        assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


# --------------------------------------------------------------------------- markers


def test_space_marker_byte_level():
    tok = byte_level_tokenizer()
    assert detect_scheme(tok).kind == "byte_level"
    assert space_marker(tok) == "Ġ"
    assert introspect._scheme_from_probe(tok) == detect_scheme(tok)


def test_space_marker_metaspace():
    tok = metaspace_tokenizer()
    assert detect_scheme(tok).kind == "metaspace"
    assert space_marker(tok) == "▁"
    assert introspect._scheme_from_probe(tok) == detect_scheme(tok)


def test_space_marker_wordpiece():
    tok = wordpiece_tokenizer()
    assert detect_scheme(tok).kind == "wordpiece"
    assert space_marker(tok) == "##"
    assert introspect._scheme_from_probe(tok) == detect_scheme(tok)


def test_marker_is_read_from_the_tokenizer_not_its_class():
    """A metaspace tokenizer with a custom replacement character is read correctly."""
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "§the": 1, "§cat": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="§")
    tok.decoder = decoders.Metaspace(replacement="§")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    assert space_marker(hf) == "§"
    assert normalize_vocab(hf)[1] == " the"


def test_normalisation_unifies_markers():
    bl, ms, wp = byte_level_tokenizer(), metaspace_tokenizer(), wordpiece_tokenizer()
    bl_norm, ms_norm, wp_norm = normalize_vocab(bl), normalize_vocab(ms), normalize_vocab(wp)
    assert bl_norm[bl.convert_tokens_to_ids("Ġthe")] == " the"
    assert ms_norm[ms.convert_tokens_to_ids("▁the")] == " the"
    assert wp_norm[wp.convert_tokens_to_ids("the")] == " the"
    # Special tokens keep their text; no marker stays behind.
    assert bl_norm[bl.convert_tokens_to_ids("<|endoftext|>")] == "<|endoftext|>"
    assert not any("Ġ" in s for s in bl_norm)
    assert not any("▁" in s for s in ms_norm)
    assert not any(s.startswith("##") for s in wp_norm)
    # The mapping sends ' the' to ' the' across schemes.
    mapping = vocab_mapping(bl, ms, cache=False)
    assert mapping[bl.convert_tokens_to_ids("Ġthe")] == ms.convert_tokens_to_ids("▁the")


# --------------------------------------------------------------------------- cache


def test_vocab_mapping_is_cached_by_contents(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path))
    src, tgt = byte_level_tokenizer(), metaspace_tokenizer()
    first = vocab_mapping(src, tgt)
    assert first.dtype == np.int64 and first.shape == (len(src),)
    assert len(list((tmp_path / "vocab_mapping").glob("*.npy"))) == 1

    def boom(*a, **k):
        raise AssertionError("cache miss")

    monkeypatch.setattr(V, "mined_mapping", boom)
    # A different object with the same vocabulary hits the cache.
    again = vocab_mapping(byte_level_tokenizer(), metaspace_tokenizer())
    assert again.tolist() == first.tolist()
    assert vocab_hash(src) == vocab_hash(byte_level_tokenizer())
    assert vocab_hash(src) != vocab_hash(tgt)
    with pytest.raises(AssertionError, match="cache miss"):
        vocab_mapping(src, tgt, cache=False)


# --------------------------------------------------------------------------- real vocabularies


def _real(name: str):
    pytest.importorskip("gguf")
    from fedkt.config import ModelConfig
    from fedkt.models.causal_lm import load_tokenizer
    from fedkt.models.offline import ModelNotInstalled

    try:
        return load_tokenizer(ModelConfig(name=name))
    except ModelNotInstalled as exc:  # names `fedkt models install NAME`  # package not installed
        pytest.skip(str(exc))


def test_real_vocabulary_slice_matches_brute_force():
    gpt2, llama3 = _real("gpt2-tokenizer"), _real("llama3-tokenizer")
    assert detect_scheme(gpt2).kind == detect_scheme(llama3).kind == "byte_level"
    g, ll = normalize_vocab(gpt2), normalize_vocab(llama3)
    assert g[gpt2.convert_tokens_to_ids("Ġthe")] == " the"
    rng = np.random.default_rng(0)
    src = [g[i] for i in rng.choice(len(g), 200, replace=False)]
    tgt = [ll[i] for i in rng.choice(len(ll), 3000, replace=False)]
    assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()


@pytest.mark.slow
def test_real_full_mapping_agrees_with_brute_force_on_a_sample():
    gpt2, llama3 = _real("gpt2-tokenizer"), _real("llama3-tokenizer")
    mapping = vocab_mapping(llama3, gpt2, cache=False)
    ll, g = normalize_vocab(llama3), normalize_vocab(gpt2)
    # Text tokens only, against GPT-2's text tokens (special tokens map by role).
    skip_src, skip_tgt = introspect.special_ids(llama3), introspect.special_ids(gpt2)
    text = np.array([i for i in range(len(ll)) if i not in skip_src])
    idx = np.random.default_rng(1).choice(text, 60, replace=False)
    keep = np.array([j for j in range(len(g)) if j not in skip_tgt])
    ref = keep[brute_force_mapping([ll[i] for i in idx], [g[j] for j in keep])]
    assert mapping[idx].tolist() == ref.tolist()
