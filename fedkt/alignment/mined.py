"""The MinED engine: each source string's nearest target string by edit distance.

FedMKT (Fan et al.), Sec. 3.2 "Bidirectional Token Alignment" and Appendix B: every
source token is mapped to the target token with the smallest edit distance.  Here the
definition is made exact: Levenshtein distance over the characters of the *normalised*
token strings, ties broken to the lexicographically smallest target string (then the
smallest target id).  :func:`brute_force_mapping` is that definition written out with
one edit-distance call per pair; :func:`mined_mapping` returns the identical result,
quickly, through

1. an exact-match dictionary;
2. distance-1, distance-2 and distance-3 neighbourhoods found by hash joins over
   deletion variants with position tags (every pair such a join yields is at distance
   <= d, and every pair at distance d is yielded), vectorised in numpy: the keys are
   hashed from prefix sums, and the smaller side of each join marks a table that the
   larger side's keys must hit before they are sorted;
3. for what remains (no target within 3), length buckets searched in order of growing
   length difference (|len(a) - len(b)| is a lower bound of the distance) with rapidfuzz
   ``cdist``, stopping once the best distance found is below the next bucket's gap; each
   bucket is split into groups of strings with similar characters, and a query skips a
   group whose character envelope bounds the distance above its best so far (every bound
   raised to the distance the joins ruled out).

The joins' families and the scan's query lengths are independent of each other: with
``workers`` > 1 they run on that many threads (rapidfuzz and numpy release the GIL).

Strings here are already normalised (:func:`fedkt.alignment.introspect.normalize_vocab`);
the vocabulary mapping between two tokenizers is :mod:`fedkt.alignment.vocab`.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

__all__ = ["brute_force_mapping", "mined_mapping"]

_MAX_JOIN_LEN = 40  # queries longer than this skip the hash joins (they are few; buckets are small)
_CDIST_CELLS = 1 << 24  # cap on one cdist result matrix (cells)
_SMALL_CDIST = 1 << 16  # smaller cdist calls run on one thread


def _threaded(fn: Callable, items: list, workers: int) -> list:
    """``[fn(x) for x in items]``, on ``workers`` threads when more than one: rapidfuzz
    and numpy's sorts and gathers release the GIL, and every item's work is independent."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


# --------------------------------------------------------------------------- reference


def brute_force_mapping(src_tokens: Sequence[str], tgt_tokens: Sequence[str]) -> np.ndarray:
    """The MinED definition, one edit-distance call per pair.

    For each source string: the target index minimising (distance, target string, index).
    """
    if len(tgt_tokens) == 0:
        raise ValueError("brute_force_mapping: the target vocabulary is empty")
    out = np.empty(len(src_tokens), dtype=np.int64)
    dist = Levenshtein.distance
    for i, s in enumerate(src_tokens):
        best: tuple[int, str, int] | None = None
        for j, t in enumerate(tgt_tokens):
            cand = (dist(s, t), t, j)
            if best is None or cand < best:
                best = cand
        out[i] = best[2]  # type: ignore[index]
    return out


# --------------------------------------------------------------------------- fast MinED

_M64 = (1 << 64) - 1
_BASE = 0x100000001B3
_BASE_INV = pow(_BASE, -1, 1 << 64)  # the base is odd, so invertible mod 2**64
_K_LEN = 0x9E3779B97F4A7C15
_K_POS = (0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)
_K_MIX = np.uint64(0xFF51AFD7ED558CCD)


