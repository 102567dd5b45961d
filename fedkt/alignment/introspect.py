"""Tokenizer introspection: how a tokenizer writes its vocabulary, for token alignment.

Detects a tokenizer's word-boundary scheme (byte-level, metaspace, WordPiece, plain),
normalises its vocabulary strings (:func:`normalize_vocab`), gives each id's surface
bytes (:func:`token_bytes`), a hash of its contents (:func:`vocab_hash`) and its special
tokens and their roles (:func:`special_ids`, :func:`role_ids`).  Results are memoised
per tokenizer object (:func:`tokenizer_memo`).  The MinED engine is
:mod:`fedkt.alignment.mined`; the vocabulary mapping built from both is :mod:`fedkt.alignment.vocab`.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ROLES", "VocabScheme", "added_tokens", "byte_level_alphabet", "detect_scheme",
    "normalize_vocab", "role_ids", "space_marker", "special_ids", "token_bytes",
    "tokenizer_memo", "vocab_hash", "vocab_len",
]

SchemeKind = Literal["byte_level", "metaspace", "wordpiece", "plain"]


# --------------------------------------------------------------------------- tokenizers


@dataclass(frozen=True)
class VocabScheme:
    """How a tokenizer marks word boundaries inside its vocabulary strings.

    ``byte_level``: GPT-2-style byte-to-unicode alphabet, a leading space is the byte
    0x20's stand-in (``'Ġ'``); ``metaspace``: SentencePiece-style replacement character
    (``'▁'``); ``wordpiece``: a continuation prefix (``'##'``) marks tokens *without* a
    preceding space; ``plain``: none of these.
    """

    kind: SchemeKind
    marker: str | None


def byte_level_alphabet() -> dict[int, str]:
    """The reversible byte -> printable-unicode table of byte-level BPE (GPT-2)."""
    return dict(_B2U)


def _bytes_to_unicode() -> dict[int, str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_B2U = _bytes_to_unicode()
_U2B = {u: b for b, u in _B2U.items()}
# str.translate table: byte-level symbol -> the latin-1 character of its byte; characters
# below U+0144 that are not byte-level symbols (a raw space, ...) become U+FFFF so that
# the following .encode("latin-1") fails on them, as on anything above U+00FF.
_U2L = {c: (chr(_U2B[chr(c)]) if chr(c) in _U2B else "\uffff") for c in range(0x144)}
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _backend(tokenizer: Any) -> Any:
    return getattr(tokenizer, "backend_tokenizer", None)


def _state(component: Any) -> Any:
    """JSON of a ``tokenizers`` normaliser / pre-tokenizer / decoder (``None`` if absent)."""
    if component is None:
        return None
    try:
        return json.loads(component.__getstate__())
    except Exception:  # pragma: no cover - exotic component without JSON state
        return None


def _walk(obj: Any):
    if isinstance(obj, dict):
        if "type" in obj:
            yield obj
        for value in obj.values():
            yield from _walk(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _walk(value)


def _scheme_from_backend(tokenizer: Any) -> VocabScheme | None:
    """Read the scheme from the tokenizer's own pipeline (tokenizer.json components)."""
    backend = _backend(tokenizer)
    if backend is None:
        return None
    normalizer = list(_walk(_state(backend.normalizer)))
    pre = list(_walk(_state(backend.pre_tokenizer)))
    decoder = list(_walk(_state(backend.decoder)))
    parts = normalizer + pre + decoder
    if any(p.get("type") == "ByteLevel" for p in parts):
        return VocabScheme("byte_level", _B2U[0x20])
    for p in pre + decoder:
        if p.get("type") == "Metaspace" and p.get("replacement"):
            return VocabScheme("metaspace", str(p["replacement"]))
    model = backend.model
    if type(model).__name__ == "WordPiece" or any(p.get("type") == "WordPiece" for p in decoder):
        prefix = getattr(model, "continuing_subword_prefix", None)
        for p in decoder:
            if p.get("type") == "WordPiece" and p.get("prefix"):
                prefix = p["prefix"]
        return VocabScheme("wordpiece", prefix or "##")
    # SentencePiece exported without Metaspace: normaliser replaces " " by the marker and
    # the decoder replaces it back.
    for p in normalizer:
        if (p.get("type") == "Replace" and p.get("pattern", {}).get("String") == " "
                and p.get("content")):
            return VocabScheme("metaspace", str(p["content"]))
    for p in decoder:
        if p.get("type") == "Replace" and p.get("content") == " ":
            marker = p.get("pattern", {}).get("String")
            if marker:
                return VocabScheme("metaspace", str(marker))
    return None


