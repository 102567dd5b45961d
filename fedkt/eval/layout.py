"""The scorer's cost planner: which examples share a context's forward, and in which chunks.

:func:`plan_layout` prices each chunk of examples both ways (a shared context, then the
choices after its copied cache; or each context + choice as one sequence, batched by
length) and keeps the cheaper; :func:`model_plan` prices it for one model.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedkt.eval.inputs import _pair_batches, _scored_seq, takes_logits_to_keep
from fedkt.models.kv_cache import CACHE_KWARG

__all__ = ["ATTENTION_COST", "CALL_COST", "LAYOUTS", "LayoutPlan", "carriers", "choice_groups",
           "model_plan", "plan_layout", "row_carriers", "row_widths"]


# How the scorer lays out an example's (context, choice) pairs:
# * "shared": one forward of the context, its key/value cache copied to every choice,
#   then one forward of the choices' tokens (contexts of one length per batch);
# * "pairs": each context + choice as one sequence, batched by length (lm-eval's way);
# * "auto": per batch of shared examples, the one with the lower estimated cost.
LAYOUTS = ("auto", "shared", "pairs")
# What a layout costs besides its token positions, in positions through the model (the
# body's work per position), fitted to 272 timed forwards of SmolLM2-135M (fp32, one CPU
# thread; 200 PIQA-style and 100 intent items, each layout forced: docs/records/performance.md).
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
    all ``pairs``, and as ``chosen``; ``groups``: per shared chunk, its choice rows
    (numbered example by example, choice by choice) in the forwards that run them after
    the context (:func:`choice_groups`; rows of a single token need none).
    """

    shared: list[list[int]]
    pairs: list[tuple[int, int]]
    cost: dict[str, float]
    groups: list[list[list[int]]] = field(default_factory=list)


def carriers(conts: Sequence[Sequence[int]], trie: bool = True) -> list[int]:
    """The label trie of one example's choices: for each choice, the choice whose row (its
    forward after the context) computes its scores; -1 for a choice that needs no row
    (without ``trie``: each choice of more than one token its own row).

    ``conts``: each choice's tokens after the context.  Its first token is scored from the
    context's last logits; token j >= 1 from the logits after its tokens before j, so a row
    runs its tokens but the last.  Where one choice's tokens but the last begin another's
    (``oil change how`` and ``oil change when``; ``card`` and ``card arrival``), the longer
    row's logits score both: each distinct run of tokens is computed once, as in a trie of
    the labels.  The longest run (the first of equals) carries a group; deterministic.
    """
    runs = [tuple(cont[:-1]) for cont in conts]
    if not trie:
        return [c if run else -1 for c, run in enumerate(runs)]
    order = sorted((c for c, run in enumerate(runs) if run), key=lambda c: (-len(runs[c]), c))
    out = [-1] * len(conts)
    owner: dict[tuple[int, ...], int] = {}  # every beginning of a carrying row -> its choice
    for c in order:
        found = owner.get(runs[c])
        if found is None:
            found = c
            for k in range(1, len(runs[c]) + 1):
                owner.setdefault(runs[c][:k], c)
        out[c] = found
    return out


def row_carriers(conts_per_example: Sequence[Sequence[Sequence[int]]], trie: bool = True
                 ) -> list[int]:
    """:func:`carriers` of several examples' choices, numbered as one list of rows (example
    by example, choice by choice): each row's carrying row, -1 for none."""
    out: list[int] = []
    for conts in conts_per_example:
        start = len(out)
        out += [start + o if o >= 0 else -1 for o in carriers(conts, trie)]
    return out


def row_widths(conts_per_example: Sequence[Sequence[Sequence[int]]], trie: bool = True
               ) -> list[int]:
    """Each choice row's tokens after its context's last, example by example and choice by
    choice (:func:`choice_groups`' ``widths``): 0 for a row that runs no forward (one token,
    or, with ``trie``, carried by another row of its example: :func:`row_carriers`)."""
    conts = [cont for example in conts_per_example for cont in example]
    return [len(cont) - 1 if carrier == r else 0
            for r, (cont, carrier) in enumerate(zip(conts, row_carriers(conts_per_example, trie),
                                                    strict=True))]


