"""Choice knowledge: what a model believes of a public sample's class, without its label.

An extension beyond FedMKT and FedCoLLM (their knowledge is conditioned on the gold
answer: top-K logits along it, or the full distributions of a teacher-forced answer).
For classification and multiple-choice tasks a model's knowledge of a public sample is
its posterior over the task's choices,

    p(c | x) = softmax_c( log-likelihood of choice c after the prompt of x / T ),

from the same log-likelihood scoring that evaluates the model (:mod:`fedkt.eval.scorer`:
the choice with the largest posterior is the one its ``accuracy`` counts).  It needs no
gold label, no teacher forcing and no tokenizer alignment: every model scores the same
choices in its own tokens, so the [N, C] posteriors of two models compare as they are.

* :func:`choice_knowledge`: a model's [N, C] posteriors on records (no gradient);
* :func:`choice_logprobs`: the differentiable [B, C] log-posteriors a student trains;
* :func:`select`: per sample, which teacher to learn from (``entropy``: the DS-FL rule,
  ``always``, or ``min_ce`` on a gold label, DualMinCE's rule on posteriors);
* :func:`shuffled`: a teacher's rows permuted across samples (the shuffled-teacher
  control: the same bytes, marginals and entropies, no per-sample information);
* :func:`marginal`: every row the sender's mean posterior (the marginal-teacher control:
  the class marginal alone, the average of the shuffled teacher over permutations);
* :func:`sent`: what a sender sends under a ``teacher`` control;
* :func:`pack` / :func:`unpack`: the wire format (fp32 [N, C]) and its validation;
* :func:`distill_choices`: a student's KD steps, KL(teacher || student) over the choices
  (plus, where labels exist and ``ft_weight > 0``, CE on the gold choice), with the
  receiving-side options of :mod:`fedkt.alignment.receiving` (anchoring, T**2,
  rehearsal on the student's own records).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedkt.alignment.receiving import OWN, interleave, kl_rows
from fedkt.config import RunConfig
from fedkt.errors import ConfigError
from fedkt.federated.payload import Payload, PayloadError, check_tensor
from fedkt.infra.precision import autocast, autocast_dtype, frozen_cast, grad_scaler, upcast
from fedkt.infra.timing import timed
from fedkt.train.lm import ADAPTERS, LM, reused_steps
from fedkt.train.loop import run_steps
from fedkt.train.optim import Accumulate, make_optimizer, step, trainable

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = ["FIELD", "choice_knowledge", "choice_logprobs", "distill_choices", "encode", "entropy",
           "marginal", "pack", "require_choice_task", "select", "sent", "shuffled", "unpack"]

FIELD = "choices"  # the payload field: {"posteriors": fp32 [N, C]}
_ROW_SUM_TOL = 1e-3


def require_choice_task(task: str) -> None:
    """``method.knowledge: choices`` scores a task's choices: refuse any other task."""
    if task not in ("classification", "multiple_choice"):
        raise ConfigError(f"method.knowledge: choices scores the task's choices; the dataset "
                          f"is a {task} task")


def _views(cfg: RunConfig, records: Sequence[dict], tokenizer: Any, data: FederatedData
           ) -> list[tuple[str, list[str]]]:
    """(context, continuations) of each record, as the evaluation shows them to the model
    of ``tokenizer`` (its chat template with ``data.chat_template``), with the task,
    labels and template of ``data``, the run's data; reads no label."""
    from fedkt.data.formatting import chat_format, choice_view

    require_choice_task(data.task)
    chat = chat_format(cfg.data.chat_template, tokenizer)
    return [choice_view(r, data.task, data.label_names, data.template, chat) for r in records]


Encoded = list[list[tuple[list[int], int]]]  # [sample][choice] -> (token ids, choice length)


def encode(cfg: RunConfig, tokenizer: Any, records: Sequence[dict], *,
           data: FederatedData) -> Encoded:
    """Every record's choices (of ``data``'s task) tokenized exactly as the scorer
    tokenizes them (:func:`fedkt.eval.inputs.encode_scored`); reads no label."""
    from fedkt.eval.inputs import encode_scored

    return [[encode_scored(tokenizer, ctx, cont, cfg.data.max_length) for cont in conts]
            for ctx, conts in _views(cfg, records, tokenizer, data)]


