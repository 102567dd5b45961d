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


def test_deletion_hashes_equal_the_hashes_of_the_shortened_strings():
    # The prefix-sum hash of a string with r positions deleted is the hash of the
    # shortened string itself (its p0 key), for every r <= 3 and every position set.
    rng = random.Random(3)
    for length in range(0, 8):
        words = [_word(rng, "ab\u00e9\U0001f600", length, length) for _ in range(5)]
        fam = mined._Families(words, np.arange(len(words)))
        for r in range(0, min(length, 3) + 1):
            got = mined._Families._hash(fam._by_len[length][1], mined._combinations(length, r))
            for c, dropped in enumerate(itertools.combinations(range(length), r)):
                short = ["".join(ch for i, ch in enumerate(w) if i not in dropped)
                         for w in words]
                ref = mined._Families(short, np.arange(len(short)))
                want = mined._Families._hash(ref._by_len[length - r][1],
                                            mined._combinations(length - r, 0))
                assert got[:, c].tolist() == want[:, 0].tolist()


def _pairs(queries: list[str], targets: list[str], d: int) -> set[tuple[int, int]]:
    """Every (query, target) pair that the joins of distance d yield (raw keys)."""
    qfam = mined._Families(queries, np.arange(len(queries)))
    tfam = mined._Families(targets, np.arange(len(targets)))
    out = set()
    for qf, tf in mined._JOINS[d]:
        by_key: dict[int, list[int]] = {}
        for k, o in zip(*(a.tolist() for a in tfam.keys(tf)), strict=True):
            by_key.setdefault(k, []).append(o)
        for k, o in zip(*(a.tolist() for a in qfam.keys(qf)), strict=True):
            out.update((o, t) for t in by_key.get(k, ()))
    return out


@pytest.mark.parametrize("d", [1, 2, 3])
def test_joins_yield_exactly_the_pairs_within_their_distance(d):
    # Each join family pairs strings within d, and every pair at distance d is paired
    # (closer pairs are found at their own distance first).
    rng = random.Random(d)
    words = sorted({_word(rng, "abc", 0, 7) for _ in range(160)})
    dist = mined.process.cdist(words, words, scorer=mined.Levenshtein.distance)
    got = _pairs(words, words, d)
    assert all(dist[q, t] <= d for q, t in got)
    exact = {(q, t) for q, t in zip(*np.nonzero(dist == d), strict=True)}
    assert exact <= got and len(exact) > 300


def _edit(rng: random.Random, s: str, n: int, alphabet: str) -> str:
    for _ in range(n):
        op, i = rng.randrange(3), rng.randint(0, len(s))
        if op == 0 and s:
            s = s[:i] + s[i + 1:]
        elif op == 1 or not s:
            s = s[:i] + rng.choice(alphabet) + s[i:]
        else:
            s = s[:max(0, i - 1)] + rng.choice(alphabet) + s[max(0, i - 1) + 1:]
    return s


def test_distance_three_answers_and_ties_equal_brute_force(monkeypatch):
    # Queries three edits away from targets: most answers at exactly distance 3, often
    # with ties (several targets derived from one word), all found by the distance-3 join.
    rng = random.Random(33)
    seeds = [_word(rng, "abcdef", 5, 11) for _ in range(60)]
    tgt = [_edit(rng, s, rng.randint(1, 3), "abcdefg") for s in seeds for _ in range(4)]
    src = [_edit(rng, s, 3, "abcdefgh") for s in seeds for _ in range(3)]
    src += [s + "hhh" for s in seeds[:10]] + ["hhhhhhhh", "ghghgh"]  # 4 and more
    tgt.append("h")  # every query character occurs in a target: nothing is folded
    scanned: list[str] = []
    scan = mined._bucket_scan

    def spy(queries, *args, **kw):
        scanned.extend(queries)
        return scan(queries, *args, **kw)

    monkeypatch.setattr(mined, "_bucket_scan", spy)
    ref = brute_force_mapping(src, tgt).tolist()
    assert mined_mapping(src, tgt).tolist() == ref
    dist = [mined.Levenshtein.distance(q, tgt[j]) for q, j in zip(src, ref, strict=True)]
    ties = sum(sum(mined.Levenshtein.distance(q, t) == 3 for t in tgt) > 1
               for q, d in zip(src, dist, strict=True) if d == 3)
    assert dist.count(3) >= 40 and ties >= 20 and max(dist) >= 4  # the cases tested
    assert not {q for q, d in zip(src, dist, strict=True) if d <= 3} & set(scanned)
    assert {q for q, d in zip(src, dist, strict=True) if d > 3} <= set(scanned)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(alphabet="abcd", min_size=3, max_size=9), min_size=1, max_size=15),
       st.lists(st.text(alphabet="abce", min_size=0, max_size=9), min_size=1, max_size=30))
def test_mined_with_far_answers_property(src, tgt):
    # Alphabets that overlap in part: answers at distance 3 and 4 are common.
    assert mined_mapping(src, tgt).tolist() == brute_force_mapping(src, tgt).tolist()
