"""The MinED engine: each source string's nearest target string by edit distance.

FedMKT (Fan et al.), Sec. 3.2 "Bidirectional Token Alignment" and Appendix B: every
source token is mapped to the target token with the smallest edit distance.  Here the
definition is made exact: Levenshtein distance over the characters of the *normalised*
token strings, ties broken to the lexicographically smallest target string (then the
smallest target id).  :func:`brute_force_mapping` is that definition written out with
one edit-distance call per pair; :func:`mined_mapping` returns the identical result,
quickly, through

1. an exact-match dictionary;
2. distance-1 and distance-2 neighbourhoods found by hash joins over deletion variants
   with position tags (every pair such a join yields is at distance <= 1 resp. <= 2,
   and every such pair is yielded), vectorised in numpy;
3. for what remains, length buckets searched in order of growing length difference
   (|len(a) - len(b)| is a lower bound of the distance) with rapidfuzz ``cdist``,
   stopping once the best distance found is below the next bucket's gap; each bucket is
   split into groups of strings with similar characters, and a query skips a group whose
   character envelope bounds the distance above its best so far.

Strings here are already normalised (:func:`fedkt.alignment.introspect.normalize_vocab`);
the vocabulary mapping between two tokenizers is :mod:`fedkt.alignment.vocab`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

__all__ = ["brute_force_mapping", "mined_mapping"]

_MAX_JOIN_LEN = 40  # queries longer than this skip the hash joins (they are few; buckets are small)
_CDIST_CELLS = 1 << 24  # cap on one cdist result matrix (cells)
_SMALL_CDIST = 1 << 16  # smaller cdist calls run on one thread


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
_BASE = np.uint64(0x100000001B3)
_K_LEN = 0x9E3779B97F4A7C15
_K_POS1 = 0xC2B2AE3D27D4EB4F
_K_POS2 = 0x165667B19E3779F9
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


def _keep(dropped: np.ndarray, length: int) -> np.ndarray:
    """For each row of ``dropped`` (distinct positions): the other positions, in order."""
    mask = np.ones((len(dropped), length), dtype=bool)
    np.put_along_axis(mask, dropped, False, axis=1)
    return np.nonzero(mask)[1].reshape(len(dropped), length - dropped.shape[1])


class _Families:
    """Hashed deletion variants of a set of strings, grouped into join families.

    ``p0``/``p1``/``p2``: the string with 0, 1 or 2 characters deleted (any positions).
    ``pos1``: one deletion tagged with its position (substitution at that position).
    ``sub2``: two deletions {x < y} tagged with p in {x, y - 1}: the string with one
    deletion then one substitution at p (in the once-shortened coordinates).
    ``pp2``: two deletions tagged with both positions (two substitutions).
    Keys include the variant length; :meth:`packed` returns one family's keys with the
    owner index in the low bits, sorted, ready for :func:`_join`.
    """

    def __init__(self, strings: Sequence[str], owners: np.ndarray, level: int) -> None:
        fam: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
            k: [] for k in ("p0", "p1", "p2", "pos1", "sub2", "pp2")}
        lens = np.fromiter(map(len, map(strings.__getitem__, owners.tolist())), dtype=np.int64,
                           count=len(owners))
        for length in np.unique(lens):
            length = int(length)
            idx = owners[lens == length]
            if length:
                flat = "".join(map(strings.__getitem__, idx.tolist()))
                codes = np.frombuffer(flat.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
                codes = codes.reshape(len(idx), length).astype(np.uint64) + np.uint64(1)
            else:
                codes = np.zeros((len(idx), 0), dtype=np.uint64)
            fam["p0"].append((idx, self._hash(codes, np.arange(length)[None, :])[:, 0]))
            if length >= 1:
                keep1 = _keep(np.arange(length)[:, None], length)
                h1 = self._hash(codes, keep1)  # [n, length]
                rep = np.repeat(idx, length)
                fam["p1"].append((rep, h1.ravel()))
                pos = np.tile(np.arange(length, dtype=np.uint64), len(idx))
                fam["pos1"].append((rep, self._tag(h1.ravel(), pos)))
            if level >= 2 and length >= 2:
                pairs = np.stack(np.triu_indices(length, 1), axis=1)  # (x, y), x < y, in order
                keep2 = _keep(pairs, length)
                h2 = self._hash(codes, keep2).ravel()  # [n * npairs]
                rep = np.repeat(idx, len(pairs))
                xs = np.tile(pairs[:, 0].astype(np.uint64), len(idx))
                ys = np.tile(pairs[:, 1].astype(np.uint64), len(idx))
                fam["p2"].append((rep, h2))
                fam["sub2"].append((rep, self._tag(h2, xs)))
                fam["sub2"].append((rep, self._tag(h2, ys - np.uint64(1))))
                fam["pp2"].append((rep, self._tag(h2, xs, ys)))
        self._fam = fam

    def packed(self, name: str, bits: int) -> np.ndarray:
        """Sorted ``(key high bits) | owner`` words of one family (owner in the low bits)."""
        parts = self._fam[name]
        if not parts:
            return np.zeros(0, dtype=np.uint64)
        b = np.uint64(bits)
        owners = np.concatenate([o for o, _ in parts]).astype(np.uint64)
        keys = _mix(np.concatenate([h for _, h in parts]))  # spread entropy to the high bits
        return np.sort(((keys >> b) << b) | owners)

    @staticmethod
    def _hash(codes: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """Polynomial hash (mod 2**64) of ``codes[:, keep[c]]`` for every row c of keep."""
        n_keep = keep.shape[1]
        powers = _BASE ** np.arange(n_keep - 1, -1, -1, dtype=np.uint64)
        if n_keep:
            h = (codes[:, keep] * powers).sum(axis=-1, dtype=np.uint64)
        else:
            h = np.zeros((codes.shape[0], keep.shape[0]), dtype=np.uint64)
        return h + _u64(_K_LEN * (n_keep + 1))

    @staticmethod
    def _tag(h: np.ndarray, p: np.ndarray, q: np.ndarray | None = None) -> np.ndarray:
        out = h * _K_MIX + (p + np.uint64(1)) * _u64(_K_POS1)
        if q is not None:
            out = out + (q + np.uint64(1)) * _u64(_K_POS2)
        return out


def _join(t_packed: np.ndarray, q_packed: np.ndarray, bits: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """For each query word with a key match: (query owner, smallest matching target owner).

    Both inputs are sorted ``key | owner`` words, so within a run of equal keys the first
    target word carries the smallest owner, i.e. the lexicographically first target.
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


