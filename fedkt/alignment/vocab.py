"""Vocabulary mapping by minimum edit distance (MinED): source id -> target id.

FedMKT (Fan et al.), Sec. 3.2 "Bidirectional Token Alignment" and Appendix B.  Text
tokens map by MinED over the normalised vocabularies (:mod:`fedkt.alignment.mined`, the
engine; :mod:`fedkt.alignment.introspect`, how each tokenizer writes its vocabulary);
special tokens map by role.  Mappings are cached on disk, keyed by both vocabularies'
contents.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from fedkt.alignment.introspect import (
    normalize_vocab,
    role_ids,
    special_ids,
    vocab_hash,
    vocab_len,
)
from fedkt.alignment.mined import mined_mapping
from fedkt.infra.cache import cache_dir, cached
from fedkt.infra.timing import timed

__all__ = ["MAPPING_VERSION", "special_token_mapping", "vocab_mapping"]

MAPPING_VERSION = "mined-v2"  # v2: special tokens by role; bump when the mapping definition or normalisation changes


def special_token_mapping(src_tokenizer: Any, tgt_tokenizer: Any) -> dict[int, int]:
    """Source special id -> target id, by role and never by edit distance.

    A source id holding a role (eos, bos, pad, unk) maps to the target's token of the
    same role; an id with several roles (GPT-2's ``<|endoftext|>`` is all four) takes
    the first of ``eos, bos, pad, unk`` the target fills.  Other special tokens map to
    the target special token with the same text (``<|im_start|>`` in SmolLM2 and
    Qwen2.5), else to -1: no counterpart, dropped from a projected top-K.
    """
    tgt_roles = role_ids(tgt_tokenizer)
    src_roles: dict[int, list[str]] = {}
    for role, idx in role_ids(src_tokenizer).items():
        src_roles.setdefault(idx, []).append(role)
    tgt_special = special_ids(tgt_tokenizer)
    tgt_norm, src_norm = normalize_vocab(tgt_tokenizer), normalize_vocab(src_tokenizer)
    by_text: dict[str, int] = {}
    for idx in sorted(tgt_special):
        if idx < len(tgt_norm):
            by_text.setdefault(tgt_norm[idx], idx)
    out: dict[int, int] = {}
    for idx in sorted(special_ids(src_tokenizer) | set(src_roles)):
        if idx >= len(src_norm):
            continue
        roles = [r for r in src_roles.get(idx, []) if r in tgt_roles]
        out[idx] = tgt_roles[roles[0]] if roles else by_text.get(src_norm[idx], -1)
    return out


def _build_mapping(src_tokenizer: Any, tgt_tokenizer: Any, workers: int) -> np.ndarray:
    """MinED over the text tokens of both sides, then the special tokens by role."""
    src, tgt = normalize_vocab(src_tokenizer), normalize_vocab(tgt_tokenizer)
    specials = special_token_mapping(src_tokenizer, tgt_tokenizer)
    tgt_skip = special_ids(tgt_tokenizer) | set(role_ids(tgt_tokenizer).values())
    tgt_keep = np.array([j for j in range(len(tgt)) if j not in tgt_skip], dtype=np.int64)
    src_text = np.array([i for i in range(len(src)) if i not in specials], dtype=np.int64)
    out = np.full(len(src), -1, dtype=np.int64)
    if len(src_text):
        if not len(tgt_keep):
            raise ValueError("vocab_mapping: the target vocabulary has no text tokens")
        found = mined_mapping([src[i] for i in src_text], [tgt[j] for j in tgt_keep],
                              workers=workers)
        out[src_text] = tgt_keep[found]
    for idx, tgt_id in specials.items():
        out[idx] = tgt_id
    return out


@timed("align")
def vocab_mapping(src_tokenizer: Any, tgt_tokenizer: Any, cache: bool = True,
                  workers: int = 2) -> np.ndarray:
    """Vocabulary mapping: ``out[src_id]`` is the target id (int64, [V_src]).

    Text tokens map to the closest target text token by MinED (:func:`mined_mapping`;
    target special tokens are never candidates); special tokens map by role
    (:func:`special_token_mapping`), -1 where the target has no counterpart.
    Cached on disk under :func:`cache_dir` keyed by both vocabularies' contents.
    """
    if not cache:
        return _build_mapping(src_tokenizer, tgt_tokenizer, workers)
    key = hashlib.sha256(
        f"{MAPPING_VERSION}:{vocab_hash(src_tokenizer)}:{vocab_hash(tgt_tokenizer)}".encode()
    ).hexdigest()[:32]

    def load(path: Path) -> np.ndarray:
        mapping = np.load(path)
        if mapping.dtype != np.int64 or mapping.shape != (vocab_len(src_tokenizer),):
            raise ValueError(f"{path} holds {mapping.dtype} {mapping.shape}")
        return mapping

    def build(tmp: Path) -> np.ndarray:
        mapping = _build_mapping(src_tokenizer, tgt_tokenizer, workers)
        with open(tmp, "wb") as fh:
            np.save(fh, mapping)
        return mapping

    return cached(cache_dir("vocab_mapping") / f"{key}.npy", build, load)
