"""Evaluating language models and classifiers.

Multiple-choice (and classification posed as multiple choice) is scored as
lm-evaluation-harness scores zero-shot ARC / CommonsenseQA: each choice's
log-likelihood given the context is the sum of the log-probabilities of its
tokens; ``acc`` takes the argmax of that sum and ``acc_norm`` the argmax of the
sum divided by the choice's length in characters.  Generation tasks decode
greedily and are scored with ROUGE-L.

Every function runs under ``torch.no_grad`` with the model in eval mode and
puts each sub-module's train/eval flag back afterwards.  Nothing is sampled, so
results are deterministic for a given model, tokenizer and inputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fedkt.eval import predictions
from fedkt.eval.groups import group_accuracies, resolve_groups
from fedkt.eval.metrics import accuracy, macro_f1, precision_recall_f1, rouge_l_scores
from fedkt.infra import progress
from fedkt.infra.timing import timed_evaluation
from fedkt.models.kv_cache import CACHE_KWARG, returned_cache

__all__ = [
    "eval_classifier",
    "evaluate_text_classifier",
    "encode_scored",
    "evaluate_causal_lm",
    "generate",
    "mc_accuracy",
    "mc_predictions",
    "score_choices",
    "takes_logits_to_keep",
    "target_loss",
]

TASKS = ("multiple_choice", "classification", "generation")


# --------------------------------------------------------------------------- helpers


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


def _pair_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of row indices, longest first (the first batch is the largest, so memory
    errors come early; rows of a batch have similar lengths, so little is padding)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


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


# --------------------------------------------------------------------------- scoring


def score_choices(
    model: torch.nn.Module,
    tokenizer: Any,
    contexts: Sequence[str],
    continuations_per_example: Sequence[Sequence[str]],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    layout: str = "auto",
) -> list[list[float]]:
    """Log-likelihood of each continuation given its context (sum over its tokens).

    Works for any causal LM whose forward takes ``input_ids`` and ``attention_mask``
    and returns ``logits``, including peft-wrapped (LoRA, prefix or prompt tuning)
    models.  ``layout``: how the pairs are batched (:data:`LAYOUTS`; the same numbers
    within float rounding): ``auto`` picks per batch whichever computes fewer token
    positions.
    """
    scored = _score_grouped(model, tokenizer, contexts, continuations_per_example,
                            batch_size=batch_size, max_length=max_length, layout=layout)
    return [[score for score, _ in row] for row in scored]


# How the scorer lays out an example's (context, choice) pairs:
# * "shared": one forward of the context, its key/value cache copied to every choice,
#   then one forward of the choices' tokens (contexts of one length per batch);
# * "pairs": each context + choice as one sequence, batched by length (lm-eval's way);
# * "auto": per batch of shared examples, the one with the lower estimated cost.
LAYOUTS = ("auto", "shared", "pairs")
# What a layout costs besides its token positions, in positions through the model (the
# body's work per position), fitted to 272 timed forwards of SmolLM2-135M (fp32, one CPU
# thread; 200 PIQA-style and 100 intent items, each layout forced: docs/performance.md).
# A forward call's fixed cost (small matrix products, per-layer overheads): it is what
# makes a chunk of a few short contexts dearer than its positions say.
CALL_COST = 54.0
# Attention, per (row, new token, position attended to): what makes long rows dearer per
# position than short ones.
ATTENTION_COST = 0.0026


@dataclass
class LayoutPlan:
    """Which examples are scored with a shared context, in which chunks, and the rest.

    ``shared``: chunks of example indices (one context length per chunk); ``pairs``:
    ``(example, choice)`` rows scored as whole sequences; ``cost``: the estimated cost
    (token positions through the model, the output layer's positions weighted by its
    share of the work) of the examples that could take either layout, all ``shared``,
    all ``pairs``, and as ``chosen``.
    """

    shared: list[list[int]]
    pairs: list[tuple[int, int]]
    cost: dict[str, float]


def _head_share(model: torch.nn.Module) -> float:
    """The output layer's work per position relative to the rest of the model's: its
    weights over the other weights that run per position (embeddings aside)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        head = base.get_output_embeddings()
        embed = base.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return 0.0
    if head is None or getattr(head, "weight", None) is None:
        return 0.0
    total = sum(p.numel() for p in base.parameters())
    skip = {id(head.weight)} | ({id(embed.weight)} if getattr(embed, "weight", None)
                                is not None else set())
    body = total - sum(p.numel() for p in base.parameters() if id(p) in skip)
    return head.weight.numel() / max(1, body)