# (query family, target family) joins whose pairs are exactly the pairs at distance <= d
# (for strings that are not closer): see the _Families docstring.
_JOINS_D1 = [("p1", "p0"), ("p0", "p1"), ("pos1", "pos1")]
_JOINS_D2 = [("p2", "p0"), ("p0", "p2"), ("p1", "p1"), ("sub2", "pos1"), ("pos1", "sub2"),
             ("pp2", "pp2")]


def _best_rank(n: int, qi: np.ndarray, ti: np.ndarray) -> np.ndarray:
    best = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    if len(qi):
        np.minimum.at(best, qi, ti)
    return best


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
                 workers: int) -> np.ndarray:
    """Exact MinED by length buckets in order of growing length gap (targets rank-sorted).

    Each length bucket is split into groups of similar strings (:func:`_groups`).  A query
    row skips a group of length m when the bound max(L, m) - min(m, I) exceeds its best
    distance so far, where I counts the query's characters (with repeats) that the group's
    envelope holds (the most times any of its strings holds each character): the matches
    of an alignment, at most I, leave max(L, m) - I characters to edit.  When the bound
    equals the best distance, only ranks below the best are scanned.  The best starts
    from the first ranks (short strings such as a space: the nearest of many
    foreign-script tokens).
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
    for L in np.unique(qlens):
        L = int(L)
        rows = np.flatnonzero(qlens == L)
        qarr = np.array([queries[i] for i in rows], dtype=object)
        codes = _codes(qarr.tolist(), L)
        col = np.searchsorted(alphabet, codes)
        if len(alphabet):  # characters no target holds: the last column (0 everywhere)
            col[alphabet[np.minimum(col, len(alphabet) - 1)] != codes] = len(alphabet)
        occ = _occurrences(codes)
        best_d = np.full(len(rows), np.iinfo(np.int64).max, dtype=np.int64)
        best_t = np.full(len(rows), np.iinfo(np.int64).max, dtype=np.int64)
        step = max(1, _CDIST_CELLS // len(first))
        for s in range(0, len(rows), step):
            sub = np.arange(s, min(s + step, len(rows)))
            _improve(qarr[sub].tolist(), sub, tarr[first].tolist(), first,
                     np.uint8 if L + tmax < 255 else np.int32, L + tmax, best_d, best_t,
                     workers)
        for gap in range(0, max(L, tmax - L) + 1):
            if not (best_d >= gap).any():
                break
            for m in sorted({L - gap, L + gap}):
                if m not in groups:
                    continue
                cols, env = groups[m]
                lbs = max(L, m) - np.minimum(m, _held(env, col, occ))  # [group, row], >= gap
                for g, cols_g in enumerate(cols):
                    active = np.flatnonzero(best_d >= lbs[g])
                    if len(active):
                        _scan_bucket(qarr, active, lbs[g, active], cols_g, tarr, L + gap,
                                     best_d, best_t, workers)
        out[rows] = best_t
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
    qlens = np.fromiter(map(len, qs), dtype=np.int64, count=len(qs))
    joinable = np.flatnonzero(qlens <= _MAX_JOIN_LEN)
    if len(joinable):
        t_owner = np.flatnonzero(ulens <= _MAX_JOIN_LEN + 2)
        bits = max(len(qs), len(uniq)).bit_length()
        tfam = _Families(uniq, t_owner, level=2)
        tkeys = {k: tfam.packed(k, bits) for k in ("p0", "p1", "p2", "pos1", "sub2", "pp2")}
        pending = joinable
        for dist, joins, level in ((1, _JOINS_D1, 1), (2, _JOINS_D2, 2)):
            if len(pending) == 0:
                break
            qfam = _Families(qs, pending, level=level)
            qi_all, ti_all = [], []
            for qf, tf in joins:
                qi, ti = _join(tkeys[tf], qfam.packed(qf, bits), bits)
                qi_all.append(qi)
                ti_all.append(ti)
            qi = np.concatenate(qi_all)
            ti = np.concatenate(ti_all)
            best = _best_rank(len(qs), qi, ti)[pending]
            found = best < len(uniq)
            cand_q, cand_t = pending[found], best[found]
            # Guard against 64-bit hash collisions: confirm the chosen pairs; a query
            # whose chosen pair fails goes to the exhaustive bucket scan.
            d = process.cpdist([qs[i] for i in cand_q], [uniq[t] for t in cand_t],
                               scorer=Levenshtein.distance, workers=workers)
            ok = np.asarray(d) == dist
            rank[cand_q[ok]] = cand_t[ok]
            pending = pending[~found]
    rest = np.flatnonzero(rank < 0)
    if len(rest):
        rank[rest] = _bucket_scan([qs[i] for i in rest], uniq, ulens, workers)
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