def choice_logprobs(model: torch.nn.Module, encoded: Encoded, pad_id: int,
                    temperature: float = 1.0, layout: str = "auto", trie: bool = True
                    ) -> Tensor:
    """[B, C] log-posteriors over each sample's choices, in the graph.

    ``encoded[b][c]``: (token ids, continuation length) of sample b's choice c
    (:func:`encode`).  Each choice's score is the sum of its tokens' log-probabilities
    (the scorer's ``accuracy``), divided by ``temperature``, then normalised over the
    choices.

    ``layout`` (:data:`fedkt.eval.layout.LAYOUTS`; the same numbers and gradients within float
    rounding): ``pairs`` runs every (sample, choice) as one whole sequence; ``shared`` runs
    each sample's context (the common prefix of its choices' contexts) once, the contexts
    of the batch right-padded together, and the choices' tokens after its key/value cache
    copied to each choice, gradients flowing through both; ``auto`` takes whichever
    computes fewer token positions (:func:`_shared_cheaper`).  With ``trie`` (the shared
    layout), choices of a sample whose tokens begin alike take their scores from one row
    (:func:`fedkt.eval.layout.carriers`).  Models that cannot continue from a cache (soft
    prompts, gradient checkpointing while training, no cache returned) and samples whose
    choices share no context run as whole sequences.
    """
    from fedkt.eval.layout import LAYOUTS

    if layout not in LAYOUTS:
        raise ValueError(f"choice_logprobs: layout {layout!r}: expected one of "
                         f"{', '.join(LAYOUTS)}")
    splits = [_split(row) for row in encoded]
    share = [b for b, split in enumerate(splits) if split is not None]
    if layout == "pairs" or not share or not _continues_from_cache(model) or (
            layout == "auto" and not _shared_cheaper(model, encoded, splits, trie)):
        share = []
    c = len(encoded[0])
    parts: dict[int, Tensor] = {}
    if share:
        scores = _shared_scores(model, [splits[b] for b in share], pad_id, trie)
        if scores is not None:  # else no cache came back: whole sequences
            parts.update(zip(share, scores.view(len(share), c), strict=True))
    rest = [b for b in range(len(encoded)) if b not in parts]
    if rest:
        flat = _flat_scores(model, [pair for b in rest for pair in encoded[b]], pad_id)
        parts.update(zip(rest, flat.view(len(rest), c), strict=True))
    stacked = torch.stack([parts[b] for b in range(len(encoded))])
    return (stacked / temperature).log_softmax(-1)


Split = tuple[list[int], list[tuple[list[int], int]]]  # (context, [(tokens after it, scored)])


def _split(row: Sequence[tuple[list[int], int]]) -> Split | None:
    """A sample's shared context (the longest common prefix of its choices' contexts,
    ``seq[:-n]``) and each choice's tokens after it (the rest of its context, if any,
    then its ``n`` scored tokens) with ``n``; None when the contexts share no token."""
    ctxs = [seq[: len(seq) - n] for seq, n in row]
    size = min(len(ctx) for ctx in ctxs)
    for ctx in ctxs[1:]:
        size = next((k for k in range(size) if ctx[k] != ctxs[0][k]), size)
    if not size:
        return None
    return ctxs[0][:size], [(seq[size:], n) for seq, n in row]


def _continues_from_cache(model: torch.nn.Module) -> bool:
    """Whether choices may run after their context's key/value cache in this forward:
    not for soft prompts (peft re-inserts them every forward), nor for a model that
    trains with gradient checkpointing (transformers then drops the cache)."""
    from fedkt.eval.layout import _shares_context

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True
                        for m in base.modules()) and model.training and torch.is_grad_enabled()
    return _shares_context(model) and not checkpointing