def plan_layout(
    encoded: Sequence[Sequence[tuple[list[int], list[int]]]],
    *,
    batch_size: int,
    max_length: int,
    layout: str = "auto",
    head: float = 0.0,
    logits_to_keep: bool = True,
    call: float = 0.0,
    attention: float = 0.0,
) -> LayoutPlan:
    """Choose per batch between a shared context and whole sequences (:data:`LAYOUTS`).

    ``encoded``: each example's ``(context ids, choice ids)`` pairs.  Examples whose
    pairs fit ``max_length`` are chunked for the shared layout (equal context lengths,
    about ``batch_size`` choice rows a chunk, choices of similar lengths together).  A
    chunk's cost is the positions it computes: its contexts, then every choice row
    padded to the chunk's longest choice.  The same rows as whole sequences cost each
    row's batch width (the rows batched by length as :func:`_score_sequences` batches
    them: padding included).  ``head`` weights the positions that also run the output
    layer (:func:`_head_share`); ``call`` is each forward call's fixed cost (a chunk
    makes two, a batch of whole sequences one, shared by its rows) and ``attention`` the
    cost of each (row, token, attended position) (:data:`CALL_COST`,
    :data:`ATTENTION_COST`).  ``auto`` keeps a chunk shared when it costs less.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if max_length < 1 or batch_size < 1:
        raise ValueError("max_length and batch_size must be at least 1")
    rows = [(i, c) for i, pairs in enumerate(encoded) for c in range(len(pairs))]
    eligible = [
        i for i, pairs in enumerate(encoded)
        if pairs and all(len(ctx) + len(cont) <= max_length + 1 for ctx, cont in pairs)]
    # Whole-sequence cost of every row, from the batches they would form.
    seqs = {r: _scored_seq(*encoded[r[0]][r[1]], max_length) for r in rows}
    lengths = [len(seqs[r][0]) - 1 for r in rows]
    pair_cost: dict[tuple[int, int], float] = {}
    for batch in _pair_batches(lengths, batch_size):
        width = max(lengths[k] for k in batch)
        keep = (width - min(lengths[k] - seqs[rows[k]][1] for k in batch)
                if logits_to_keep else width)
        for k in batch:
            pair_cost[rows[k]] = (width + head * keep + call / len(batch)
                                  + attention * width * (width + 1) / 2)
    by_length: dict[int, list[int]] = {}
    for i in eligible:
        by_length.setdefault(len(encoded[i][0][0]), []).append(i)
    shared: list[list[int]] = []
    cost = {"shared": 0.0, "pairs": 0.0, "chosen": 0.0}
    for length, group in by_length.items():
        group.sort(key=lambda i: -max(len(cont) for _, cont in encoded[i]))
        chunk: list[int] = []
        for n, i in enumerate(group):  # chunks of about batch_size (example, choice) rows
            chunk.append(i)
            size = sum(len(encoded[e]) for e in chunk)
            if n + 1 < len(group) and size + len(encoded[group[n + 1]]) <= batch_size:
                continue
            width = max(len(cont) for e in chunk for _, cont in encoded[e]) - 1
            positions = len(chunk) * length + size * max(0, width)
            own = positions + head * (len(chunk) * (1 if logits_to_keep else length)
                                      + size * max(0, width))
            own += call * (2 if width > 0 else 1) + attention * (
                len(chunk) * length * (length + 1) / 2
                + size * max(0, width) * (length + (max(0, width) + 1) / 2))
            whole = sum(pair_cost[(e, c)] for e in chunk for c in range(len(encoded[e])))
            cost["shared"] += own
            cost["pairs"] += whole
            if layout == "shared" or (layout == "auto" and own <= whole):
                shared.append(chunk)
            cost["chosen"] += own if shared and shared[-1] is chunk else whole
            chunk = []
    taken = {i for chunk in shared for i in chunk}
    return LayoutPlan(shared, [r for r in rows if r[0] not in taken], cost)


def model_plan(model: torch.nn.Module,
               encoded: Sequence[Sequence[tuple[list[int], list[int]]]], *,
               batch_size: int, max_length: int, layout: str = "auto") -> LayoutPlan:
    """:func:`plan_layout` priced for ``model``: its output layer's share, whether it keeps
    only the logits asked for, the fitted call and attention costs; a soft-prompt model
    scores whole sequences."""
    return plan_layout(encoded, batch_size=batch_size, max_length=max_length,
                       layout=layout if _shares_context(model) else "pairs",
                       head=_head_share(model), logits_to_keep=takes_logits_to_keep(model),
                       call=CALL_COST, attention=ATTENTION_COST)


def _score_grouped(
    model: torch.nn.Module,
    tokenizer: Any,
    contexts: Sequence[str],
    continuations_per_example: Sequence[Sequence[str]],
    *,
    batch_size: int,
    max_length: int,
    layout: str = "auto",
) -> list[list[tuple[float, int]]]:
    """``(log-likelihood, tokens)`` of every (context, continuation), grouped per example,
    in the layout :func:`plan_layout` chooses (a soft-prompt model: whole sequences)."""
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
                      layout=layout)
    out: list[list[tuple[float, int]]] = [[(0.0, 0)] * len(pairs) for pairs in encoded]
    device = _device(model)
    pad_id = _pad_id(tokenizer)
    with progress.bar(len(contexts), "eval") as shown:
        shown.update(sum(1 for pairs in encoded if not pairs))
        if plan.shared:
            keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
            with _inference(model):
                for chunk in plan.shared:
                    _score_chunk(model, [(i, encoded[i][0][0], [c for _, c in encoded[i]])
                                         for i in chunk], out, device, pad_id, keep)
                    shown.update(len(chunk))
        left: dict[int, int] = {}
        for i, _ in plan.pairs:
            left[i] = left.get(i, 0) + 1

        def scored(batch: Sequence[int]) -> None:  # an example is done with its last choice
            finished = 0
            for p in batch:
                owner = plan.pairs[p][0]
                left[owner] -= 1
                finished += left[owner] == 0
            shown.update(finished)

        flat = _score_sequences(model, [_scored_seq(*encoded[i][c], max_length)
                                        for i, c in plan.pairs],
                                batch_size=batch_size, pad_id=pad_id, done=scored)
    for (i, c), value in zip(plan.pairs, flat, strict=True):
        out[i][c] = value
    return out


def _shares_context(model: torch.nn.Module) -> bool:
    """Whether choices may reuse their context's key/value cache (not for soft prompts,
    which peft re-inserts on every forward)."""
    peft_config = getattr(model, "active_peft_config", None)
    return not getattr(peft_config, "is_prompt_learning", False)


def _score_chunk(model: torch.nn.Module, chunk: list[tuple[int, list[int], list[list[int]]]],
                 out: list[list[tuple[float, int]]], device: torch.device, pad_id: int,
                 keep: dict[str, int]) -> None:
    """One context forward (equal lengths, no padding), then every choice's tokens after
    the copied cache; the context's last logits score each choice's first token."""
    ctx = torch.tensor([c for _, c, _ in chunk], dtype=torch.long, device=device)
    first = model(input_ids=ctx, attention_mask=torch.ones_like(ctx), use_cache=True, **keep)
    last = first.logits[:, -1].float().log_softmax(-1)  # [E, V]
    rows = [(e, cont) for e, (_, _, conts) in enumerate(chunk) for cont in conts]
    width = max(len(cont) for _, cont in rows) - 1
    later = None
    if width > 0:
        cache = returned_cache(first)
        cache.batch_select_indices(torch.tensor([e for e, _ in rows], device=device))
        ids, mask = _pad([cont[:-1] or [pad_id] for _, cont in rows], pad_id, "right")
        mask[[len(cont) <= 1 for _, cont in rows]] = 0
        mask = torch.cat([torch.ones(len(rows), ctx.shape[1], dtype=mask.dtype), mask], 1)
        later = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                      **{CACHE_KWARG: cache}, use_cache=True).logits
    scores: list[tuple[float, int]] = []
    for r, (e, cont) in enumerate(rows):
        if not cont:
            scores.append((0.0, 0))
            continue
        total = last[e, cont[0]].item()
        if len(cont) > 1 and later is not None:
            logprobs = later[r, : len(cont) - 1].float().log_softmax(-1)
            targets = torch.tensor(cont[1:], device=logprobs.device)
            total += logprobs.gather(-1, targets[:, None]).sum().item()
        scores.append((total, len(cont)))
    pos = 0
    for i, _, conts in chunk:
        out[i] = scores[pos : pos + len(conts)]
        pos += len(conts)


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


# --------------------------------------------------------------------------- generation


def _cut(text: str, stop: Sequence[str]) -> str:
    """Drop leading whitespace, cut at the first stop string, strip."""
    text = text.lstrip()
    for s in stop:
        at = text.find(s)
        if at >= 0:
            text = text[:at]
    return text.strip()


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    ids: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for tok in (config_eos, tokenizer.eos_token_id):
        if isinstance(tok, int):
            ids.add(tok)
        elif isinstance(tok, list | tuple):
            ids.update(int(t) for t in tok)
    return sorted(ids)


def generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 48,
    batch_size: int = 8,
    *,
    max_length: int | None = None,
    stop: Sequence[str] = ("\n",),
) -> list[str]:
    """Greedy continuations of ``prompts`` (batched, left padding).

    Each continuation is cut at the first EOS token, then (after leading
    whitespace is dropped) at the first ``stop`` string, and stripped.  With
    ``max_length``, prompts keep their last ``max_length - max_new_tokens``
    tokens.
    """
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    prefix = _special_prefix(tokenizer)
    encoded = [(prefix + _encode(tokenizer, p)) or _start_token(tokenizer) for p in prompts]
    if max_length is not None:
        keep = max(1, max_length - max_new_tokens)
        encoded = [seq[-keep:] for seq in encoded]
    eos = _eos_ids(model, tokenizer)
    pad_id = _pad_id(tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
        pad_token_id=pad_id, eos_token_id=eos or None,
    )

    class _StopStrings(StoppingCriteria):
        def __init__(self, width: int) -> None:
            self.width = width

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            done = [any(s in tokenizer.decode(row[self.width :], skip_special_tokens=True)
                        .lstrip() for s in stop) for row in input_ids.tolist()]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    outputs: list[str] = [""] * len(encoded)
    device = _device(model)
    with _inference(model), progress.bar(len(order), "generate") as shown:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            shown.update(len(idx))
            ids, mask = _pad([encoded[i] for i in idx], pad_id, "left")
            width = ids.shape[1]
            criteria = StoppingCriteriaList([_StopStrings(width)] if stop else [])
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 generation_config=config, stopping_criteria=criteria)
            for row, i in enumerate(idx):
                new = out[row, width:].tolist()
                cut = next((k for k, tok in enumerate(new) if tok in eos), len(new))
                text = tokenizer.decode(new[:cut], skip_special_tokens=True)
                outputs[i] = _cut(text, stop)
    return outputs


# --------------------------------------------------------------------------- classifiers


@timed_evaluation
def eval_classifier(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    labels: Sequence[int],
    *,
    batch_size: int = 8,
    max_length: int = 256,
    positive_label: int = 1,
    ids: Sequence[str] | None = None,
    class_groups: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Metrics of a sequence classifier (``model(...).logits`` of shape [batch, classes]).

    Returns accuracy, precision/recall/F1 of ``positive_label``, macro-F1 and
    the mean cross-entropy loss per example, and ``accuracy_<name>`` of each of
    ``class_groups`` (``eval.class_groups``; :mod:`fedkt.eval.groups`).
    """
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    example_ids = list(ids) if ids is not None else list(range(len(texts)))
    if not texts:
        return {"accuracy": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0,
                "macro_f1": 0.0, "loss": 0.0}
    device = _device(model)
    pad_id = _pad_id(tokenizer, model)
    side = getattr(tokenizer, "padding_side", "right")
    encoded = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    # Longest first, so each batch pads to similar lengths; predictions go back in order.
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
    preds: list[int] = [0] * len(texts)
    losses: list[float] = [0.0] * len(texts)
    with _inference(model), progress.bar(len(order), "eval") as shown:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            shown.update(len(idx))
            gold = torch.tensor([int(labels[i]) for i in idx], dtype=torch.long)
            ids, mask = _pad([encoded[i] for i in idx], pad_id, side)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            logits = logits.float().cpu()
            per_example = F.cross_entropy(logits, gold, reduction="none").tolist()
            for row, i in enumerate(idx):
                preds[i] = int(logits[row].argmax())
                losses[i] = per_example[row]
    loss_sum = sum(losses)
    golds = [int(y) for y in labels]
    p, r, f1 = precision_recall_f1(preds, golds, positive_label)
    groups = resolve_groups(class_groups, int(logits.shape[-1]))
    predictions.emit({"id": example_ids, "gold": golds, "pred": preds}, task="classifier",
                     positive_label=positive_label,
                     **({"class_groups": groups} if groups else {}))
    return {"accuracy": accuracy(preds, golds), "precision": p, "recall": r, "f1": f1,
            "macro_f1": macro_f1(preds, golds), "loss": loss_sum / len(texts),
            **group_accuracies(preds, golds, groups)}


