"""Sequence (token-position) alignment between two tokenizations of the same text.

FedMKT (Fan et al.) Appendix B aligns the two token sequences of a public-set sample
with a dynamic-programming (edit-distance) path; a one-to-one step uses the source
token's logits directly, a source token that spans several target tokens (1-to-many)
and several source tokens inside one target token (many-to-1, e.g. ``util`` + ``ize``
vs ``utilize``) are resolved through the MinED vocabulary mapping.

Here the alignment is exact and vectorised: both tokenizations spell the same text, so
every token is placed on the byte axis of that text (whitespace removed, so that
``' the'`` and ``' ' + 'the'`` coincide) and tokens are linked by their spans.  Only
when the two spellings differ (lower-casing, normalisation, unknown tokens) a character
edit-distance DP (rapidfuzz's compiled ``opcodes``) maps one axis onto the other.
:func:`reference_dp_alignment` is a plain-Python token-level DP kept for comparison.

Next-token shift: logits at position ``t`` predict token ``t + 1``.  ``logit_map[j]`` is
the source position whose logits predict a token starting exactly where the target's
token ``j + 1`` starts (-1 when no source token starts there).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rapidfuzz.distance import Levenshtein

from fedkt.alignment.introspect import token_bytes, tokenizer_memo, vocab_hash
from fedkt.infra.cache import cache_dir, cached
from fedkt.infra.progress import counted
from fedkt.infra.timing import timed

__all__ = [
    "Alignment",
    "align_corpus",
    "align_sequences",
    "cached_alignments",
    "clear_alignment_cache",
    "reference_dp_alignment",
]

ALIGNMENT_VERSION = "offsets-v1"
_WS = frozenset(b" \t\n\r\x0b\x0c")
_KIND_SPECIAL, _KIND_SPACE, _KIND_TEXT = 0, 1, 2


@dataclass(frozen=True)
class Alignment:
    """Position alignment of one sample (all arrays int32, -1 = no counterpart).

    ``src_to_tgt[i]``: the target token containing source token ``i``'s first character
    (``util`` and ``ize`` both point at ``utilize``).  ``tgt_to_src[j]``: likewise from the
    target side.  ``logit_map[j]``: the source logit position to use for the target's
    logits at ``j`` (both predict a token starting at the same character: the next-token
    shift is applied).  ``logit_map_reverse``: the same from target to source.
    """

    src_to_tgt: np.ndarray
    tgt_to_src: np.ndarray
    logit_map: np.ndarray
    logit_map_reverse: np.ndarray

    @property
    def n_src(self) -> int:
        return int(self.src_to_tgt.shape[0])

    @property
    def n_tgt(self) -> int:
        return int(self.tgt_to_src.shape[0])

    def reversed(self) -> Alignment:
        """The same alignment with source and target swapped."""
        return Alignment(self.tgt_to_src, self.src_to_tgt, self.logit_map_reverse,
                         self.logit_map)

    def coverage(self) -> float:
        """Fraction of target logit positions (except the last) with a source position."""
        n = max(self.n_tgt - 1, 1)
        return float((self.logit_map[: self.n_tgt - 1] >= 0).sum() / n)


class _Layout:
    """Per-vocabulary tables: non-whitespace byte count, token kind, stripped bytes."""

    def __init__(self, tokenizer: Any) -> None:
        pieces = token_bytes(tokenizer)
        special = set(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        for idx, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(tok, "special", False):
                special.add(int(idx))
        self.stripped = [bytes(b for b in p if b not in _WS) for p in pieces]
        self.nws = np.fromiter((len(s) for s in self.stripped), dtype=np.int64,
                               count=len(pieces))
        kind = np.where(self.nws > 0, _KIND_TEXT, _KIND_SPACE).astype(np.int8)
        empty = np.fromiter((len(p) == 0 for p in pieces), dtype=bool, count=len(pieces))
        kind[empty] = _KIND_SPECIAL
        kind[[i for i in special if i < len(kind)]] = _KIND_SPECIAL
        self.kind = kind
        self.size = len(pieces)


def _layout(tokenizer: Any) -> _Layout:
    memo = tokenizer_memo(tokenizer)
    if "layout" not in memo:
        memo["layout"] = _Layout(tokenizer)
    return memo["layout"]


def _place(ids: np.ndarray, lay: _Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if len(ids) and (ids.min() < 0 or ids.max() >= lay.size):
        raise ValueError(f"token id outside the tokenizer's vocabulary [0, {lay.size})")
    nws = lay.nws[ids]
    end = np.cumsum(nws)
    return end - nws, end, lay.kind[ids]


def _keys(start: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Unique per-token keys: (start, kind, ordinal among equal (start, kind))."""
    base = start.astype(np.int64) * 3 + kind
    n = len(base)
    if n == 0:
        return base
    order = np.argsort(base, kind="stable")
    sb = base[order]
    first = np.r_[True, sb[1:] != sb[:-1]]
    grp = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    ordinal = np.empty(n, dtype=np.int64)
    ordinal[order] = np.arange(n) - grp
    return base * 65536 + ordinal