def _shared_cheaper(model: torch.nn.Module, encoded: Encoded,
                    splits: Sequence[Split | None], trie: bool = True) -> bool:
    """Whether the shared layout computes fewer token positions than whole sequences, by
    the scorer's cost model (:func:`fedkt.eval.layout.plan_layout`: positions through the
    body, the output layer's positions weighted by its share, each forward call's fixed
    cost, attention per attended position)."""
    from fedkt.eval.inputs import takes_logits_to_keep
    from fedkt.eval.layout import ATTENTION_COST, CALL_COST, _head_share, choice_groups, row_widths

    head = _head_share(model)
    keeps = takes_logits_to_keep(model)
    flat = [pair for row in encoded for pair in row]
    width = max(len(seq) for seq, _ in flat) - 1
    keep = width - min(len(seq) - 1 - n for seq, n in flat) if keeps else width
    rows = len(flat)
    pairs = (rows * width + head * rows * keep + CALL_COST
             + ATTENTION_COST * rows * width * (width + 1) / 2)
    got = [s for s in splits if s is not None]
    ctx = max(len(s[0]) for s in got)
    left = [b for b, s in enumerate(splits) if s is None]
    # The choices' forwards as _shared_scores cuts them: a group after the first also
    # runs the contexts again.
    again = 2 * CALL_COST + len(got) * ctx
    groups, later = choice_groups(row_widths([[cont for cont, _ in s[1]] for s in got], trie),
                                  ctx, head=head, call=again, attention=ATTENTION_COST)
    shared = (len(got) * ctx + head * len(got) * (1 if keeps else ctx) + CALL_COST
              + ATTENTION_COST * len(got) * ctx * (ctx + 1) / 2
              + (later - again + CALL_COST if groups else 0.0))
    if left:  # the samples without a shared context, as whole sequences in a third call
        rest = [pair for b in left for pair in encoded[b]]
        w = max(len(seq) for seq, _ in rest) - 1
        shared += len(rest) * w * (1 + head) + CALL_COST
    return shared < pairs


def _flat_scores(model: torch.nn.Module, flat: Sequence[tuple[list[int], int]],
                 pad_id: int) -> Tensor:
    """[rows] summed log-probabilities of each (token ids, continuation length) row, the
    rows right-padded into one batch of whole sequences."""
    from fedkt.eval.inputs import takes_logits_to_keep

    width = max(len(seq) for seq, _ in flat) - 1
    device = next(model.parameters()).device
    ids = torch.full((len(flat), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(flat), width), dtype=torch.long)
    for i, (seq, _) in enumerate(flat):
        ids[i, : len(seq) - 1] = torch.tensor(seq[:-1])
        mask[i, : len(seq) - 1] = 1
    # Only the positions from the earliest choice token on need the output layer (as the
    # scorer does): the [rows, positions, vocabulary] logits are most of the memory.
    first = min(len(seq) - 1 - n for seq, n in flat)
    keep = width - first
    extra = {"logits_to_keep": keep} if keep < width and takes_logits_to_keep(model) else {}
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), **extra).logits
    logits = logits[:, -keep:]
    scores = []
    for i, (seq, n) in enumerate(flat):
        if not n:
            scores.append(logits.new_zeros((), dtype=torch.float32))
            continue
        end = len(seq) - 1 - first
        targets = torch.tensor(seq[-n:], device=logits.device)
        logprobs = upcast(logits[i, end - n : end]).log_softmax(-1)
        scores.append(logprobs.gather(-1, targets[:, None]).sum())
    return torch.stack(scores)