def choice_groups(widths: Sequence[int], context: int, *, head: float = 0.0,
                  call: float = 0.0, attention: float = 0.0) -> tuple[list[list[int]], float]:
    """The choice rows of a shared chunk split into forwards after the context's cache, and
    their cost.

    ``widths``: each row's tokens after the context's last (its length but one; 0 needs
    no forward).  Each forward pads its rows to its widest, so one forward of 77 labels of
    3 to 17 tokens computes 77 x 16 positions where 390 are real; more forwards pad less
    but each costs ``call``.  The rows, sorted by width, are cut into the consecutive
    groups of least total cost (positions x (1 + ``head``), ``call`` a forward,
    ``attention`` per attended position over ``context`` and the row's own tokens):
    exact, by dynamic programming over the cut points.  Returns ``(groups of row indices,
    narrowest first; cost)``.
    """
    order = sorted((i for i, w in enumerate(widths) if w > 0), key=lambda i: (widths[i], i))
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        width = widths[order[end - 1]]
        per_row = width * (1 + head) + attention * width * (context + (width + 1) / 2)
        for start in range(end):
            cost = best[start] + (end - start) * per_row + call
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups: list[list[int]] = []
    end = len(order)
    while end:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1], best[-1]


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
    trie: bool = True,
) -> LayoutPlan:
    """Choose per batch between a shared context and whole sequences (:data:`LAYOUTS`).

    ``encoded``: each example's ``(context ids, choice ids)`` pairs.  Examples whose
    pairs fit ``max_length`` are chunked for the shared layout (equal context lengths,
    about ``batch_size`` choice rows a chunk, choices of similar lengths together).  A
    chunk's cost is the positions it computes: its contexts, then its choice rows in the
    forwards :func:`choice_groups` cuts them into, each padded to its longest choice.  The same rows as whole sequences cost each
    row's batch width (the rows batched by length as
    :func:`fedkt.eval.scorer._score_sequences` batches them: padding included).  ``head``
    weights the positions that also run the output layer (:func:`_head_share`); ``call``
    is each forward call's fixed cost (a chunk makes one for its contexts and one per group
    of choice rows, a batch of whole sequences one, shared by its rows) and ``attention`` the cost of each (row, token, attended
    position) (:data:`CALL_COST`, :data:`ATTENTION_COST`).  ``auto`` keeps a chunk shared
    when it costs less.  With ``trie`` a shared chunk runs each distinct beginning of its
    examples' choices once (:func:`carriers`); without it, one row per choice.
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
    row_groups: list[list[list[int]]] = []
    cost = {"shared": 0.0, "pairs": 0.0, "chosen": 0.0}
    for length, group in by_length.items():
        group.sort(key=lambda i: -max(len(cont) for _, cont in encoded[i]))
        chunk: list[int] = []
        for n, i in enumerate(group):  # chunks of about batch_size (example, choice) rows
            chunk.append(i)
            size = sum(len(encoded[e]) for e in chunk)
            if n + 1 < len(group) and size + len(encoded[group[n + 1]]) <= batch_size:
                continue
            groups, later = choice_groups(
                row_widths([[cont for _, cont in encoded[e]] for e in chunk], trie), length,
                head=head, call=call, attention=attention)
            own = (len(chunk) * length + head * len(chunk) * (1 if logits_to_keep else length)
                   + call + attention * len(chunk) * length * (length + 1) / 2 + later)
            whole = sum(pair_cost[(e, c)] for e in chunk for c in range(len(encoded[e])))
            cost["shared"] += own
            cost["pairs"] += whole
            if layout == "shared" or (layout == "auto" and own <= whole):
                shared.append(chunk)
                row_groups.append(groups)
            cost["chosen"] += own if shared and shared[-1] is chunk else whole
            chunk = []
    taken = {i for chunk in shared for i in chunk}
    return LayoutPlan(shared, [r for r in rows if r[0] not in taken], cost, row_groups)


def model_plan(model: torch.nn.Module,
               encoded: Sequence[Sequence[tuple[list[int], list[int]]]], *,
               batch_size: int, max_length: int, layout: str = "auto", trie: bool = True
               ) -> LayoutPlan:
    """:func:`plan_layout` priced for ``model``: its output layer's share, whether it keeps
    only the logits asked for, the fitted call and attention costs; a soft-prompt model
    scores whole sequences."""
    return plan_layout(encoded, batch_size=batch_size, max_length=max_length,
                       layout=layout if _shares_context(model) else "pairs",
                       head=_head_share(model), logits_to_keep=takes_logits_to_keep(model),
                       call=CALL_COST, attention=ATTENTION_COST, trie=trie)


def _shares_context(model: torch.nn.Module) -> bool:
    """Whether choices may reuse their context's key/value cache: not for soft prompts
    (peft re-inserts them on every forward), nor for a model whose forward takes no cache
    (:data:`fedkt.models.kv_cache.CACHE_KWARG`)."""
    peft_config = getattr(model, "active_peft_config", None)
    if getattr(peft_config, "is_prompt_learning", False):
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return CACHE_KWARG in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False