def _match(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each key of ``a`` the index of the equal key in ``b`` (-1 if none)."""
    if len(b) == 0:
        return np.full(len(a), -1, dtype=np.int64)
    order = np.argsort(b, kind="stable")
    pos = np.searchsorted(b[order], a)
    pos = np.minimum(pos, len(b) - 1)
    hit = b[order][pos] == a
    return np.where(hit, order[pos], -1)


def _contain(start: np.ndarray, kind: np.ndarray, o_start: np.ndarray, o_end: np.ndarray,
             o_kind: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Token of the other side whose text span contains each token's first character."""
    text = np.flatnonzero(o_kind == _KIND_TEXT)
    out = exact.copy()
    mine = kind == _KIND_TEXT
    if len(text) and mine.any():
        j = np.searchsorted(o_start[text], start[mine], side="right") - 1
        ok = (j >= 0) & (start[mine] < o_end[text][np.maximum(j, 0)])
        out[mine] = np.where(ok, text[np.maximum(j, 0)], -1)
    elif mine.any():
        out[mine] = -1
    return out


def _shift(match: np.ndarray) -> np.ndarray:
    """logit_map from token matches: position j predicts j + 1; -1 if unmatched."""
    n = len(match)
    out = np.full(n, -1, dtype=np.int32)
    if n > 1:
        nxt = match[1:]
        out[:-1] = np.where(nxt >= 1, nxt - 1, -1)
    return out


def _char_map(a: bytes, b: bytes) -> np.ndarray:
    """For each offset 0..len(a) of ``a`` an offset of ``b``: compiled edit-distance DP."""
    sa, sb = a.decode("latin-1").lower(), b.decode("latin-1").lower()
    out = np.empty(len(a) + 1, dtype=np.int64)
    for tag, i1, i2, j1, j2 in Levenshtein.opcodes(sa, sb):
        span = np.arange(i1, i2)
        if tag in ("equal", "replace"):
            out[i1:i2] = j1 + np.minimum(span - i1, max(j2 - j1 - 1, 0))
        elif tag == "delete":
            out[i1:i2] = j1
    out[len(a)] = len(b)
    return out


def _align_ids(src_ids: np.ndarray, tgt_ids: np.ndarray, src_lay: _Layout,
               tgt_lay: _Layout) -> Alignment:
    s_start, s_end, s_kind = _place(src_ids, src_lay)
    t_start, t_end, t_kind = _place(tgt_ids, tgt_lay)
    s_text = b"".join([src_lay.stripped[i] for i in src_ids.tolist()])
    t_text = b"".join([tgt_lay.stripped[i] for i in tgt_ids.tolist()])
    n = min(len(s_text), len(t_text))
    if s_text[:n] != t_text[:n]:
        # Different spellings: carry source offsets onto the target axis (Appendix B DP).
        cmap = _char_map(s_text, t_text)
        s_start, s_end = cmap[s_start], cmap[s_end]
    s_keys, t_keys = _keys(s_start, s_kind), _keys(t_start, t_kind)
    t_match = _match(t_keys, s_keys)  # target token -> source token starting at the same place
    s_match = _match(s_keys, t_keys)
    return Alignment(
        src_to_tgt=_contain(s_start, s_kind, t_start, t_end, t_kind, s_match).astype(np.int32),
        tgt_to_src=_contain(t_start, t_kind, s_start, s_end, s_kind, t_match).astype(np.int32),
        logit_map=_shift(t_match),
        logit_map_reverse=_shift(s_match),
    )


def _as_ids(ids: Any) -> np.ndarray:
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of token ids, got shape {arr.shape}")
    return arr


def align_sequences(src_ids: Any, tgt_ids: Any, src_tokenizer: Any,
                    tgt_tokenizer: Any) -> Alignment:
    """Align two tokenizations (id sequences, padding removed) of the same text."""
    return _align_ids(_as_ids(src_ids), _as_ids(tgt_ids), _layout(src_tokenizer),
                      _layout(tgt_tokenizer))


# --------------------------------------------------------------------------- corpus + cache

_MEMORY: OrderedDict[str, list[Alignment]] = OrderedDict()
_MEMORY_SLOTS = 8


def clear_alignment_cache() -> None:
    """Forget the in-memory corpus alignments."""
    _MEMORY.clear()


def _encode(tokenizer: Any, texts: list[str], add_special_tokens: bool,
            max_length: int | None) -> list[list[int]]:
    kwargs: dict[str, Any] = {"add_special_tokens": add_special_tokens}
    if max_length is not None:
        kwargs.update(truncation=True, max_length=max_length)
    return list(tokenizer(texts, **kwargs)["input_ids"])


def _save(path: os.PathLike[str] | str, alignments: list[Alignment]) -> None:
    """Write ``alignments`` as one ``.npz`` file (a cache build's temporary path)."""
    ns = np.array([a.n_src for a in alignments], dtype=np.int64)
    nt = np.array([a.n_tgt for a in alignments], dtype=np.int64)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int32))  # noqa: E731
    with open(path, "wb") as fh:
        np.savez(fh, n_src=ns, n_tgt=nt,
                 src_to_tgt=cat([a.src_to_tgt for a in alignments]),
                 tgt_to_src=cat([a.tgt_to_src for a in alignments]),
                 logit_map=cat([a.logit_map for a in alignments]),
                 logit_map_reverse=cat([a.logit_map_reverse for a in alignments]))