def _shared_scores(model: torch.nn.Module, samples: Sequence[Split],
                   pad_id: int, trie: bool = True) -> Tensor | None:
    """[rows] summed log-probabilities of each sample's choices (sample-major), a sample
    given as (context ids, [(tokens after the context, scored tokens at their end)]).

    One forward of the contexts (right-padded, so each keeps positions 0..L-1 and no
    query sees only padding), its key/value cache indexed to one row per choice (a
    differentiable copy), then a forward of the choices' tokens but the last, at
    positions L.. after their own context, the context's padding masked out.  Choices of
    very different lengths (many labels) run in groups of similar lengths
    (:func:`_groups`), each after its own forward of the contexts.  A choice's first
    token is scored from its context's last logits, the others from the later forwards':
    with ``trie``, from the row of the sample's choice that carries it
    (:func:`fedkt.eval.layout.carriers`), so a run of tokens that begins several choices
    runs once.  None when the model returned no cache.
    """
    from fedkt.eval.inputs import _pad, takes_logits_to_keep
    from fedkt.eval.layout import row_carriers
    from fedkt.models.kv_cache import CACHE_KWARG, returned_cache

    device = next(model.parameters()).device
    lengths = torch.tensor([len(ctx) for ctx, _ in samples])
    ids, mask = _pad([ctx for ctx, _ in samples], pad_id, "right")
    positions = torch.arange(ids.shape[1]).expand(len(samples), -1)
    rows = [(b, cont, n) for b, (_, conts) in enumerate(samples) for cont, n in conts]
    # per row, the row whose later forward scores it (-1: none)
    carrier = row_carriers([[cont for cont, _ in conts] for _, conts in samples], trie)
    later_width = max(len(cont) for _, cont, _ in rows) - 1
    # The output layer runs only at each context's last position (a [B, 1] index).
    keeps = takes_logits_to_keep(model)
    extra = {"logits_to_keep": (lengths - 1)[:, None].to(device)} if keeps else {}
    first = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                  position_ids=positions.to(device), use_cache=later_width > 0, **extra)
    logits = first.logits
    last = logits[:, -1] if keeps else logits[torch.arange(len(samples)), lengths - 1]
    last = upcast(last).log_softmax(-1)  # [B, V]
    owner = torch.tensor([b for b, _, _ in rows])
    # The first scored token of a choice whose tokens after the context are all scored.
    starts = [len(cont) - n for _, cont, n in rows]
    heads = [r for r, (_, cont, n) in enumerate(rows) if n and starts[r] == 0]
    scores = torch.zeros(len(rows), dtype=last.dtype, device=last.device)
    if heads:
        picked = last[owner[heads].to(device), torch.tensor([rows[r][1][0] for r in heads],
                                                            device=device)]
        scores = scores.index_add(0, torch.tensor(heads, device=device), picked)
    if later_width <= 0:
        return scores
    for g, group in enumerate(_groups(model, rows, carrier, len(samples), ids.shape[1])):
        if g:  # a fresh cache of the contexts (selecting rows changes a cache in place)
            first = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                          position_ids=positions.to(device), use_cache=True,
                          **({"logits_to_keep": 1} if keeps else {}))
        cache = returned_cache(first)
        if cache is None:
            return None
        sub = owner[group]
        cache.batch_select_indices(sub.to(device))
        width = max(len(rows[r][1]) for r in group) - 1
        cont_ids, cont_mask = _pad([rows[r][1][:-1] for r in group], pad_id, "right")
        full_mask = torch.cat([mask[sub], cont_mask], 1)
        cont_pos = lengths[sub][:, None] + torch.arange(width)
        logits = upcast(model(input_ids=cont_ids.to(device),
                              attention_mask=full_mask.to(device),
                              position_ids=cont_pos.to(device), **{CACHE_KWARG: cache},
                              use_cache=True).logits)  # [group rows, width, V]
        # Token j (>= 1) of a choice's tokens is predicted at position j - 1 of its
        # carrier's row in this forward.
        at = {row: k for k, row in enumerate(group)}
        read = [r for r in range(len(rows)) if carrier[r] in at]
        targets = torch.zeros(len(read), width, dtype=torch.long)
        scored = torch.zeros(len(read), width, dtype=torch.bool)
        for k, r in enumerate(read):
            _, cont, n = rows[r]
            targets[k, : len(cont) - 1] = torch.tensor(cont[1:])
            scored[k, max(starts[r], 1) - 1 : len(cont) - 1] = n > 0
        targets, scored = targets.to(device), scored.to(device)
        src = torch.tensor([at[carrier[r]] for r in read], device=device)
        picked = (logits[src[:, None], torch.arange(width, device=device), targets]
                  - logits.logsumexp(-1)[src])
        scores = scores.index_add(0, torch.tensor(read, device=device),
                                  torch.where(scored, picked, torch.zeros_like(picked)).sum(-1))
    return scores


