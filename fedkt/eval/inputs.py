"""What the scorer and generation feed a model: token ids and padded tensors.

Texts are encoded as lm-evaluation-harness encodes them (the tokenizer's special prefix,
a context's trailing whitespace moved to its continuation, long sequences cut from the
left), padded into batches, and run under :func:`_inference`: eval mode and
``torch.no_grad``, each sub-module's train/eval flag put back afterwards.  Nothing is
sampled, so results are deterministic for a given model, tokenizer and inputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["encode_scored", "takes_logits_to_keep"]


@contextmanager
def _inference(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode + no_grad; restores every sub-module's previous ``training`` flag."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (peft-wrapped) model's forward computes logits for the last k positions only."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def _device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _special_prefix(tokenizer: Any) -> list[int]:
    """Ids the tokenizer puts *before* the text by default (e.g. Llama's BOS; GPT-2: none)."""
    plain = _encode(tokenizer, "a")
    full = list(tokenizer.encode("a", add_special_tokens=True))
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def _start_token(tokenizer: Any) -> list[int]:
    """A token to condition on when the context is empty (BOS, else EOS)."""
    for tok in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if tok is not None:
            return [int(tok)]
    raise ValueError("empty context and the tokenizer has neither a BOS nor an EOS token")


def _pad_id(tokenizer: Any, model: torch.nn.Module | None = None) -> int:
    config = getattr(model, "config", None) if model is not None else None
    for tok in (getattr(config, "pad_token_id", None), tokenizer.pad_token_id,
                tokenizer.eos_token_id):
        if isinstance(tok, int):
            return tok
    return 0


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest sequence; returns ``(input_ids, attention_mask)``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, cols] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, cols] = 1
    return ids, mask


def _encode_pair(
    tokenizer: Any, context: str, continuation: str, prefix: list[int]
) -> tuple[list[int], list[int]]:
    """Token ids of ``context`` and of ``continuation`` as it continues that context.

    As lm-evaluation-harness: trailing whitespace of the context moves to the
    continuation; the continuation's tokens are those of ``context +
    continuation`` beyond the context's own token count.
    """
    return _encode_example(tokenizer, context, [continuation], prefix)[0]


def _encode_example(
    tokenizer: Any, context: str, continuations: Sequence[str], prefix: list[int]
) -> list[tuple[list[int], list[int]]]:
    """:func:`_encode_pair` of each continuation of one context (the context encoded once;
    every pair holds the same context list)."""
    stripped = context.rstrip()
    moved = context[len(stripped) :]
    plain = _encode(tokenizer, stripped)
    ctx = (prefix + plain) or _start_token(tokenizer)
    out = []
    for continuation in continuations:
        text = moved + continuation
        cont = _encode(tokenizer, stripped + text)[len(plain) :]
        if not cont and text:
            cont = _encode(tokenizer, text)
        out.append((ctx, cont))
    return out


def encode_scored(tokenizer: Any, context: str, continuation: str, max_length: int,
                  prefix: list[int] | None = None) -> tuple[list[int], int]:
    """``(token ids, number of continuation tokens at its end)`` of one scored pair, exactly
    as the scorer sees it (at most ``max_length + 1`` tokens, context cut from the left).
    ``prefix``: the tokenizer's special prefix (computed when None)."""
    if prefix is None:
        prefix = _special_prefix(tokenizer)
    return _scored_seq(*_encode_pair(tokenizer, context, continuation, prefix), max_length)


def _scored_seq(ctx: list[int], cont: list[int], max_length: int) -> tuple[list[int], int]:
    seq = (ctx + cont)[-(max_length + 1) :]
    return seq, min(len(cont), len(seq) - 1)


def _pair_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of row indices, longest first (the first batch is the largest, so memory
    errors come early; rows of a batch have similar lengths, so little is padding)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