def _scheme_from_probe(tokenizer: Any) -> VocabScheme:
    """Tokenize ``"a a"``: what stands between the two ``a`` is the space marker."""
    vocab = tokenizer.get_vocab()
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode("a a", add_special_tokens=False))
    joined = "".join(p for p in pieces if p)
    marker = None
    if joined.count("a") >= 2:
        between = joined[joined.index("a") + 1: joined.rindex("a")]
        marker = between or None
    if marker == _B2U[0x20] and sum(ch in vocab for ch in _B2U.values()) >= 200:
        return VocabScheme("byte_level", marker)
    if marker and marker != " ":
        return VocabScheme("metaspace", marker)
    continuation = sum(1 for tok in vocab if tok.startswith("##") and len(tok) > 2)
    if continuation > 0.05 * max(len(vocab), 1):
        return VocabScheme("wordpiece", "##")
    return VocabScheme("plain", None)


def detect_scheme(tokenizer: Any) -> VocabScheme:
    """The tokenizer's word-boundary convention, read from the tokenizer itself.

    First its pipeline (ByteLevel / Metaspace / WordPiece / Replace components of the
    ``tokenizers`` backend), else a probe: tokenize ``"a a"`` and inspect the pieces.
    """
    return _scheme_from_backend(tokenizer) or _scheme_from_probe(tokenizer)


def space_marker(tokenizer: Any) -> str | None:
    """``'Ġ'`` (byte-level), ``'▁'`` (metaspace), ``'##'`` (WordPiece continuation) or None."""
    return detect_scheme(tokenizer).marker


def vocab_len(tokenizer: Any) -> int:
    """The number of ids the vocabulary spans (unused ids included)."""
    return len(_raw_tokens(tokenizer))


def _raw_tokens(tokenizer: Any) -> list[str]:
    """Vocabulary strings indexed by id ('' for unused ids)."""
    memo = tokenizer_memo(tokenizer)
    if "raw" not in memo:
        vocab = tokenizer.get_vocab()
        raw = [""] * max(len(tokenizer), max(vocab.values()) + 1 if vocab else 0)
        for tok, idx in vocab.items():
            raw[idx] = tok
        memo["raw"] = raw
    return memo["raw"]


def added_tokens(tokenizer: Any) -> dict[int, tuple[str, bool]]:
    """id -> (content, special) for added tokens (their strings are plain text)."""
    out: dict[int, tuple[str, bool]] = {}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for idx, tok in decoder.items():
        out[int(idx)] = (str(tok.content), bool(getattr(tok, "special", False)))
    for idx in getattr(tokenizer, "all_special_ids", []) or []:
        if idx is not None and int(idx) not in out:
            out[int(idx)] = (tokenizer.convert_ids_to_tokens(int(idx)), True)
    return out


def _normalize_one(tok: str, scheme: VocabScheme) -> str:
    if scheme.kind == "byte_level":
        try:
            return tok.translate(_U2L).encode("latin-1").decode("utf-8")
        except UnicodeError:
            return tok  # a partial UTF-8 sequence (or a non-byte-level entry): kept as is
    if scheme.kind == "metaspace":
        return tok.replace(scheme.marker, " ") if scheme.marker else tok
    if scheme.kind == "wordpiece":
        marker = scheme.marker or "##"
        if tok.startswith(marker) and len(tok) > len(marker):
            return tok[len(marker):]
        return " " + tok
    return tok


