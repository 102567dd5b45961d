"""Tokenizers for the ``tiny-*`` presets, trained on the project's own text.

Each preset gets its own tokenizer, built in the style of the family it is named
after, so that heterogeneous runs really do have to align different vocabularies:

- ``tiny-gpt2``: byte-level BPE (``Ġ`` marks a space), GPT-2's split, 2,000 tokens,
  ``<|endoftext|>`` as bos/eos/unk/pad.
- ``tiny-opt``: byte-level BPE with a prefix space and its own split (contractions kept,
  digits in threes), 2,500 tokens, ``<s> <pad> </s> <unk>``; ``</s>`` is bos and eos and
  is put before every sequence, as OPT does.
- ``tiny-llama``: SentencePiece-style BPE (``▁`` marks a space) with byte fallback
  (``<0x00>``..``<0xFF>``), 1,800 tokens, ``<unk> <s> </s>``; ``<s>`` is prepended.
- ``tiny-bloom``: byte-level BPE split at punctuation, 3,000 tokens,
  ``<unk> <s> </s> <pad>``.
- ``tiny-qwen2``: byte-level BPE, NFC, one digit per token, 2,200 tokens,
  ``<|endoftext|>`` (eos and pad, no bos), ``<|im_start|>``, ``<|im_end|>``.
- ``tiny-bert``: lower-case WordPiece (``##`` continuation), 2,000 tokens,
  ``[PAD] [UNK] [CLS] [SEP] [MASK]``, for the encoder preset.

Training is deterministic and done once: the result is saved under
``<cache>/tokenizers/`` with a key hashed from the preset, its vocabulary size, the
training corpus and :data:`TOKENIZER_FORMAT`.

The corpus is the text of the vendored datasets named in :data:`CORPUS_FOLDERS`
(``fedkt/data/vendored/<folder>/**/*.jsonl``, train files only, a bounded amount per file)
when present, else the small DialogSum extract shipped as ``fedkt/models/corpus.txt`` (MIT,
see its header).  A dataset vendored later does not join it: every tiny tokenizer, and so
every tiny model's numbers, stays what it was.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers as tk_trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from fedkt.infra.cache import cache_dir, cached
from fedkt.models.offline import ModelError

__all__ = [
    "TINY_TOKENIZERS",
    "TOKENIZER_FORMAT",
    "TokenizerSpec",
    "corpus_digest",
    "corpus_texts",
    "ensure_pad_token",
    "load_tiny_tokenizer",
]

# Bump when the way tokenizers are built changes: cached tokenizers are then rebuilt.
TOKENIZER_FORMAT = 3

_MODELS_DIR = Path(__file__).resolve().parent
VENDORED_DIR = _MODELS_DIR.parent / "data" / "vendored"
FALLBACK_CORPUS = _MODELS_DIR / "corpus.txt"
# Bound on the characters taken from one vendored file (keeps training around a second).
_CHARS_PER_FILE = 300_000
_MIN_VENDORED_CHARS = 50_000
_HELD_OUT = ("test", "dev", "val")
# The vendored folders whose text trains the tiny tokenizers, fixed: a new vendored dataset
# (Banking77, ARC, ...) must not retrain them.
CORPUS_FOLDERS = ("bigbench", "dialogsum", "tweeteval")


# --------------------------------------------------------------------------- corpus


def _strings(value: object) -> Iterator[str]:
    """Every string inside a JSON value, depth first, in key order."""
    if isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _corpus_files(root: Path) -> list[Path]:
    """The train files of :data:`CORPUS_FOLDERS` under ``root``, in a stable order."""
    if not root.is_dir():
        return []
    return sorted(p for folder in CORPUS_FOLDERS for p in (root / folder).rglob("*.jsonl")
                  if p.is_file())


def _vendored_texts(root: Path) -> list[str]:
    texts: list[str] = []
    files = _corpus_files(root)
    for path in files:
        if any(tag in path.stem.lower() for tag in _HELD_OUT):
            continue
        taken = 0
        try:
            with path.open(encoding="utf-8") as fh:
                for line in fh:
                    if taken >= _CHARS_PER_FILE:
                        break
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    for s in _strings(record):
                        texts.append(s)
                        taken += len(s)
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def _fallback_texts() -> list[str]:
    lines = FALLBACK_CORPUS.read_text(encoding="utf-8").splitlines()
    return [ln for ln in lines if ln.strip() and not ln.startswith("##")]


def _dir_signature(root: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in _corpus_files(root))


@functools.lru_cache(maxsize=4)
def _corpus(signature: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, ...], str]:
    texts = _vendored_texts(VENDORED_DIR) if signature else []
    if sum(len(t) for t in texts) < _MIN_VENDORED_CHARS:
        texts = _fallback_texts()
    digest = hashlib.sha256()
    for t in texts:
        digest.update(t.encode("utf-8"))
        digest.update(b"\x00")
    return tuple(texts), digest.hexdigest()


def corpus_texts() -> list[str]:
    """The tokenizer training corpus: vendored dataset text, else the shipped extract."""
    return list(_corpus(_dir_signature(VENDORED_DIR))[0])


def corpus_digest() -> str:
    """sha256 of the training corpus (part of every tiny tokenizer's cache key)."""
    return _corpus(_dir_signature(VENDORED_DIR))[1]


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class TokenizerSpec:
    """How one preset's tokenizer is built."""

    preset: str
    vocab_size: int
    # Special tokens in id order (they take the first ids).
    specials: tuple[str, ...]
    # bos/eos/pad/unk (and cls/sep/mask) for ``PreTrainedTokenizerFast``.
    roles: dict[str, str]
    build: Callable[[TokenizerSpec, list[str]], Tokenizer]
    min_frequency: int = 2
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")


def _byte_level(
    spec: TokenizerSpec,
    texts: list[str],
    *,
    split: str | None = None,
    prefix_space: bool = False,
    normalizer: normalizers.Normalizer | None = None,
    prepend: str | None = None,
) -> Tokenizer:
    """Byte-level BPE (``Ġ`` marks a space).

    ``split``: own pre-split regex instead of GPT-2's; ``prefix_space``: a space is put
    before the text (so a first word is tokenised like any other) and taken off again
    when decoding; ``prepend``: a token put before every sequence.
    """
    tok = Tokenizer(models.BPE())
    norms = [normalizer] if normalizer is not None else []
    if prefix_space:
        norms.append(normalizers.Prepend(" "))
    if norms:
        tok.normalizer = norms[0] if len(norms) == 1 else normalizers.Sequence(norms)
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    if prefix_space:
        tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    trainer = tk_trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=list(spec.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if prepend is None:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = _prepend(tok, prepend)
    return tok


def _alphabet(
    texts: list[str], size: int, normalizer: normalizers.Normalizer | None, space: str | None
) -> list[str]:
    """The ``size`` most frequent characters, ties broken by code point.

    Passed to the trainers as their whole alphabet: their own cut at ``limit_alphabet``
    breaks ties between equally frequent characters differently from run to run.
    ``space``: what a space becomes (``None``: whitespace is dropped).
    """
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(normalizer.normalize_str(text) if normalizer is not None else text)
    if space is None:
        for ch in [c for c in counts if c.isspace()]:
            del counts[ch]
    elif " " in counts:
        counts[space] += counts.pop(" ")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [ch for ch, _ in ranked[:size]]


def _prepend(tok: Tokenizer, token: str) -> processors.PostProcessor:
    tid = tok.token_to_id(token)
    return processors.TemplateProcessing(
        single=f"{token} $A", pair=f"{token} $A {token} $B:1", special_tokens=[(token, tid)]
    )


def _metaspace(spec: TokenizerSpec, texts: list[str]) -> Tokenizer:
    """SentencePiece-style BPE: ``▁`` marks a space, unknown characters fall back to bytes."""
    n_bytes = 256
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = _alphabet(texts, 100, None, "▁")
    trainer = tk_trainers.BpeTrainer(
        vocab_size=spec.vocab_size - n_bytes,
        min_frequency=spec.min_frequency,
        special_tokens=list(spec.specials),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Insert the 256 byte tokens right after the specials (Llama's layout: <0x00> is id 3).
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    n_special = len(spec.specials)
    new_vocab = {t: i for t, i in vocab.items() if i < n_special}
    new_vocab.update({f"<0x{b:02X}>": n_special + b for b in range(n_bytes)})
    new_vocab.update({t: i + n_bytes for t, i in vocab.items() if i >= n_special})
    data["model"]["vocab"] = new_vocab
    tok = Tokenizer.from_str(json.dumps(data))
    tok.decoder = decoders.Sequence(
        [
            decoders.ByteFallback(),
            decoders.Metaspace(replacement="▁", prepend_scheme="first"),
        ]
    )
    tok.post_processor = _prepend(tok, "<s>")
    return tok


def _wordpiece(spec: TokenizerSpec, texts: list[str]) -> Tokenizer:
    """BERT-style WordPiece (lower case, ``##`` continuation), ``[CLS] A [SEP]`` framing."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    alphabet = _alphabet(texts, 200, tok.normalizer, None)
    # The trainer numbers "##x" pieces in the order it meets words (not reproducible),
    # and ids break ties between merges: fix their ids by listing them up front, then
    # take them out of the special tokens again.
    continuing = [f"##{ch}" for ch in alphabet]
    trainer = tk_trainers.WordPieceTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=list(spec.specials) + continuing,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in spec.specials]
    tok = Tokenizer.from_str(json.dumps(data))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tok


# OPT variant: contractions stay on their word, digits go in groups of up to three.
_OPT_SPLIT = r" ?\p{L}+(?:'\p{L}+)?| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Bloom-like split: words keep a leading space, runs of punctuation stand alone.
_BLOOM_SPLIT = r" ?[^\s.,!?;:\"()]+|[.,!?;:\"()]+|\s+"
# Qwen-like split: contractions any case, letters with one leading symbol, one digit at a time.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TINY_TOKENIZERS: dict[str, TokenizerSpec] = {
    "tiny-gpt2": TokenizerSpec(
        "tiny-gpt2",
        2000,
        ("<|endoftext|>",),
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
        lambda s, t: _byte_level(s, t),
    ),
    "tiny-opt": TokenizerSpec(
        "tiny-opt",
        2500,
        ("<s>", "<pad>", "</s>", "<unk>"),
        {"bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
        lambda s, t: _byte_level(s, t, split=_OPT_SPLIT, prefix_space=True, prepend="</s>"),
        min_frequency=3,
    ),
    "tiny-llama": TokenizerSpec(
        "tiny-llama",
        1800,
        ("<unk>", "<s>", "</s>"),
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        _metaspace,
    ),
    "tiny-bloom": TokenizerSpec(
        "tiny-bloom",
        3000,
        ("<unk>", "<s>", "</s>", "<pad>"),
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
        lambda s, t: _byte_level(s, t, split=_BLOOM_SPLIT),
    ),
    "tiny-qwen2": TokenizerSpec(
        "tiny-qwen2",
        2200,
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        lambda s, t: _byte_level(s, t, split=_QWEN_SPLIT, normalizer=normalizers.NFC()),
    ),
    "tiny-bert": TokenizerSpec(
        "tiny-bert",
        2000,
        ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
        _wordpiece,
        input_names=("input_ids", "token_type_ids", "attention_mask"),
    ),
}


# --------------------------------------------------------------------------- loading


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give ``tokenizer`` a pad token if it has none: eos, else unk, else bos.

    Raises :class:`ModelError` when none of these exist (adding a new token would need
    the model's embeddings resized, which the caller must decide).
    """
    if tokenizer.pad_token is None:
        for role in ("eos_token", "unk_token", "bos_token"):
            token = getattr(tokenizer, role)
            if token is not None:
                tokenizer.pad_token = token
                break
        else:
            raise ModelError(
                f"tokenizer {type(tokenizer).__name__} has no pad, eos, unk or bos token; "
                "set one before use"
            )
    return tokenizer


def _cache_key(spec: TokenizerSpec, vocab_size: int, digest: str) -> str:
    payload = json.dumps(
        {
            "format": TOKENIZER_FORMAT,
            "preset": spec.preset,
            "vocab_size": vocab_size,
            "specials": spec.specials,
            "roles": spec.roles,
            "min_frequency": spec.min_frequency,
            "corpus": digest,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _wrap(tok: Tokenizer, spec: TokenizerSpec, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=model_max_length,
        model_input_names=list(spec.input_names),
        **spec.roles,
    )


def tiny_tokenizer_dir(preset: str, vocab_size: int | None = None) -> Path:
    """Folder holding the trained tokenizer for ``preset`` (training it once if needed)."""
    spec = TINY_TOKENIZERS.get(preset)
    if spec is None:
        raise ModelError(
            f"unknown tiny tokenizer {preset!r}; allowed: {', '.join(sorted(TINY_TOKENIZERS))}"
        )
    size = int(vocab_size or spec.vocab_size)
    floor = len(spec.specials) + (512 if preset == "tiny-llama" else 300)
    if size < floor:
        raise ModelError(f"{preset}: vocab_size {size} is too small (at least {floor})")
    if size != spec.vocab_size:
        spec = dataclasses.replace(spec, vocab_size=size)
    texts = corpus_texts()
    key = _cache_key(spec, size, corpus_digest())
    target = cache_dir("tokenizers") / f"{preset}-{size}-{key}"

    def train(tmp: Path) -> Path:
        _wrap(spec.build(spec, texts), spec, 1024).save_pretrained(str(tmp))
        return target

    def complete(folder: Path) -> Path:
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json")
        return folder

    return cached(target, train, complete)


def load_tiny_tokenizer(
    preset: str, vocab_size: int | None = None, model_max_length: int = 1024
) -> PreTrainedTokenizerFast:
    """The trained tokenizer of a tiny preset, with a pad token."""
    folder = tiny_tokenizer_dir(preset, vocab_size)
    spec = TINY_TOKENIZERS[preset]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return ensure_pad_token(_wrap(tok, spec, model_max_length))