def _u64(x: int) -> np.uint64:
    return np.uint64(x & _M64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (bijective): every input bit affects the high output bits."""
    x = x ^ (x >> np.uint64(30))
    x = x * _u64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * _u64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


# Join families: (deleted positions r, the tags of each key).  A tag is a tuple of
# (column of the sorted deleted positions, offset): its value is ``dropped[:, c] - off``.
# ``p<r>``: r characters deleted at any positions, untagged.  ``pos1``: one deletion
# tagged with its position (a substitution there).  ``sub<r>``: r deletions of which one
# is a substitution, tagged with its position once the other r - 1 are deleted (for
# sorted {x < y < z}: x, y - 1 or z - 2; one key each).  ``pp2``: two substitutions,
# tagged with both positions.  ``pp3``: one deletion and two substitutions, tagged with
# the two positions once the deletion is made ((y-1, z-1), (x, z-1) or (x, y)).
# ``ppp3``: three substitutions.
_FAMILIES: dict[str, tuple[int, tuple[tuple[tuple[int, int], ...], ...]]] = {
    "p0": (0, ((),)),
    "p1": (1, ((),)),
    "p2": (2, ((),)),
    "p3": (3, ((),)),
    "pos1": (1, (((0, 0),),)),
    "sub2": (2, (((0, 0),), ((1, 1),))),
    "pp2": (2, (((0, 0), (1, 0)),)),
    "sub3": (3, (((0, 0),), ((1, 1),), ((2, 2),))),
    "pp3": (3, (((1, 1), (2, 1)), ((0, 0), (2, 1)), ((0, 0), (1, 0)))),
    "ppp3": (3, (((0, 0), (1, 0), (2, 0)),)),
}


@functools.cache
def _combinations(length: int, r: int) -> np.ndarray:
    """All sorted r-subsets of range(length), [k, r], in lexicographic order (read-only)."""
    out = np.array(list(itertools.combinations(range(length), r)), dtype=np.int64)
    out = out.reshape(len(out), r)
    out.flags.writeable = False
    return out


class _Families:
    """Hashed deletion variants of a set of strings, grouped into join families.

    A family (see ``_FAMILIES``) holds, for each string, the hashes of the string with r
    characters deleted, possibly tagged with positions; keys include the variant length.
    Hashes come from each length's prefix sums (:meth:`_hash`), so a variant costs
    r + 1 differences, not its length.  :meth:`keys` returns one family's keys and
    owners (:func:`_pack` sorts them for :func:`_join`).
    """

    _ROWS_KEYS = 1 << 22  # keys hashed at once (strings x deletion sets)

    def __init__(self, strings: Sequence[str], owners: np.ndarray) -> None:
        lens = np.fromiter(map(len, map(strings.__getitem__, owners.tolist())), dtype=np.int64,
                           count=len(owners))
        self._by_len: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for length in np.unique(lens).tolist():
            idx = owners[lens == length]
            codes = _codes([strings[i] for i in idx.tolist()], length).astype(np.uint64)
            self._by_len[length] = (idx, self._prefix(codes + np.uint64(1)))

    @property
    def lengths(self) -> list[int]:
        return list(self._by_len)

    def count(self, name: str, lengths: set[int] | None = None) -> int:
        """How many keys :meth:`keys` yields for these lengths (all by default)."""
        r, tags = _FAMILIES[name]
        return sum(len(idx) * math.comb(n, r) * len(tags) for n, (idx, _) in self._by_len.items()
                   if lengths is None or n in lengths)

    def keys(self, name: str, lengths: set[int] | None = None,
             table: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(keys, owners) of one family for the strings of the given lengths (all by
        default); with ``table`` (:func:`_table`), only keys whose slot it marks."""
        r, tags = _FAMILIES[name]
        keys, owners = [], []
        for length, (idx, pre) in self._by_len.items():
            if lengths is not None and length not in lengths:
                continue
            dropped = _combinations(length, r)
            if not len(dropped):
                continue
            kept = _u64(_K_LEN * (length - r + 1))
            tag_keys = [self._tag(dropped, tag) for tag in tags]
            step = max(1, self._ROWS_KEYS // len(dropped))
            for s in range(0, len(idx), step):
                h = self._hash(pre[s:s + step], dropped) + kept  # [rows, sets]
                hm = h * _K_MIX if any(tags) else h
                for tag, tk in zip(tags, tag_keys, strict=True):
                    key = (hm + tk if tag else h).ravel()
                    if table is not None:
                        pos = _marked(table, key)
                        keys.append(key[pos])
                        owners.append(idx[s:s + step][pos // len(dropped)].astype(np.uint32))
                    else:
                        keys.append(key)
                        owners.append(np.repeat(idx[s:s + step].astype(np.uint32),
                                                len(dropped)))
        if not keys:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint32)
        return np.concatenate(keys), np.concatenate(owners)

    @staticmethod
    def _prefix(codes: np.ndarray) -> np.ndarray:
        """[n, L + 1] prefix sums of code * base**(L - 1 - position) (mod 2**64)."""
        n, length = codes.shape
        powers = np.uint64(_BASE) ** np.arange(length - 1, -1, -1, dtype=np.uint64)
        pre = np.zeros((n, length + 1), dtype=np.uint64)
        np.cumsum(codes * powers, axis=1, dtype=np.uint64, out=pre[:, 1:])
        return pre

    @staticmethod
    def _hash(pre: np.ndarray, dropped: np.ndarray) -> np.ndarray:
        """[rows, sets]: the polynomial hash (mod 2**64) of each row's string with the
        positions of each row of ``dropped`` (sorted) deleted, from its prefix sums.

        A kept character with k deletions after it moves k places down the polynomial:
        its segment's sum is multiplied by base**-k.  Summed over the segments, the j-th
        of r deleted positions x adds base**-(r-j+1) * pre[x] - base**-(r-j) * pre[x + 1].
        """
        length = pre.shape[1] - 1
        r = dropped.shape[1]
        h = pre[:, length:]
        for j in range(r):
            k = r - 1 - j  # deletions after the j-th
            g = (pre[:, :length] * _u64(pow(_BASE_INV, k + 1, 1 << 64))
                 - pre[:, 1:] * _u64(pow(_BASE_INV, k, 1 << 64)))
            h = h + g[:, dropped[:, j]]
        return h

    @staticmethod
    def _tag(dropped: np.ndarray, tag: tuple[tuple[int, int], ...]) -> np.ndarray:
        """[sets]: what a tag adds to the key ``hash * _K_MIX`` for each deletion set."""
        out = np.zeros(len(dropped), dtype=np.uint64)
        for (c, off), k in zip(tag, _K_POS, strict=False):
            out += (dropped[:, c] - off + 1).astype(np.uint64) * _u64(k)
        return out


_TABLE_BITS = 25  # the join pre-filter: at most a bitset of 2**25 slots (4 MiB, cache-friendly)


def _slot(keys: np.ndarray, bits: int) -> np.ndarray:
    """Each key's slot in a pre-filter of 2**bits slots: its top bits (as intp)."""
    return (keys >> np.uint64(64 - bits)).astype(np.intp)


def _table(keys: np.ndarray) -> np.ndarray:
    """A membership pre-filter: a bitset with the slots of ``keys`` set (false positives
    only); :func:`_marked` reads it.  2**25 slots from 2**16 keys on, as before; fewer
    keys (the tests' small vocabularies) get at least 128 slots a key instead of 4 MiB to
    clear and pack."""
    bits = min(_TABLE_BITS, max(6, int(len(keys)).bit_length() + 8))
    table = np.zeros(1 << bits, dtype=bool)
    table[_slot(keys, bits)] = True
    return np.packbits(table, bitorder="little")


def _marked(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Positions of the keys whose slot :func:`_table` set."""
    slot = _slot(keys, (len(table) * 8).bit_length() - 1)
    return np.flatnonzero((table[slot >> 3] >> (slot & 7).astype(np.uint8)) & 1)


def _pack(keys: np.ndarray, owners: np.ndarray, bits: int) -> np.ndarray:
    """Sorted ``(key high bits) | owner`` words (owner in the low bits)."""
    b = np.uint64(bits)
    return np.sort(((_mix(keys) >> b) << b) | owners.astype(np.uint64))


def _join(t_packed: np.ndarray, q_packed: np.ndarray, bits: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """For each query word with a key match: (query owner, smallest matching target owner).

    Both inputs are sorted ``key | owner`` words (:func:`_pack`), so within a run of equal
    keys the first target word carries the smallest owner, i.e. the lexicographically
    first target.
    """
    if len(t_packed) == 0 or len(q_packed) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    b = np.uint64(bits)
    mask = np.uint64((1 << bits) - 1)
    t_hi = t_packed >> b
    q_hi = q_packed >> b
    lo = np.searchsorted(t_hi, q_hi, "left")
    hit = lo < len(t_hi)
    hit[hit] = t_hi[lo[hit]] == q_hi[hit]
    q_owner = (q_packed[hit] & mask).astype(np.int64)
    return q_owner, (t_packed[lo[hit]] & mask).astype(np.int64)


def _join_families(tfam: _Families, tf: str, qfam: _Families, qf: str, bits: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_join` of query family ``qf`` with target family ``tf``, for the target
    lengths that can pair with the queries'.  The smaller side's keys are computed first
    and mark a :func:`_table`; the larger side keeps only the keys in a marked slot."""
    shift = _FAMILIES[tf][0] - _FAMILIES[qf][0]  # target length - query length
    lengths = {n + shift for n in qfam.lengths}
    if tfam.count(tf, lengths) <= qfam.count(qf):
        t = tfam.keys(tf, lengths)
        q = qfam.keys(qf, table=_table(t[0]))
    else:
        q = qfam.keys(qf)
        t = tfam.keys(tf, lengths, table=_table(q[0]))
    return _join(_pack(*t, bits), _pack(*q, bits), bits)


def _join_pair(tfam: _Families, qfam: _Families, bits: int, pair: tuple[str, str]
               ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_join_families` of one (query family, target family) pair of ``_JOINS``."""
    return _join_families(tfam, pair[1], qfam, pair[0], bits)


# For each distance d, the (query family, target family) joins whose pairs are exactly
# the pairs at distance <= d (for strings that are not closer): one join for each mix of
# deletions, insertions and substitutions that costs d (see ``_FAMILIES``).
_JOINS: dict[int, list[tuple[str, str]]] = {
    1: [("p1", "p0"), ("p0", "p1"), ("pos1", "pos1")],
    2: [("p2", "p0"), ("p0", "p2"), ("p1", "p1"), ("sub2", "pos1"), ("pos1", "sub2"),
        ("pp2", "pp2")],
    3: [("p3", "p0"), ("p0", "p3"), ("p2", "p1"), ("p1", "p2"), ("sub3", "pos1"),
        ("pos1", "sub3"), ("sub2", "sub2"), ("pp3", "pp2"), ("pp2", "pp3"), ("ppp3", "ppp3")],
}


def _scan_bucket(qarr: np.ndarray, active: np.ndarray, lb: np.ndarray, cols: np.ndarray,
                 tarr: np.ndarray, max_len: int, best_d: np.ndarray, best_t: np.ndarray,
                 workers: int) -> None:
    """Compare the active query rows with one length bucket (rank-sorted ``cols``);
    ``lb``: each active row's lower bound on its distance to this bucket."""
    dtype = np.uint8 if max_len < 255 else np.int32  # distance <= the longer length
    # Rows whose best distance equals their bound can only improve by a tie with a smaller
    # rank: restrict their columns to ranks below their current best, rounded up to a
    # power of two so that a bucket costs a few cdist calls, not one per row.
    limit = np.where(best_d[active] == lb, best_t[active], len(tarr))
    limit = np.minimum(1 << np.ceil(np.log2(np.maximum(limit, 1))).astype(np.int64), len(tarr))
    n_cols = np.searchsorted(cols, limit)  # rows with equal column counts share a call
    for k in np.unique(n_cols):
        if k == 0:
            continue
        rows = active[n_cols == k]
        cols_l = cols[:k]
        choices = tarr[cols_l].tolist()
        step = max(1, _CDIST_CELLS // len(cols_l))
        for s in range(0, len(rows), step):
            sub = rows[s:s + step]
            _improve(qarr[sub].tolist(), sub, choices, cols_l, dtype, max_len, best_d, best_t,
                     workers)


def _improve(queries: list[str], sub: np.ndarray, choices: list[str], ranks: np.ndarray,
             dtype: type, max_len: int, best_d: np.ndarray, best_t: np.ndarray,
             workers: int) -> None:
    """Lower ``best_d``/``best_t`` of rows ``sub`` by their distances to ``choices``."""
    cutoff = int(best_d[sub].max())
    # Short strings: rapidfuzz's SIMD path (no cutoff) is fastest.
    use_cutoff = max_len > 64 and cutoff < 1 << 30
    small = len(queries) * len(choices) < _SMALL_CDIST  # threads cost more than they save
    D = process.cdist(queries, choices, scorer=Levenshtein.distance, dtype=dtype,
                      workers=1 if small else workers,
                      score_cutoff=cutoff if use_cutoff else None)
    j = D.argmin(axis=1)  # first minimum = smallest rank among the choices
    d = D[np.arange(len(sub)), j].astype(np.int64)
    t = ranks[j]
    better = (d < best_d[sub]) | ((d == best_d[sub]) & (t < best_t[sub]))
    best_d[sub[better]] = d[better]
    best_t[sub[better]] = t[better]


def _fold_targets(queries: list[str], targets: list[str]) -> tuple[list[str], np.ndarray]:
    """Fewer targets, same answers: (the targets kept, folded; their ranks).

    Target characters that no query holds are interchangeable (each equals no query
    character), so they fold into one stand-in; targets that become equal then have equal
    distances to every query, and only the first (the smallest rank) is kept.  Qwen2.5's
    151,807 distinct strings are 113,939 against Gemma-3's remaining queries.
    """
    alphabet = set("".join(queries))
    stand_in = next(chr(c) for c in range(0xE000, 0x110000) if chr(c) not in alphabet)
    table = dict.fromkeys(map(ord, set("".join(targets)) - alphabet), stand_in)
    kept: dict[str, int] = {}
    for rank, folded in enumerate(t.translate(table) for t in targets):
        kept.setdefault(folded, rank)
    return list(kept), np.fromiter(kept.values(), dtype=np.int64, count=len(kept))


_FIRST_RANKS = 64  # targets every query is compared with first, for a starting bound


def _codes(strings: Sequence[str], length: int) -> np.ndarray:
    """Code points of equally long strings, [n, length] (uint32)."""
    if length == 0 or not strings:
        return np.zeros((len(strings), length), dtype=np.uint32)
    flat = "".join(strings).encode("utf-32-le", "surrogatepass")
    return np.frombuffer(flat, dtype=np.uint32).reshape(len(strings), length)


def _occurrences(codes: np.ndarray) -> np.ndarray:
    """For each character, how many times it occurred so far in its string (1, 2, ...)."""
    same = codes[:, :, None] == codes[:, None, :]  # [n, i, k]: char k equals char i
    return np.tril(same).sum(axis=2)


_GROUP = 128  # targets per envelope group (a length bucket's strings, by sorted characters)


def _groups(targets: list[str], tlens: np.ndarray, alphabet: np.ndarray
            ) -> dict[int, tuple[list[np.ndarray], np.ndarray]]:
    """Length buckets split into groups with their character envelopes.

    For each length m: the groups' target ranks (each group rank-sorted) and their
    envelopes, [group, character]: the most times any string of the group holds the
    character (``alphabet``: sorted code points; the last column, for other characters,
    stays 0).  Strings with the same sorted characters are grouped together, so a group's
    envelope is tight.
    """
    out: dict[int, tuple[list[np.ndarray], np.ndarray]] = {}
    for m in np.unique(tlens):
        m = int(m)
        idx = np.flatnonzero(tlens == m)
        bucket = [targets[i] for i in idx.tolist()]
        order = sorted(range(len(idx)), key=lambda i: sorted(bucket[i]))
        idx = idx[order]
        gid = np.arange(len(idx)) // _GROUP
        env = np.zeros((int(gid[-1]) + 1, len(alphabet) + 1), dtype=np.int16)
        for start in range(0, len(idx), 4096):
            codes = _codes([bucket[i] for i in order[start:start + 4096]], m)
            if codes.size:
                col = np.searchsorted(alphabet, codes)
                g = np.broadcast_to(gid[start:start + 4096, None], col.shape)
                np.maximum.at(env, (g.ravel(), col.ravel()), _occurrences(codes).ravel())
        out[m] = ([np.sort(idx[s:s + _GROUP]) for s in range(0, len(idx), _GROUP)], env)
    return out


def _held(env: np.ndarray, col: np.ndarray, occ: np.ndarray) -> np.ndarray:
    """[group, row]: how many of each query row's characters (columns ``col``, with
    occurrence numbers ``occ``) each group's envelope holds."""
    out = np.empty((env.shape[0], col.shape[0]), dtype=np.int64)
    step = max(1, (1 << 24) // max(1, env.shape[0] * col.shape[1]))
    for s in range(0, col.shape[0], step):
        out[:, s:s + step] = (env[:, col[s:s + step]] >= occ[s:s + step]).sum(axis=2)
    return out


def _bucket_scan(queries: list[str], targets: list[str], tlens: np.ndarray,
                 workers: int, floor: np.ndarray | None = None) -> np.ndarray:
    """Exact MinED by length buckets in order of growing length gap (targets rank-sorted).

    Each length bucket is split into groups of similar strings (:func:`_groups`).  A query
    row skips a group of length m when the bound max(L, m) - min(m, I) exceeds its best
    distance so far, where I counts the query's characters (with repeats) that the group's
    envelope holds (the most times any of its strings holds each character): the matches
    of an alignment, at most I, leave max(L, m) - I characters to edit.  When the bound
    equals the best distance, only ranks below the best are scanned.  The best starts
    from the first ranks (short strings such as a space: the nearest of many
    foreign-script tokens).  ``floor``: a known lower bound of each query's distance
    (from the hash joins), which raises every group's bound: a row whose best reaches
    it only looks for smaller ranks.
    """
    targets, kept = _fold_targets(queries, targets)
    tlens = tlens[kept]
    alphabet = np.unique(_codes(["".join(targets)], sum(map(len, targets))))
    groups = _groups(targets, tlens, alphabet)
    out = np.empty(len(queries), dtype=np.int64)
    qlens = np.fromiter(map(len, queries), dtype=np.int64, count=len(queries))
    tmax = int(tlens.max())
    tarr = np.array(targets, dtype=object)
    first = np.arange(min(_FIRST_RANKS, len(targets)))
    lengths, counts = np.unique(qlens, return_counts=True)
    inner = 1 if workers > 1 and len(lengths) > 1 else workers

    def scan(L: int) -> None:
        """The queries of length L (independent of every other length)."""
        rows = np.flatnonzero(qlens == L)
        qarr = np.array([queries[i] for i in rows], dtype=object)
        codes = _codes(qarr.tolist(), L)
        col = np.searchsorted(alphabet, codes)
        if len(alphabet):  # characters no target holds: the last column (0 everywhere)
            col[alphabet[np.minimum(col, len(alphabet) - 1)] != codes] = len(alphabet)
        occ = _occurrences(codes)
        low = np.zeros(len(rows), dtype=np.int64) if floor is None else floor[rows]
        best_d = np.full(len(rows), np.iinfo(np.int64).max, dtype=np.int64)
        best_t = np.full(len(rows), np.iinfo(np.int64).max, dtype=np.int64)
        step = max(1, _CDIST_CELLS // len(first))
        for s in range(0, len(rows), step):
            sub = np.arange(s, min(s + step, len(rows)))
            _improve(qarr[sub].tolist(), sub, tarr[first].tolist(), first,
                     np.uint8 if L + tmax < 255 else np.int32, L + tmax, best_d, best_t,
                     inner)
        for gap in range(0, max(L, tmax - L) + 1):
            if not (best_d >= gap).any():
                break
            for m in sorted({L - gap, L + gap}):
                if m not in groups:
                    continue
                cols, env = groups[m]
                lbs = max(L, m) - np.minimum(m, _held(env, col, occ))  # [group, row], >= gap
                lbs = np.maximum(lbs, low)
                for g, cols_g in enumerate(cols):
                    active = np.flatnonzero(best_d >= lbs[g])
                    if len(active):
                        _scan_bucket(qarr, active, lbs[g, active], cols_g, tarr, L + gap,
                                     best_d, best_t, inner)
        out[rows] = best_t

    # The most populous lengths first, so that both threads end on small ones.
    _threaded(scan, lengths[np.argsort(-counts, kind="stable")].tolist(), workers)
    return kept[out]


def _sentinel(targets: list[str]) -> str:
    """A character that no target string contains (private-use area first)."""
    alphabet = set("".join(targets))
    for code in range(0xE000, 0x110000):
        if 0xD800 <= code < 0xE000:
            continue
        if chr(code) not in alphabet:
            return chr(code)
    raise ValueError("mined_mapping: the target vocabulary uses every character")


def _fold_foreign(queries: list[str], alphabet: set[str], sentinel: str) -> list[str]:
    """``queries`` with every character absent from the targets replaced by ``sentinel``.

    Edit distance compares a query's characters only with the target's, never with each
    other, so characters that equal no target character are interchangeable: folding them
    into one keeps every distance, hence the MinED answer. Foreign-script tokens (62k of
    Gemma-3's against SmolLM2) collapse to a few hundred distinct queries.
    """
    table = dict.fromkeys(map(ord, set("".join(queries)) - alphabet), sentinel)
    return [q.translate(table) for q in queries]


def _nearest(qs: list[str], uniq: list[str], ulens: np.ndarray, workers: int) -> np.ndarray:
    """Rank in ``uniq`` of each query's MinED target (queries with no exact match)."""
    rank = np.full(len(qs), -1, dtype=np.int64)
    floor = np.ones(len(qs), dtype=np.int64)  # a lower bound of each query's distance
    qlens = np.fromiter(map(len, qs), dtype=np.int64, count=len(qs))
    pending = np.flatnonzero(qlens <= _MAX_JOIN_LEN)
    if len(pending):
        bits = max(len(qs), len(uniq)).bit_length()
        tfam = _Families(uniq, np.flatnonzero(ulens <= _MAX_JOIN_LEN + max(_JOINS)))
        for dist, joins in _JOINS.items():
            if len(pending) == 0:
                break
            # ``pending``: no target within dist - 1.
            qfam = _Families(qs, pending)
            best = np.full(len(qs), np.iinfo(np.int64).max, dtype=np.int64)
            join = functools.partial(_join_pair, tfam, qfam, bits)
            for qi, ti in _threaded(join, joins, workers):
                np.minimum.at(best, qi, ti)
            best = best[pending]
            found = best < len(uniq)
            cand_q, cand_t = pending[found], best[found]
            # Guard against 64-bit hash collisions: confirm the chosen pairs; a query
            # whose chosen pair fails goes to the exhaustive bucket scan.
            d = process.cpdist([qs[i] for i in cand_q], [uniq[t] for t in cand_t],
                               scorer=Levenshtein.distance, workers=workers)
            ok = np.asarray(d) == dist
            rank[cand_q[ok]] = cand_t[ok]
            floor[cand_q[~ok]] = dist
            pending = pending[~found]
            floor[pending] = dist + 1
    rest = np.flatnonzero(rank < 0)
    if len(rest):
        rank[rest] = _bucket_scan([qs[i] for i in rest], uniq, ulens, workers, floor[rest])
    return rank


def mined_mapping(src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                  workers: int = 2) -> np.ndarray:
    """Fast MinED; identical to :func:`brute_force_mapping` (FedMKT Appendix B)."""
    if len(tgt_tokens) == 0:
        raise ValueError("mined_mapping: the target vocabulary is empty")
    tgt = list(tgt_tokens)
    # Unique target strings in lexicographic order; each keeps its smallest id.
    order = sorted(range(len(tgt)), key=tgt.__getitem__)  # stable: equal strings by id
    uniq: list[str] = []
    uid: list[int] = []
    for j in order:
        if not uniq or tgt[j] != uniq[-1]:
            uniq.append(tgt[j])
            uid.append(j)
    uid_arr = np.asarray(uid, dtype=np.int64)
    exact = {s: r for r, s in enumerate(uniq)}
    ulens = np.fromiter(map(len, uniq), dtype=np.int64, count=len(uniq))

    # Unique source strings; exact matches first.
    src = list(src_tokens)
    src_index = {s: i for i, s in enumerate(dict.fromkeys(src))}
    src_inverse = np.fromiter(map(src_index.__getitem__, src), dtype=np.int64, count=len(src))
    qs = list(src_index)
    rank = np.fromiter(map(exact.get, qs, itertools.repeat(-1)), dtype=np.int64, count=len(qs))
    todo = np.flatnonzero(rank < 0)
    if len(todo):
        # The rest, with foreign characters folded (same distances), each distinct once.
        folded = _fold_foreign([qs[i] for i in todo], set("".join(uniq)), _sentinel(uniq))
        fold_index = {s: i for i, s in enumerate(dict.fromkeys(folded))}
        fold_of = np.fromiter(map(fold_index.__getitem__, folded), dtype=np.int64,
                              count=len(folded))
        rank[todo] = _nearest(list(fold_index), uniq, ulens, workers)[fold_of]
    return uid_arr[rank][src_inverse]