def _token_bytes_one(tok: str, scheme: VocabScheme) -> bytes:
    if scheme.kind == "byte_level":
        try:
            return tok.translate(_U2L).encode("latin-1")
        except UnicodeError:
            return tok.encode("utf-8")
    if scheme.kind == "metaspace":
        m = _BYTE_FALLBACK.match(tok)
        if m:
            return bytes([int(m.group(1), 16)])
    return _normalize_one(tok, scheme).encode("utf-8")


# Per-tokenizer memo (tokenizers are treated as immutable once handed to us).
_MEMO: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def tokenizer_memo(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer's memo dict (new when its size changed; a throwaway one for an object
    that cannot be weakly referenced)."""
    try:
        memo = _MEMO.get(tokenizer)
        if memo is None or memo.get("_size") != len(tokenizer):
            memo = {"_size": len(tokenizer)}
            _MEMO[tokenizer] = memo
        return memo
    except TypeError:  # not weak-referenceable: no memo
        return {"_size": len(tokenizer)}


def normalize_vocab(tokenizer: Any) -> list[str]:
    """Vocabulary strings indexed by id with the space/byte markers normalised.

    ``'Ġthe'`` (byte-level) and ``'▁the'`` (metaspace) both become ``' the'``; WordPiece
    ``'##ing'`` becomes ``'ing'`` and a word-initial ``'the'`` becomes ``' the'``;
    byte-level entries that are not valid UTF-8 on their own stay as they are; added
    and special tokens keep their text.
    """
    memo = tokenizer_memo(tokenizer)
    if "normalized" not in memo:
        scheme = detect_scheme(tokenizer)
        out = [_normalize_one(tok, scheme) if tok else tok for tok in _raw_tokens(tokenizer)]
        for idx, (content, _special) in added_tokens(tokenizer).items():
            if idx < len(out):
                out[idx] = content
        memo["normalized"] = out
    return list(memo["normalized"])


def token_bytes(tokenizer: Any) -> list[bytes]:
    """Each id's surface bytes in running text (special tokens: ``b''``).

    Used by sequence alignment (Appendix B) to place every token on the byte axis of
    the text both tokenizers saw.
    """
    memo = tokenizer_memo(tokenizer)
    if "bytes" not in memo:
        scheme = detect_scheme(tokenizer)
        out = [_token_bytes_one(tok, scheme) if tok else b"" for tok in _raw_tokens(tokenizer)]
        for idx, (content, special) in added_tokens(tokenizer).items():
            if idx < len(out):
                out[idx] = b"" if special else content.encode("utf-8")
        memo["bytes"] = out
    return memo["bytes"]


def vocab_hash(tokenizer: Any) -> str:
    """sha256 of the vocabulary contents (id-ordered strings, added tokens, scheme)."""
    memo = tokenizer_memo(tokenizer)
    if "hash" not in memo:
        scheme = detect_scheme(tokenizer)
        h = hashlib.sha256()
        h.update(f"{scheme.kind}\x00{scheme.marker}\x00".encode())
        h.update("\x1e".join(_raw_tokens(tokenizer)).encode("utf-8", "surrogatepass"))
        for idx, (content, special) in sorted(added_tokens(tokenizer).items()):
            h.update(f"\x1d{idx}\x1f{content}\x1f{int(special)}".encode("utf-8", "surrogatepass"))
        memo["hash"] = h.hexdigest()
    return memo["hash"]



ROLES = ("eos", "bos", "pad", "unk")  # special-token roles, in the order a shared id maps by


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (``all_special_ids`` and special added tokens)."""
    out = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or [] if i is not None}
    out |= {idx for idx, (_content, special) in added_tokens(tokenizer).items() if special}
    return out


def role_ids(tokenizer: Any) -> dict[str, int]:
    """``{role: id}`` for the roles of :data:`ROLES` the tokenizer fills (eos, bos, pad, unk)."""
    out: dict[str, int] = {}
    for role in ROLES:
        idx = getattr(tokenizer, f"{role}_token_id", None)
        if idx is not None:
            out[role] = int(idx)
    return out

