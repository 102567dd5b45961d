"""MinED's bucket scan with length buckets split into envelope groups: exact on
adversarial vocabularies (ties across groups, anagrams, repeats, foreign characters,
long strings, distances of 3 and more)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedkt.alignment import brute_force_mapping, mined, mined_mapping
from tests.alignment.test_vocab import _scan


def _word(rng: random.Random, alphabet: str, lo: int, hi: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


@pytest.mark.parametrize("group", [1, 2, 3, 7, 128])
def test_grouped_scan_equals_brute_force(monkeypatch, group):
    # Small groups split each length bucket into many envelopes; the targets share few
    # characters with most queries, so distances of 3 and more are common.
    monkeypatch.setattr(mined, "_GROUP", group)
    rng = random.Random(group)
    tgt = [_word(rng, "abcdeé", 0, 10) for _ in range(250)]
    tgt += ["".join(rng.sample(t, len(t))) for t in tgt[:60]]  # anagrams: one group, ties
    tgt += [t * 2 for t in tgt[60:70]]  # repeated halves
    src = [_word(rng, "aabfgh\u4e00é ", 2, 14) for _ in range(150)]
    src += ["".join(rng.sample(t, len(t))) + "x" for t in tgt[:40]]
    ref = brute_force_mapping(src, tgt).tolist()
    dist = [mined.Levenshtein.distance(q, tgt[j]) for q, j in zip(src, ref, strict=True)]
    assert sum(d >= 3 for d in dist) >= 50  # the cases this test is about
    assert _scan(src, tgt) == ref
    assert mined_mapping(src, tgt).tolist() == ref


@pytest.mark.parametrize("group", [1, 2, 5])
def test_ties_across_groups_go_to_the_smallest_string(monkeypatch, group):
    # Every target is at the same distance from the query; the groups are ordered by
    # sorted characters, not by rank, so a later group holds the smaller string.
    monkeypatch.setattr(mined, "_GROUP", group)
    tgt = ["zzzz", "yyyy", "xxxx", "cbaz", "zabc", "wwww", "bazc", "aaaa", "qqqq"]
    src = ["mmmm", "abcm", "aamm", "zzmm", "\u4e00\u4e01\u4e02\u4e03"]
    ref = brute_force_mapping(src, tgt).tolist()
    assert _scan(src, tgt) == ref
    assert mined_mapping(src, tgt).tolist() == ref


@pytest.mark.parametrize("group", [2, 16])
def test_long_strings_and_repeats_in_groups(monkeypatch, group):
    monkeypatch.setattr(mined, "_GROUP", group)
    rng = random.Random(5)
    tgt = [_word(rng, "aab", 20, 50) for _ in range(60)] + ["a" * n for n in range(1, 60, 3)]
    src = [_word(rng, "abbc", 30, 70) for _ in range(25)] + ["b" * 45, "a" * 44 + "c" * 3]
    ref = brute_force_mapping(src, tgt).tolist()
    assert _scan(src, tgt) == ref
    assert mined_mapping(src, tgt).tolist() == ref


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(alphabet="aab\u00e9\u4e00 ", min_size=3, max_size=10),
                min_size=1, max_size=20),
       st.lists(st.text(alphabet="abc\u00e9", max_size=10), min_size=1, max_size=40),
       st.integers(1, 4))
def test_grouped_scan_property(src, tgt, group):
    old = mined._GROUP
    mined._GROUP = group
    try:
        assert _scan(src, tgt) == brute_force_mapping(src, tgt).tolist()
    finally:
        mined._GROUP = old


def test_fold_foreign_keeps_target_characters():
    folded = mined._fold_foreign(["ab\u4e00", "\u4e01x", "", "ba"], {"a", "b"}, "\ue000")
    assert folded == ["ab\ue000", "\ue000\ue000", "", "ba"]
    assert mined._sentinel(["a\ue000", "b"]) == "\ue001"


def test_keep_lists_the_remaining_positions():
    for length in range(1, 7):
        one = mined._keep(np.arange(length)[:, None], length)
        assert one.tolist() == [[p for p in range(length) if p != x] for x in range(length)]
        if length >= 2:
            pairs = np.stack(np.triu_indices(length, 1), axis=1)
            assert pairs.tolist() == [list(p) for p in itertools.combinations(range(length), 2)]
            assert mined._keep(pairs, length).tolist() == [
                [p for p in range(length) if p not in (x, y)] for x, y in pairs.tolist()]