def _groups(model: torch.nn.Module, rows: Sequence[tuple[int, list[int], int]],
            carrier: Sequence[int], samples: int, context: int) -> list[list[int]]:
    """The rows that carry a forward (``carrier[r] == r``: tokens after their first, not
    carried by another row), cut into forwards of similar lengths
    (:func:`fedkt.eval.layout.choice_groups`; a further group also runs the ``samples``
    contexts of ``context`` positions again)."""
    from fedkt.eval.layout import ATTENTION_COST, CALL_COST, _head_share, choice_groups

    return choice_groups([len(cont) - 1 if carrier[r] == r else 0
                          for r, (_, cont, _) in enumerate(rows)], context,
                         head=_head_share(model), call=2 * CALL_COST + samples * context,
                         attention=ATTENTION_COST)[0]


@timed("knowledge")
def choice_knowledge(cfg: RunConfig, lm: LM, records: Sequence[dict], *, data: FederatedData,
                     temperature: float = 1.0) -> Tensor:
    """[N, C] posteriors of ``lm`` over the choices of each record of ``data`` (the run's
    data: its task, labels and template; float32, no gradient);
    with ``eval.reuse``, those of the same model, texts and settings computed before."""
    from fedkt.eval import reuse
    from fedkt.eval.scorer import score_choices

    views = _views(cfg, records, lm.tokenizer, data)

    def compute() -> dict[str, Tensor]:  # inside the store's digest of the fp32 weights
        with frozen_cast(cfg, lm.model):
            scores = score_choices(lm.model, lm.tokenizer, [v[0] for v in views],
                                   [v[1] for v in views], batch_size=cfg.eval.batch_size,
                                   max_length=cfg.data.max_length)
        p = (torch.tensor(scores, dtype=torch.float64) / temperature).softmax(-1).float()
        return {"posteriors": p}

    with torch.no_grad(), autocast(cfg, lm.model):
        got = reuse.tensors(cfg.eval.reuse, "choices", lm.model, lm.tokenizer,
                            {"views": views, "batch_size": cfg.eval.batch_size,
                             "max_length": cfg.data.max_length, "temperature": temperature},
                            compute)
    return got["posteriors"]


def entropy(p: Tensor) -> Tensor:
    """Entropy of each row (nats)."""
    p = p.double()
    return -(p * p.clamp_min(1e-30).log()).sum(-1)


