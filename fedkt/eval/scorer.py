"""Multiple-choice scoring by log-likelihood, and the loss of target texts.

Multiple-choice (and classification posed as multiple choice) is scored as
lm-evaluation-harness scores zero-shot ARC / CommonsenseQA: each choice's
log-likelihood given the context is the sum of the log-probabilities of its
tokens; ``acc`` takes the argmax of that sum and ``acc_norm`` the argmax of the
sum divided by the choice's length in characters.  How an example's pairs are
batched is :mod:`fedkt.eval.layout`'s choice; the encoding and padding are
:mod:`fedkt.eval.inputs`'.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fedkt.eval.inputs import (
    _device,
    _encode_example,
    _inference,
    _pad,
    _pad_id,
    _pair_batches,
    _scored_seq,
    _special_prefix,
    encode_scored,
    takes_logits_to_keep,
)
from fedkt.eval.layout import LAYOUTS, model_plan, row_carriers
from fedkt.eval.metrics import accuracy
from fedkt.infra import progress
from fedkt.models.kv_cache import CACHE_KWARG

__all__ = ["mc_accuracy", "mc_predictions", "score_choices", "target_loss"]


def _score_pairs(
    model: torch.nn.Module,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int,
    max_length: int,
    done: Callable[[Sequence[int]], None] | None = None,
) -> list[tuple[float, int]]:
    """``(sum of continuation log-probs, continuation tokens scored)`` per pair.

    Sequences longer than ``max_length`` tokens lose context tokens from the
    left (and, if the continuation alone is longer, its first tokens).  ``done`` is
    called with the indices of the pairs each batch scored (progress).
    """
    if max_length < 1 or batch_size < 1:
        raise ValueError("max_length and batch_size must be at least 1")
    prefix = _special_prefix(tokenizer)
    encoded = [encode_scored(tokenizer, context, continuation, max_length, prefix)
               for context, continuation in pairs]
    return _score_sequences(model, encoded, batch_size=batch_size, pad_id=_pad_id(tokenizer),
                            done=done)


def _score_sequences(
    model: torch.nn.Module,
    encoded: Sequence[tuple[list[int], int]],
    *,
    batch_size: int,
    pad_id: int,
    done: Callable[[Sequence[int]], None] | None = None,
) -> list[tuple[float, int]]:
    """Score ``(token ids, continuation tokens at the end)`` rows as whole sequences, batched
    by length with right padding (the layout lm-evaluation-harness uses)."""
    results: list[tuple[float, int]] = [(0.0, 0)] * len(encoded)
    device = _device(model)
    keeps_logits = takes_logits_to_keep(model)
    with _inference(model):
        for idx in _pair_batches([len(seq) for seq, _ in encoded], batch_size):
            # Right padding keeps each row's positions 0..n-1, so no position ids are needed
            # and causal attention never sees the padding of a row's own tokens.
            ids, mask = _pad([encoded[i][0][:-1] for i in idx], pad_id, "right")
            # Only the positions from the earliest continuation on need the output layer.
            keep = ids.shape[1] - min(len(encoded[i][0]) - 1 - encoded[i][1] for i in idx)
            extra = {"logits_to_keep": keep} if keep < ids.shape[1] and keeps_logits else {}
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           **extra).logits
            # Soft-prompt models prepend virtual tokens: the last positions are the real ones.
            logits = logits[:, -keep:]
            first = ids.shape[1] - keep  # the position logits[:, 0] predicts from
            for row, i in enumerate(idx):
                seq, n = encoded[i]
                if n == 0:
                    continue
                end = len(seq) - 1 - first
                logprobs = logits[row, end - n : end].float().log_softmax(-1)
                targets = torch.tensor(seq[-n:], device=logprobs.device)
                total = logprobs.gather(-1, targets[:, None]).sum().item()
                results[i] = (total, n)
            if done is not None:
                done(idx)
    return results


def score_choices(
    model: torch.nn.Module,
    tokenizer: Any,
    contexts: Sequence[str],
    continuations_per_example: Sequence[Sequence[str]],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    layout: str = "auto",
    trie: bool = True,
) -> list[list[float]]:
    """Log-likelihood of each continuation given its context (sum over its tokens).

    Works for any causal LM whose forward takes ``input_ids`` and ``attention_mask``
    and returns ``logits``, including peft-wrapped (LoRA, prefix or prompt tuning)
    models.  ``layout``: how the pairs are batched (:data:`fedkt.eval.layout.LAYOUTS`;
    the same numbers within float rounding): ``auto`` picks per batch whichever computes
    fewer token positions.  ``trie``: after a shared context, choices whose tokens begin
    alike are scored from one row (:func:`fedkt.eval.layout.carriers`); off, one row per
    choice (the same numbers within float rounding).
    """
    scored = _score_grouped(model, tokenizer, contexts, continuations_per_example,
                            batch_size=batch_size, max_length=max_length, layout=layout,
                            trie=trie)
    return [[score for score, _ in row] for row in scored]


def _score_grouped(
    model: torch.nn.Module,
    tokenizer: Any,
    contexts: Sequence[str],
    continuations_per_example: Sequence[Sequence[str]],
    *,
    batch_size: int,
    max_length: int,
    layout: str = "auto",
    trie: bool = True,
) -> list[list[tuple[float, int]]]:
    """``(log-likelihood, tokens)`` of every (context, continuation), grouped per example,
    in the layout :func:`fedkt.eval.layout.plan_layout` chooses (a soft-prompt model: whole
    sequences)."""
    if len(contexts) != len(continuations_per_example):
        raise ValueError(
            f"{len(contexts)} contexts but {len(continuations_per_example)} lists of continuations"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    prefix = _special_prefix(tokenizer)
    encoded = [_encode_example(tokenizer, context, conts, prefix)
               for context, conts in zip(contexts, continuations_per_example, strict=True)]
    plan = model_plan(model, encoded, batch_size=batch_size, max_length=max_length,
                      layout=layout, trie=trie)
    out: list[list[tuple[float, int]]] = [[(0.0, 0)] * len(pairs) for pairs in encoded]
    device = _device(model)
    pad_id = _pad_id(tokenizer)
    with progress.bar(len(contexts), "eval") as shown:
        shown.update(sum(1 for pairs in encoded if not pairs))
        rows = list(plan.pairs)
        if plan.shared:
            keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
            with _inference(model):
                for chunk, groups in zip(plan.shared, plan.groups, strict=True):
                    if _score_chunk(model, [(i, encoded[i][0][0], [c for _, c in encoded[i]])
                                            for i in chunk], groups, out, device, pad_id, keep,
                                    trie):
                        shown.update(len(chunk))
                    else:  # the forward returned no cache: whole sequences
                        rows += [(i, c) for i in chunk for c in range(len(encoded[i]))]
        left: dict[int, int] = {}
        for i, _ in rows:
            left[i] = left.get(i, 0) + 1

        def scored(batch: Sequence[int]) -> None:  # an example is done with its last choice
            finished = 0
            for p in batch:
                owner = rows[p][0]
                left[owner] -= 1
                finished += left[owner] == 0
            shown.update(finished)

        flat = _score_sequences(model, [_scored_seq(*encoded[i][c], max_length)
                                        for i, c in rows],
                                batch_size=batch_size, pad_id=pad_id, done=scored)
    for (i, c), value in zip(rows, flat, strict=True):
        out[i][c] = value
    return out


def _score_chunk(model: torch.nn.Module, chunk: list[tuple[int, list[int], list[list[int]]]],
                 groups: Sequence[Sequence[int]], out: list[list[tuple[float, int]]],
                 device: torch.device, pad_id: int, keep: dict[str, int], trie: bool = True
                 ) -> bool:
    """One context forward (equal lengths, no padding), then each group of choice rows
    (``groups``: row indices, example by example and choice by choice; see
    :func:`fedkt.eval.layout.choice_groups`) after its own copy of the cache; the context's
    last logits score each choice's first token, and a row's logits its own later tokens
    and, with ``trie``, those of the choices it carries (:func:`fedkt.eval.layout.carriers`).
    False (nothing scored) when choices need the cache and the forward returned none."""
    ctx = torch.tensor([c for _, c, _ in chunk], dtype=torch.long, device=device)
    first = model(input_ids=ctx, attention_mask=torch.ones_like(ctx), use_cache=True, **keep)
    last = first.logits[:, -1].float().log_softmax(-1)  # [E, V]
    rows = [(e, cont) for e, (_, _, conts) in enumerate(chunk) for cont in conts]
    carried = _carried(chunk, trie)
    scores: list[tuple[float, int]] = [
        (last[e, cont[0]].item(), len(cont)) if cont else (0.0, 0) for e, cont in rows]
    cache = getattr(first, CACHE_KWARG, None) if groups else None
    if groups and cache is None:
        return False
    for g, group in enumerate(groups):
        # Selecting rows changes a cache in place: every group but the last takes a copy.
        own = cache if g == len(groups) - 1 else copy.deepcopy(cache)
        own.batch_select_indices(torch.tensor([rows[r][0] for r in group], device=device))
        ids, mask = _pad([rows[r][1][:-1] for r in group], pad_id, "right")
        mask = torch.cat([torch.ones(len(group), ctx.shape[1], dtype=mask.dtype), mask], 1)
        later = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                      **{CACHE_KWARG: own}, use_cache=True).logits
        for pos, row in enumerate(group):
            for r in carried[row]:
                cont = rows[r][1]
                logprobs = later[pos, : len(cont) - 1].float().log_softmax(-1)
                targets = torch.tensor(cont[1:], device=logprobs.device)
                total = scores[r][0] + logprobs.gather(-1, targets[:, None]).sum().item()
                scores[r] = (total, len(cont))
    pos = 0
    for i, _, conts in chunk:
        out[i] = scores[pos : pos + len(conts)]
        pos += len(conts)
    return True


def _carried(chunk: Sequence[tuple[int, list[int], list[list[int]]]], trie: bool
             ) -> dict[int, list[int]]:
    """Per choice row of ``chunk`` (numbered example by example, choice by choice) that runs
    a forward, the rows its logits score: itself, and with ``trie`` the rows it carries."""
    out: dict[int, list[int]] = {}
    for r, owner in enumerate(row_carriers([conts for _, _, conts in chunk], trie)):
        if owner >= 0:
            out.setdefault(owner, []).append(r)
    return out


def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value (the first one on ties)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def mc_predictions(
    scores: Sequence[Sequence[float]], continuations_per_example: Sequence[Sequence[str]]
) -> tuple[list[int], list[int]]:
    """Predicted choice per example: by summed log-prob, and length-normalised.

    The normalisation divides by the choice's length in characters: the
    continuation without the one space that delimits it from the context, as
    lm-evaluation-harness's ``acc_norm`` divides by ``len(choice)`` (other
    leading whitespace counts; an empty choice counts as 1).
    """
    preds, preds_norm = [], []
    for row, conts in zip(scores, continuations_per_example, strict=True):
        if not row:
            raise ValueError("an example has no choices")
        preds.append(_argmax(row))
        lengths = [max(len(c.removeprefix(" ")), 1) for c in conts]
        preds_norm.append(_argmax([s / n for s, n in zip(row, lengths, strict=True)]))
    return preds, preds_norm


def mc_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    contexts: Sequence[str],
    continuations_per_example: Sequence[Sequence[str]],
    golds: Sequence[int],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
) -> dict[str, float]:
    """``{"accuracy", "accuracy_norm"}`` of log-likelihood multiple-choice scoring."""
    scores = score_choices(model, tokenizer, contexts, continuations_per_example,
                           batch_size=batch_size, max_length=max_length)
    preds, preds_norm = mc_predictions(scores, continuations_per_example)
    return {"accuracy": accuracy(preds, golds), "accuracy_norm": accuracy(preds_norm, golds)}


def target_loss(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    targets: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
) -> float:
    """Mean cross-entropy (nats) per target token, over all targets' tokens together."""
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    with progress.bar(len(prompts), "eval loss") as shown:
        scored = _score_pairs(model, tokenizer, list(zip(prompts, targets, strict=True)),
                              batch_size=batch_size, max_length=max_length,
                              done=lambda batch: shown.update(len(batch)))
    tokens = sum(n for _, n in scored)
    return -sum(lp for lp, _ in scored) / tokens if tokens else 0.0