def cached_alignments(path: Path, compute: Callable[[], list[Alignment]],
                      n: int | None = None) -> list[Alignment]:
    """The alignments stored at ``path`` (an ``.npz`` cache entry), computed once if absent.

    ``n`` is the expected count; an entry with another count is recomputed. Safe when
    several processes ask at once (:func:`fedkt.infra.cache.cached`).
    """
    def load(p: Path) -> list[Alignment]:
        out = _load(p)
        if n is not None and len(out) != n:
            raise ValueError(f"{p} holds {len(out)} alignments, expected {n}")
        return out

    def build(tmp: Path) -> list[Alignment]:
        out = compute()
        _save(tmp, out)
        return out

    return cached(path, build, load)


def _load(path: os.PathLike[str] | str) -> list[Alignment]:
    with np.load(path) as z:
        ns, nt = z["n_src"], z["n_tgt"]
        s_off = np.concatenate([[0], np.cumsum(ns)])
        t_off = np.concatenate([[0], np.cumsum(nt)])
        s2t, t2s = z["src_to_tgt"], z["tgt_to_src"]
        lm, lmr = z["logit_map"], z["logit_map_reverse"]
    return [Alignment(s2t[s_off[i]:s_off[i + 1]], t2s[t_off[i]:t_off[i + 1]],
                      lm[t_off[i]:t_off[i + 1]], lmr[s_off[i]:s_off[i + 1]])
            for i in range(len(ns))]


@timed("align")
def align_corpus(texts: Sequence[str], src_tokenizer: Any, tgt_tokenizer: Any, *,
                 add_special_tokens: bool = True, max_length: int | None = None,
                 cache: bool = True) -> list[Alignment]:
    """Align every text's two tokenizations (``tokenizer(text, add_special_tokens=...)``).

    Computed once per (public set, tokenizer pair) and reused every round: kept in
    memory and, with ``cache``, on disk under ``cache_dir()/alignments``.
    """
    texts = list(texts)
    h = hashlib.sha256()
    h.update(f"{ALIGNMENT_VERSION}:{vocab_hash(src_tokenizer)}:{vocab_hash(tgt_tokenizer)}:"
             f"{add_special_tokens}:{max_length}:{len(texts)}".encode())
    for t in texts:
        h.update(len(t).to_bytes(8, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
    key = h.hexdigest()[:32]
    if key in _MEMORY:
        _MEMORY.move_to_end(key)
        return list(_MEMORY[key])

    def compute() -> list[Alignment]:
        src_lay, tgt_lay = _layout(src_tokenizer), _layout(tgt_tokenizer)
        src_all = _encode(src_tokenizer, texts, add_special_tokens, max_length)
        tgt_all = _encode(tgt_tokenizer, texts, add_special_tokens, max_length)
        pairs = counted(zip(src_all, tgt_all, strict=True), len(texts))
        return [_align_ids(np.asarray(s, dtype=np.int64), np.asarray(t, dtype=np.int64),
                           src_lay, tgt_lay) for s, t in pairs]

    out = (cached_alignments(cache_dir("alignments") / f"{key}.npz", compute, len(texts))
           if cache else compute())
    _MEMORY[key] = out
    while len(_MEMORY) > _MEMORY_SLOTS:
        _MEMORY.popitem(last=False)
    return list(out)


# --------------------------------------------------------------------------- reference


def reference_dp_alignment(src_tokens: Sequence[str], tgt_tokens: Sequence[str]) -> np.ndarray:
    """Plain-Python token-level DP (DTW, cost = edit distance of the token strings).

    The formulation of FedMKT Appendix B (as in FuseLLM/FATE-LLM); one Python step per
    cell.  Returns, for each target position, the first source position on the path.
    Kept as the slow reference for benchmarks and tests, not used in training.
    """
    n, m = len(src_tokens), len(tgt_tokens)
    if n == 0 or m == 0:
        return np.full(m, -1, dtype=np.int32)
    src = [s.strip() for s in src_tokens]
    tgt = [t.strip() for t in tgt_tokens]
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(1, n + 1):
        row, prev = cost[i], cost[i - 1]
        si = src[i - 1]
        for j in range(1, m + 1):
            c = Levenshtein.distance(si, tgt[j - 1])
            row[j] = c + min(prev[j - 1], prev[j], row[j - 1])
    out = np.full(m, -1, dtype=np.int32)
    i, j = n, m
    while i > 0 and j > 0:
        out[j - 1] = i - 1  # overwritten as the path moves up: keeps the first source index
        diag, up, left = cost[i - 1][j - 1], cost[i - 1][j], cost[i][j - 1]
        best = min(diag, up, left)
        if best == diag:
            i, j = i - 1, j - 1
        elif best == up:
            i -= 1
        else:
            j -= 1
    return out