def select(own: Tensor, others: Sequence[Tensor], rule: str,
           gold: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per sample, the teacher distribution and whether to learn from it.

    ``own`` [N, C]: the learner's posteriors; ``others``: the other models' [N, C].
    ``entropy`` (DS-FL's rule): the other model with the lowest entropy, taken where it is
    below the learner's own; ``always``: the mean of the others, everywhere; ``min_ce``:
    DualMinCE's rule on a gold label (``gold`` [N]): the other with the smallest CE,
    taken where it is below the learner's.  Returns (targets [N, C], taken [N] bool).
    """
    if not others:
        return own.clone(), torch.zeros(own.shape[0], dtype=torch.bool)
    stack = torch.stack(list(others)).double()  # [M, N, C]
    if rule == "always":
        return stack.mean(0).float(), torch.ones(own.shape[0], dtype=torch.bool)
    if rule == "entropy":
        score, own_score = entropy(stack), entropy(own)
    elif rule == "min_ce":
        if gold is None:
            raise ValueError("select: the min_ce rule needs the gold labels")
        idx = gold.long()[None, :, None].expand(stack.shape[0], -1, 1)
        score = -stack.gather(2, idx).squeeze(2).clamp_min(1e-30).log()
        own_score = -own.double().gather(1, gold.long()[:, None]).squeeze(1).clamp_min(1e-30).log()
    else:
        raise ValueError(f"select: unknown rule {rule!r}")
    best = score.argmin(0)  # [N]: first minimum on ties
    best_score = score.gather(0, best[None]).squeeze(0)
    targets = stack.gather(0, best[None, :, None].expand(1, -1, stack.shape[2])).squeeze(0)
    return targets.float(), best_score < own_score


def shuffled(knowledge: Tensor, seed: int) -> Tensor:
    """``knowledge``'s rows in a seeded random order: each sample gets another sample's
    posterior (the same bytes, marginals and entropies; no per-sample information)."""
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, 27]).permutation(knowledge.shape[0])
    return knowledge[torch.from_numpy(perm)]


def marginal(knowledge: Tensor) -> Tensor:
    """Every row ``knowledge``'s mean row: each sample gets the sender's mean posterior
    over the samples (the class marginal, no per-sample information; the average of
    :func:`shuffled` over every permutation).  Averaged in float64."""
    mean = knowledge.double().mean(0, keepdim=True).to(knowledge.dtype)
    return mean.expand_as(knowledge).clone()


def sent(knowledge: Tensor, teacher: str, seed: int) -> Tensor:
    """What a sender's ``knowledge`` becomes before it travels under ``method.teacher``:
    permuted across the samples (``shuffled``), every row the mean (``marginal``), or as
    it is (``real``; ``self`` is the receiver's choice, not the sender's)."""
    if teacher == "shuffled":
        return shuffled(knowledge, seed)
    if teacher == "marginal":
        return marginal(knowledge)
    return knowledge


def pack(knowledge: Tensor) -> dict[str, Tensor]:
    """The wire format: ``{"posteriors": float32 [N, C]}``."""
    return {"posteriors": knowledge.float().contiguous()}


def unpack(packed: Any, n: int, c: int, source: str) -> Tensor:
    """Validate a received :func:`pack` (names the sender and the field) -> [N, C]."""
    payload = Payload({FIELD: packed})
    state = payload.state(FIELD, source=source)
    if set(state) != {"posteriors"}:
        raise PayloadError(f"{source}: field {FIELD!r} should hold only 'posteriors', got "
                           f"{sorted(state)}")
    p = state["posteriors"]
    check_tensor(p, f"{source}: field {FIELD!r}['posteriors']", shape=(n, c),
                 dtype=torch.float32, low=0.0, high=1.0)
    sums = p.double().sum(-1)
    if n and float((sums - 1).abs().max()) > _ROW_SUM_TOL:
        raise PayloadError(f"{source}: field {FIELD!r}['posteriors']: rows must sum to 1 "
                           f"(found sums in [{float(sums.min()):.4f}, {float(sums.max()):.4f}])")
    return p


@timed("distill")
def distill_choices(cfg: RunConfig, lm: LM, records: Sequence[dict], targets: Tensor,
                    taken: Tensor, *, data: FederatedData, epochs: float, lr: float | None,
                    seed: int, kd_weight: float, ft_weight: float = 0.0, temperature: float = 1.0,
                    max_steps: int | None = None, desc: str = "kd", scale: float = 1.0,
                    anchor: Tensor | None = None, anchor_weight: float = 0.0,
                    rehearse: Sequence[dict] = (), rehearsal_ratio: float = 0.0
                    ) -> dict[str, float]:
    """Train ``lm`` on ``records``: ``scale * kd_weight * KL(target || student)`` over the
    choices of the samples ``taken``, plus ``ft_weight * CE`` on the gold choice of every
    sample (only where labels exist: ``ft_weight`` 0 reads none); ``data``, the run's data,
    gives the task, labels and template the choices are shown with.

    Receiving-side options (:mod:`fedkt.alignment.receiving`, all off by default):
    ``scale`` multiplies the KD and anchoring terms (T**2: :func:`~.receiving.kd_scale`);
    ``anchor_weight * scale * KL(anchor || student)`` over every sample keeps the student
    near ``anchor`` [N, C], its own posteriors before the exchange; ``rehearsal_ratio``
    own steps per KD step (:func:`~.receiving.interleave`) train CE on the gold choice of
    the student's own labelled ``rehearse`` records (at T = 1: the task as it is scored).

    KD samples are batched in a seeded order (``training.batch_size``), ``ceil(epochs)``
    passes cut at ``epochs`` of them (and at ``max_steps``), with the run's AdamW and
    schedule over all the steps, rehearsal included.
    Returns the mean loss and KL, the steps and the share of samples taken.

    Under ``training.reuse`` a distillation of an adapter (LoRA, prefix) is reused: the
    adapter it trains, torch's random state after it and its stats are stored under a key
    of everything that decides them (the model as it starts, its tokenizer, the choices'
    tokens, the targets, the samples taken, the gold choices and rehearsal records it
    reads, the anchor, every argument above, the training settings, precision and code:
    :mod:`fedkt.eval.reuse`).
    So a control arm that repeats another arm's distillation of one side (FedMKT's LLM
    learning from the real clients while the control replaces what it sends back) computes
    it once; a reuse reports the seconds it spared as ``distill_saved_seconds``.
    """
    settings = {"epochs": epochs, "seed": seed, "kd_weight": kd_weight, "ft_weight": ft_weight,
                "temperature": temperature, "max_steps": max_steps, "scale": scale,
                "anchor_weight": anchor_weight, "rehearsal_ratio": rehearsal_ratio}
    anchored = anchor is not None and anchor_weight > 0
    if not cfg.training.reuse or cfg.training.peft not in ADAPTERS or not _trained(
            records, taken, ft_weight, anchored):
        return _distill_choices(cfg, lm, records, targets, taken, data=data, lr=lr, desc=desc,
                                anchor=anchor, rehearse=rehearse, **settings)
    encoded = encode(cfg, lm.tokenizer, records, data=data)
    own = encode(cfg, lm.tokenizer, rehearse, data=data) if rehearsal_ratio > 0 else []
    parts = {"encoded": encoded, "targets": targets, "taken": taken,
             "labels": [int(r["label"]) for r in records] if ft_weight > 0 else None,
             "anchor": anchor if anchored else None, "rehearse": own,
             "rehearse_labels": [int(r["label"]) for r in rehearse] if own else None,
             "lr": lr if lr is not None else lm.lr, **settings,
             "training": cfg.training.model_dump(mode="json")}
    return reused_steps(lm, "choices", parts, lambda: _distill_choices(
        cfg, lm, records, targets, taken, data=data, lr=lr, desc=desc, anchor=anchor,
        rehearse=rehearse, encoded=encoded, own_encoded=own, **settings),
        phase_name="distill")


def _trained(records: Sequence[dict], taken: Tensor, ft_weight: float, anchored: bool
             ) -> list[int]:
    """The samples a distillation trains on: all of them with a CE or anchoring term,
    else those ``taken``."""
    if ft_weight > 0 or anchored:
        return list(range(len(records)))
    return [i for i in range(len(records)) if bool(taken[i])]


def _distill_choices(cfg: RunConfig, lm: LM, records: Sequence[dict], targets: Tensor,
                     taken: Tensor, *, data: FederatedData, epochs: float, lr: float | None,
                     seed: int, kd_weight: float, ft_weight: float, temperature: float,
                     max_steps: int | None, desc: str, scale: float, anchor: Tensor | None,
                     anchor_weight: float, rehearse: Sequence[dict], rehearsal_ratio: float,
                     encoded: Encoded | None = None, own_encoded: Encoded | None = None
                     ) -> dict[str, float]:
    """:func:`distill_choices` itself (the computation, never reused); ``encoded`` and
    ``own_encoded``: the records' and the rehearsal records' choices when the caller has
    encoded them already (the same :func:`encode`)."""
    n = len(records)
    anchored = anchor is not None and anchor_weight > 0
    use = _trained(records, taken, ft_weight, anchored)
    out = {"loss": float("nan"), "kd_loss": float("nan"), "steps": 0,
           "kd_taken": float(taken.float().mean()) if n else 0.0}
    if not use:
        return out
    if encoded is None:
        encoded = encode(cfg, lm.tokenizer, records, data=data)
    gold = (torch.tensor([int(r["label"]) for r in records]) if ft_weight > 0 else None)
    bs = cfg.training.batch_size
    passes = max(1, math.ceil(epochs))
    batches: list[list[int]] = []
    for p in range(passes):
        order = np.random.default_rng([int(seed) & 0xFFFFFFFF, p]).permutation(len(use))
        batches += [[use[j] for j in order[s : s + bs]] for s in range(0, len(use), bs)]
    total = min(len(batches), max(1, math.ceil(epochs * math.ceil(len(use) / bs))),
                max_steps or len(batches))
    plan = interleave(batches[:total], len(rehearse), rehearsal_ratio, bs, seed)
    own_enc = ((own_encoded if own_encoded is not None
                else encode(cfg, lm.tokenizer, rehearse, data=data))
               if len(plan) > total else [])
    own_gold = torch.tensor([int(r["label"]) for r in rehearse]) if own_enc else None
    model = lm.model
    params = trainable(model)
    opt, sched = make_optimizer(params, cfg.training, len(plan),
                                lr=lr if lr is not None else lm.lr)
    device = next(model.parameters()).device
    scaler = grad_scaler(cfg.training, device)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    kd_sums = {"kd_loss": 0.0, "anchor_loss": 0.0}
    own_sums: list[float] = []  # each rehearsal step's CE

    micro = cfg.training.kd_micro_batch

    def part(kind: str, sub: list[int], n: int, w_sum: Tensor | None) -> Tensor:
        """The loss of the samples ``sub`` of a batch of ``n``, each term normalised by the
        whole batch's count (or KD weight ``w_sum``): a batch's parts sum to its loss."""
        whole = len(sub) == n  # the whole batch: the means, as without micro-batches

        def share(x: Tensor) -> Tensor:
            return x.mean() if whole else x.sum() / n

        def nll(logq: Tensor, gold_rows: Tensor) -> Tensor:
            y = gold_rows.to(logq.device)
            return F.nll_loss(logq, y) if whole else F.nll_loss(logq, y, reduction="sum") / n

        rows = torch.tensor(sub)
        if kind == OWN:  # rehearsal: the gold choice of the student's own records
            with autocast(cfg.training, device):
                logq = choice_logprobs(model, [own_enc[j] for j in sub], pad)
            ce = nll(logq, own_gold[rows])
            own_sums[-1] += float(ce.detach())
            return ce
        with autocast(cfg.training, device):
            logq = choice_logprobs(model, [encoded[j] for j in sub], pad, temperature)
        w = taken[rows].to(logq.device, torch.float32)
        kl = (kl_rows(targets[rows], logq) * w).sum() / w_sum
        kd_sums["kd_loss"] += float(kl.detach())
        loss = scale * kd_weight * kl
        if anchored:  # Learning without Forgetting: KL to its own pre-exchange posteriors
            a = share(kl_rows(anchor[rows], logq))
            kd_sums["anchor_loss"] += float(a.detach())
            loss = loss + scale * anchor_weight * a
        if gold is not None:
            loss = loss + ft_weight * nll(logq, gold[rows])
        return loss

    def batch_loss(i: int, item: tuple[str, list[int]]) -> tuple[Tensor | Accumulate, dict]:
        kind, idx = item
        if kind == OWN:
            own_sums.append(0.0)
        w_sum = None if kind == OWN else taken[torch.tensor(idx)].float().sum().clamp_min(1.0)
        if not micro or len(idx) <= micro:
            return part(kind, idx, len(idx), w_sum), {}

        def accumulate(backward) -> float:  # training.kd_micro_batch: gradient accumulation
            total = 0.0
            for s in range(0, len(idx), micro):
                loss = part(kind, idx[s : s + micro], len(idx), w_sum)
                backward(loss)
                total += float(loss.detach())
            return total
        return accumulate, {}

    stats = run_steps(plan, batch_loss,
                      lambda loss: step(loss, [opt], clip=[params], schedules=[sched],
                                        max_grad_norm=cfg.training.max_grad_norm, scaler=scaler),
                      modules=[model], seed=seed, total=len(plan), desc=desc,
                      cast=autocast_dtype(cfg.training, device))
    out.update(loss=stats.loss, kd_loss=kd_sums["kd_loss"] / total, steps=stats.steps)
    if rehearsal_ratio > 0:
        out.update(kd_steps=total, rehearsal_steps=len(own_sums))
    if anchored:
        out["anchor_loss"] = kd_sums["anchor_loss"] / total
    if own_sums:
        out["rehearsal_loss"] = sum(own_sums) / len(own_sums)
    return out