def evaluate_text_classifier(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    *,
    batch_size: int = 8,
    max_length: int = 256,
    positive_label: int = 1,
    class_groups: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """:func:`eval_classifier` on classification records ``{"text", "label"}``."""
    return eval_classifier(model, tokenizer, [r["text"] for r in records],
                           [int(r["label"]) for r in records], batch_size=batch_size,
                           max_length=max_length, positive_label=positive_label,
                           ids=_ids(records), class_groups=class_groups)


# --------------------------------------------------------------------------- dispatcher


@timed_evaluation
def evaluate_causal_lm(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    task: str,
    label_names: Sequence[str] | None = None,
    *,
    batch_size: int = 8,
    max_length: int = 256,
    max_new_tokens: int = 48,
    positive_label: int = 1,
    template: str | None = None,
    class_groups: Mapping[str, Any] | None = None,
    chat: Any = None,
) -> dict[str, float]:
    """Evaluate a causal LM on normalised records of ``task``.

    ``chat`` (a :class:`fedkt.data.formatting.ChatFormat`) wraps each prompt in the
    model's chat template; the target and choices are the assistant's reply.

    multiple_choice / classification: ``accuracy`` and ``accuracy_norm`` by
    choice log-likelihood, and ``accuracy_<name>`` of each of ``class_groups``
    (``eval.class_groups``, over the gold label or choice index; :mod:`fedkt.eval.groups`).
    Classification scores the label names as the
    choices and adds ``macro_f1``, and for binary tasks ``precision``/``recall``/
    ``f1`` of ``positive_label``.  generation: ``rougeL`` of greedy outputs against
    ``references`` (or the target).
    Every task: ``loss``, the mean cross-entropy per target token of the
    records' (prompt, target) pairs.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    if not records:
        raise ValueError("no records to evaluate")
    from fedkt.data.formatting import lm_pair, mc_view

    groups = resolve_groups(class_groups, len(label_names) if task == "classification"
                            and label_names is not None else None) if task != "generation" else {}

    names = list(label_names) if label_names is not None else None
    pairs = [lm_pair(r, task, names, template, chat) for r in records]
    prompts = [p for p, _ in pairs]
    if task == "generation":
        out = {"loss": target_loss(model, tokenizer, prompts, [t for _, t in pairs],
                                   batch_size=batch_size, max_length=max_length)}
        preds = generate(model, tokenizer, prompts, max_new_tokens, batch_size,
                         max_length=max_length)
        refs = [list(r.get("references") or []) or [t] for r, (_, t) in zip(records, pairs,
                                                                             strict=True)]
        per_item = rouge_l_scores(preds, refs)
        out["rougeL"] = sum(per_item) / len(per_item)
        predictions.emit({"id": _ids(records), "gold": [r[0] for r in refs], "pred": preds,
                          "rougeL": per_item}, task=task)
        return out
    views = [mc_view(r, task, names, template, chat) for r in records]
    contexts = [v[0] for v in views]
    choices = [list(v[1]) for v in views]
    golds = [int(v[2]) for v in views]
    scored = _score_grouped(model, tokenizer, contexts, choices, batch_size=batch_size,
                            max_length=max_length)
    if all(pair == (ctx, conts[g]) for pair, ctx, conts, g
           in zip(pairs, contexts, choices, golds, strict=True)):
        # The (prompt, target) pairs are the gold choices already scored: reuse them.
        tokens = sum(row[g][1] for row, g in zip(scored, golds, strict=True))
        total = sum(row[g][0] for row, g in zip(scored, golds, strict=True))
        loss = -total / tokens if tokens else 0.0
    else:
        loss = target_loss(model, tokenizer, prompts, [t for _, t in pairs],
                           batch_size=batch_size, max_length=max_length)
    out = {"loss": loss}
    scores = [[lp for lp, _ in row] for row in scored]
    preds, preds_norm = mc_predictions(scores, choices)
    out["accuracy"] = accuracy(preds, golds)
    out["accuracy_norm"] = accuracy(preds_norm, golds)
    meta: dict[str, Any] = {"task": task}
    if task == "classification":
        num_labels = len(choices[0])
        if num_labels == 2:  # P/R/F1 of one positive class only mean something when binary
            p, r, f1 = precision_recall_f1(preds, golds, positive_label)
            out.update(precision=p, recall=r, f1=f1)
            meta["positive_label"] = positive_label
        out["macro_f1"] = macro_f1(preds, golds, range(num_labels))
        meta["labels"] = list(range(num_labels))
    if groups:
        out.update(group_accuracies(preds, golds, groups))
        meta["class_groups"] = groups
    predictions.emit({"id": _ids(records), "gold": golds, "pred": preds, "pred_norm": preds_norm,
                      "scores": scores}, **meta)
    return out


def _ids(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each record's ``id`` (its position when it has none)."""
    return [str(r.get("id", i)) for i, r in enumerate(records)]
