"""Choice knowledge: what a model believes of a public sample's class, without its label.

An extension beyond FedMKT and FedCoLLM (their knowledge is conditioned on the gold
answer: top-K logits along it, or the full distributions of a teacher-forced answer).
For classification and multiple-choice tasks a model's knowledge of a public sample is
its posterior over the task's choices,

    p(c | x) = softmax_c( log-likelihood of choice c after the prompt of x / T ),

from the same log-likelihood scoring that evaluates the model (:mod:`fedkt.eval.lm`:
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
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedkt.alignment.receiving import OWN, interleave, kl_rows
from fedkt.config import RunConfig
from fedkt.errors import ConfigError
from fedkt.payload import Payload, PayloadError, check_tensor
from fedkt.precision import autocast, grad_scaler, upcast
from fedkt.timing import timed
from fedkt.train.lm import LM
from fedkt.train.loop import run_steps
from fedkt.train.optim import make_optimizer, step, trainable

__all__ = ["FIELD", "choice_knowledge", "choice_logprobs", "distill_choices", "encode", "entropy",
           "marginal", "pack", "require_choice_task", "select", "sent", "shuffled", "unpack"]

FIELD = "choices"  # the payload field: {"posteriors": fp32 [N, C]}
_ROW_SUM_TOL = 1e-3


def require_choice_task(task: str) -> None:
    """``method.knowledge: choices`` scores a task's choices: refuse any other task."""
    if task not in ("classification", "multiple_choice"):
        raise ConfigError(f"method.knowledge: choices scores the task's choices; the dataset "
                          f"is a {task} task")


def _views(cfg: RunConfig, records: Sequence[dict], tokenizer: Any
           ) -> list[tuple[str, list[str]]]:
    """(context, continuations) of each record, as the evaluation shows them to the model
    of ``tokenizer`` (its chat template with ``data.chat_template``); reads no label."""
    from fedkt.data.formatting import chat_format, choice_view
    from fedkt.data.splits import run_data

    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    require_choice_task(fd.task)
    chat = chat_format(cfg.data.chat_template, tokenizer)
    return [choice_view(r, fd.task, fd.label_names, fd.template, chat) for r in records]


Encoded = list[list[tuple[list[int], int]]]  # [sample][choice] -> (token ids, choice length)


def encode(cfg: RunConfig, tokenizer: Any, records: Sequence[dict]) -> Encoded:
    """Every record's choices tokenized exactly as the scorer tokenizes them
    (:func:`fedkt.eval.lm.encode_scored`); reads no label."""
    from fedkt.eval.lm import encode_scored

    return [[encode_scored(tokenizer, ctx, cont, cfg.data.max_length) for cont in conts]
            for ctx, conts in _views(cfg, records, tokenizer)]


def choice_logprobs(model: torch.nn.Module, encoded: Encoded, pad_id: int,
                    temperature: float = 1.0) -> Tensor:
    """[B, C] log-posteriors over each sample's choices, in the graph.

    ``encoded[b][c]``: (token ids, continuation length) of sample b's choice c (:func:`encode`).  Each choice's score is
    the sum of its tokens' log-probabilities (the scorer's ``accuracy``), divided by
    ``temperature``, then normalised over the choices.
    """
    from fedkt.eval.lm import takes_logits_to_keep

    flat = [pair for row in encoded for pair in row]
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
    c = len(encoded[0])
    return (torch.stack(scores).view(len(encoded), c) / temperature).log_softmax(-1)


