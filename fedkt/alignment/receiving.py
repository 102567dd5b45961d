"""Receiving-side options: take in the other side's choice posteriors, keep one's own.

Extensions beyond FedMKT and FedCoLLM, which distil the other side's knowledge with
nothing to hold the receiver's own (``method.receiving``,
:class:`fedkt.config.method_settings.ReceivingOptions`; each off by default).  The pieces are
shared by both methods' choice paths (:func:`fedkt.alignment.choices.distill_choices`
runs them):

* :func:`kd_scale`: the T**2 factor of distillation at a temperature T (Hinton, Vinyals
  & Dean 2015), which keeps the soft targets' gradients at the size of a hard target's;
* :func:`kl_rows`: per sample KL(target || learner) over the choices, the KD term and,
  with the receiver's own pre-exchange posteriors as the target, the anchoring term of
  Learning without Forgetting (Li & Hoiem 2016);
* :func:`take_confident`: the samples where the teacher is confident and the receiver
  is not (the only ones a teacher is taken on with ``take: confident``);
* :func:`interleave`: the KD steps with rehearsal steps on the receiver's own labelled
  data at a set ratio (indices into its own records only: never the public set).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from fedkt.config.method_settings import ReceivingOptions

__all__ = ["KD", "OWN", "distill_options", "interleave", "kd_scale", "kl_rows",
           "take_confident", "taken"]

KD, OWN = "kd", "own"  # the two kinds of step :func:`interleave` yields


def kd_scale(temperature: float, t_squared: bool) -> float:
    """The factor of a KD term computed at ``temperature``: T**2 with ``t_squared``
    (Hinton et al. 2015: the gradient of KL_T then tends to that of the logits' squared
    difference over C as T grows, instead of shrinking as 1/T**2), else 1 (the papers)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return float(temperature) ** 2 if t_squared else 1.0


def kl_rows(target: Tensor, logq: Tensor) -> Tensor:
    """[B]: KL(target || q) of each row, ``target`` probabilities [B, C], ``logq`` the
    learner's log-probabilities [B, C] (in the graph); computed in float64, returned fp32.

    Exactly 0 where ``logq`` is the log of ``target`` (the anchoring term at the
    receiver's own posteriors); a target entry below 1e-30 counts as 1e-30."""
    t = target.to(logq.device, torch.float64).clamp_min(1e-30)
    return (t * (t.log() - logq.double())).sum(-1).float()


def take_confident(teacher: Tensor, own: Tensor, teacher_min: float, learner_max: float
                   ) -> Tensor:
    """[N] bool: the samples where the teacher's largest posterior is at least
    ``teacher_min`` and the receiver's own is below ``learner_max``."""
    if teacher.shape != own.shape:
        raise ValueError(f"take_confident: teacher {tuple(teacher.shape)} and own "
                         f"{tuple(own.shape)} posteriors differ in shape")
    return (teacher.max(-1).values >= teacher_min) & (own.max(-1).values < learner_max)


def taken(options: ReceivingOptions, targets: Tensor, own: Tensor, chosen: Tensor) -> Tensor:
    """The samples distilled: those the method's selection ``chosen``, narrowed by the
    ``take`` rule (``all``: unchanged)."""
    if options.take == "all":
        return chosen
    return chosen & take_confident(targets, own, options.teacher_confidence,
                                   options.learner_confidence)


def interleave(kd_batches: Sequence[list[int]], n_own: int, ratio: float, batch_size: int,
               seed: int) -> list[tuple[str, list[int]]]:
    """The KD batches with rehearsal batches between them: ``(KD, public indices)`` and
    ``(OWN, indices into the receiver's own records)``.

    After KD step i come ``floor((i + 1) r) - floor(i r)`` own steps (r = ``ratio``,
    taken exactly as written: 0.1 is 1/10), so n KD steps bring ``floor(n r)``.  Own
    batches of ``batch_size`` walk seeded permutations of the ``n_own`` records, a fresh
    one each pass; no record repeats before every one has been seen.
    """
    r = Fraction(str(ratio))
    if r < 0:
        raise ValueError(f"interleave: ratio must be >= 0, got {ratio}")
    wanted = math.floor(len(kd_batches) * r)
    if wanted and n_own <= 0:
        raise ValueError("interleave: rehearsal needs the receiver's own records; it has none")
    own: list[list[int]] = []
    p = 0
    while len(own) < wanted:
        perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, 1_000 + p]).permutation(n_own)
        own += [perm[s : s + batch_size].tolist() for s in range(0, n_own, batch_size)]
        p += 1
    out: list[tuple[str, list[int]]] = []
    used = 0
    for i, batch in enumerate(kd_batches):
        out.append((KD, list(batch)))
        k = math.floor((i + 1) * r) - math.floor(i * r)
        out += [(OWN, b) for b in own[used : used + k]]
        used += k
    return out


def distill_options(options: ReceivingOptions, temperature: float, own: Tensor,
                    rehearse: Sequence[dict], *, client: bool) -> dict:
    """The receiving options as :func:`fedkt.alignment.choices.distill_choices` takes them,
    for a receiver whose pre-exchange posteriors are ``own`` and whose own labelled
    records are ``rehearse`` (empty: nothing to rehearse on); ``client``: a client's SLM
    (its anchoring weight is ``client_anchor_weight`` where set), else the LLM."""
    weight = options.anchor_weight
    if client and options.client_anchor_weight is not None:
        weight = options.client_anchor_weight
    return {"scale": kd_scale(temperature, options.t_squared),
            "anchor": own if weight > 0 else None,
            "anchor_weight": weight,
            "rehearse": rehearse if options.rehearsal_ratio > 0 else (),
            "rehearsal_ratio": options.rehearsal_ratio if rehearse else 0.0}