@timed("knowledge")
def choice_knowledge(cfg: RunConfig, lm: LM, records: Sequence[dict], *,
                     temperature: float = 1.0) -> Tensor:
    """[N, C] posteriors of ``lm`` over the choices of each record (float32, no gradient);
    with ``eval.reuse``, those of the same model, texts and settings computed before."""
    from fedkt import reuse
    from fedkt.eval.lm import score_choices

    views = _views(cfg, records, lm.tokenizer)

    def compute() -> dict[str, Tensor]:
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
                    taken: Tensor, *, epochs: float, lr: float | None, seed: int,
                    kd_weight: float, ft_weight: float = 0.0, temperature: float = 1.0,
                    max_steps: int | None = None, desc: str = "kd", scale: float = 1.0,
                    anchor: Tensor | None = None, anchor_weight: float = 0.0,
                    rehearse: Sequence[dict] = (), rehearsal_ratio: float = 0.0
                    ) -> dict[str, float]:
    """Train ``lm`` on ``records``: ``scale * kd_weight * KL(target || student)`` over the
    choices of the samples ``taken``, plus ``ft_weight * CE`` on the gold choice of every
    sample (only where labels exist: ``ft_weight`` 0 reads none).

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
    """
    n = len(records)
    anchored = anchor is not None and anchor_weight > 0
    use = (list(range(n)) if ft_weight > 0 or anchored
           else [i for i in range(n) if bool(taken[i])])
    out = {"loss": float("nan"), "kd_loss": float("nan"), "steps": 0,
           "kd_taken": float(taken.float().mean()) if n else 0.0}
    if not use:
        return out
    encoded = encode(cfg, lm.tokenizer, records)
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
    own_enc = encode(cfg, lm.tokenizer, rehearse) if len(plan) > total else []
    own_gold = torch.tensor([int(r["label"]) for r in rehearse]) if own_enc else None
    model = lm.model
    params = trainable(model)
    opt, sched = make_optimizer(params, cfg.training, len(plan),
                                lr=lr if lr is not None else lm.lr)
    device = next(model.parameters()).device
    scaler = grad_scaler(cfg.training, device)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    kd_sums = {"kd_loss": 0.0, "anchor_loss": 0.0}
    own_losses: list[float] = []

    def batch_loss(i: int, item: tuple[str, list[int]]) -> tuple[Tensor, dict[str, Tensor]]:
        kind, idx = item
        if kind == OWN:  # rehearsal: the gold choice of the student's own records
            with autocast(cfg.training, device):
                logq = choice_logprobs(model, [own_enc[j] for j in idx], pad)
            ce = F.nll_loss(logq, own_gold[torch.tensor(idx)].to(logq.device))
            own_losses.append(float(ce.detach()))
            return ce, {}
        with autocast(cfg.training, device):
            logq = choice_logprobs(model, [encoded[j] for j in idx], pad, temperature)
        rows = torch.tensor(idx)
        w = taken[rows].to(logq.device, torch.float32)
        kl = (kl_rows(targets[rows], logq) * w).sum() / w.sum().clamp_min(1.0)
        kd_sums["kd_loss"] += float(kl.detach())
        loss = scale * kd_weight * kl
        if anchored:  # Learning without Forgetting: KL to its own pre-exchange posteriors
            a = kl_rows(anchor[rows], logq).mean()
            kd_sums["anchor_loss"] += float(a.detach())
            loss = loss + scale * anchor_weight * a
        if gold is not None:
            loss = loss + ft_weight * F.nll_loss(logq, gold[rows].to(logq.device))
        return loss, {}

    stats = run_steps(plan, batch_loss,
                      lambda loss: step(loss, [opt], clip=[params], schedules=[sched],
                                        max_grad_norm=cfg.training.max_grad_norm, scaler=scaler),
                      modules=[model], seed=seed, total=len(plan), desc=desc)
    out.update(loss=stats.loss, kd_loss=kd_sums["kd_loss"] / total, steps=stats.steps)
    if rehearsal_ratio > 0:
        out.update(kd_steps=total, rehearsal_steps=len(own_losses))
    if anchored:
        out["anchor_loss"] = kd_sums["anchor_loss"] / total
    if own_losses:
        out["rehearsal_loss"] = sum(own_losses) / len(own_losses)
    return out
