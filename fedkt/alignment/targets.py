"""Distillation targets from received knowledge sets, built batch by batch.

FedMKT (Fan et al., COLING 2025), Sec. 3.2-3.3 and Appendix B: a learner distils on the
public set D_p from other models' knowledge sets (:mod:`fedkt.alignment.knowledge`):

* :func:`to_receiver` joins a received set to D_p and readies its projection into the
  learner's tokens (:class:`~fedkt.alignment.bridge.TokenBridge`); :class:`Received`
  projects only the rows of one training batch at a time, so memory does not grow
  with D_p;
* :func:`build_targets` takes, per sample, the model to distil from (FedMKT's DualMinCE
  chooses it) and :class:`KDTargets` builds each batch's top-K targets, with a one-hot
  target on the ground-truth token where the teacher has no aligned position;
* :func:`kd_loss` is L_KD of one batch against those targets
  (:func:`~fedkt.alignment.sparse_kd_loss`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedkt.alignment.bridge import TokenBridge
from fedkt.alignment.knowledge import PublicSet, vocab_size
from fedkt.alignment.sequence import Alignment
from fedkt.alignment.topk import PAD_VALUE, TopKLogits, project_topk, sparse_kd_loss
from fedkt.data.lm_batches import IGNORE_INDEX
from fedkt.federated.payload import PayloadError
from fedkt.infra.timing import timed

__all__ = ["KDTargets", "Received", "build_targets", "kd_loss", "to_receiver"]


@dataclass
class Received:
    """A knowledge set from another model, joined to D_p by sample id.

    Kept in the sender's tokens as received; :meth:`rows` projects the rows of one
    training batch into the learner's tokens (Appendix B), so no projected copy of the
    whole set is ever held and the projection's memory does not grow with D_p.
    """

    topk: TopKLogits  # as received (the sender's token space)
    row: Tensor  # int64 [N]: row of ``topk`` holding public sample n, -1: not sent
    losses: Tensor  # float32 [N]: the sender's per-sample loss, inf: not sent
    vocab: int  # the learner's vocabulary size
    aligns: list[Alignment] | None = None  # per public sample; None: same tokens
    vocab_map: np.ndarray | None = None  # sender id -> learner id
    mask: Tensor | None = None  # [N_rows, L]: aligned positions (sets already projected)

    @classmethod
    def projected(cls, topk: TopKLogits, mask: Tensor) -> Received:
        """A set already in the learner's tokens, one row per public sample, in order."""
        n = topk.values.shape[0]
        return cls(topk=topk, row=torch.arange(n, dtype=torch.int64), losses=topk.losses,
                   vocab=topk.vocab_size, mask=mask)

    def rows(self, samples: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """Public ``samples`` [B] in the learner's tokens, ``width`` positions:
        ids int64 [B, W, K], values float16 [B, W, K], aligned-position mask bool [B, W]."""
        b, k = len(samples), self.topk.k
        ids = torch.zeros(b, width, k, dtype=torch.int64)
        vals = torch.full((b, width, k), PAD_VALUE, dtype=torch.float16)
        mask = torch.zeros(b, width, dtype=torch.bool)
        r = self.row[samples]
        ok = r >= 0
        if not bool(ok.any()):
            return ids, vals, mask
        rr, sel = r[ok], samples[ok]
        t = self.topk
        sub = TopKLogits(sample_ids=sel.clone(), values=t.values[rr], indices=t.indices[rr],
                         lengths=t.lengths[rr], vocab_size=t.vocab_size, losses=t.losses[rr])
        if self.aligns is None:
            pv, pi = sub.values, sub.indices
            pm = (self.mask[rr] if self.mask is not None else
                  torch.arange(pv.shape[1])[None, :] < sub.lengths[:, None].long())
        else:
            proj, pm = project_topk(sub, self.vocab_map, [self.aligns[int(i)] for i in sel],
                                    tgt_vocab_size=self.vocab, batch_size=None)
            pv, pi = proj.values, proj.indices
        ids[ok] = _fit(pi, width).long()
        vals[ok] = _fit(pv, width)
        mask[ok] = _fit(pm, width)
        return ids, vals, mask


@timed("align")
def to_receiver(topk: TopKLogits, src_tok: Any, src: PublicSet, tgt_tok: Any, tgt: PublicSet,
                source: str) -> Received:
    """A received knowledge set joined to D_p, ready to project into the receiver's tokens
    batch by batch (:meth:`Received.rows`) through a :class:`~fedkt.alignment.bridge.TokenBridge`.

    Validates the sample ids (inside D_p) and every sample's length (that of the public
    sample tokenized with the sender's tokenizer); loss ``inf`` for samples the sender
    left out.  The alignments of D_p and the vocabulary mapping are computed (or read
    from the cache) here.
    """
    n = len(tgt)
    ids = topk.sample_ids
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise PayloadError(f"{source}: top-K field 'sample_ids' outside the public set [0, {n})")
    expected = torch.tensor(src.lengths, dtype=torch.int32)[ids]
    if not torch.equal(topk.lengths, expected):
        bad = int((topk.lengths != expected).nonzero()[0, 0])
        raise PayloadError(
            f"{source}: top-K field 'lengths' gives {int(topk.lengths[bad])} positions for "
            f"public sample {int(ids[bad])}, whose tokenization has {int(expected[bad])}")
    row = torch.full((n,), -1, dtype=torch.int64)
    row[ids.long()] = torch.arange(len(ids), dtype=torch.int64)
    losses = torch.full((n,), math.inf, dtype=torch.float32)
    losses[ids.long()] = topk.losses
    out = Received(topk=topk, row=row, losses=losses, vocab=vocab_size(tgt_tok))
    bridge = TokenBridge(src_tok, tgt_tok)
    if ids.numel() and not (bridge.same and src.digest() == tgt.digest()):
        out.aligns = bridge.align_corpus(src, tgt)
        out.vocab_map = bridge.vocab_map
    return out


# --------------------------------------------------------------------------- KD targets


@dataclass
class KDTargets:
    """DualMinCE's choice per public sample and the knowledge to distil from, built into
    the learner's tokens one batch at a time (:meth:`batch`).

    ``selection[n]``: -1 (no other model beats the learner: the sample is not in S~ unless
    ``fallback_to_own``) or m (other model m).  ``unaligned``: what a learner position
    gets where the selected model has no aligned position (Appendix B 3(d)).
    """

    own: TopKLogits  # the learner's S on D_p (its own tokens)
    others: list[Received]
    selection: Tensor  # int64 [N]: -1 own, m: other model m (DualMinCE)
    public: PublicSet  # the learner's tokenization of D_p (ground-truth next tokens)
    index: dict[bytes, int]  # token ids -> sample (to find a batch row's sample)
    fallback_to_own: bool = False
    unaligned: str = "one_hot"
    counts: dict[str, int] | None = None  # positions distilled per kind (teacher, one_hot, own)

    def fraction_from_others(self) -> float:
        return float((self.selection >= 0).float().mean()) if self.selection.numel() else 0.0

    def batch(self, samples: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """Targets of public ``samples`` [B]: ids int64 [B, W, K], values float16
        [B, W, K], mask bool [B, W] (positions that are distilled)."""
        ids = _fit(self.own.indices[samples], width).long()
        vals = _fit(self.own.values[samples], width)
        lengths = self.own.lengths[samples].long()
        positions = torch.arange(width)[None, :] < lengths[:, None]
        sel = self.selection[samples]
        own = (sel < 0)[:, None] & positions if self.fallback_to_own else \
            torch.zeros_like(positions)
        teacher = torch.zeros_like(positions)
        hole = torch.zeros_like(positions)
        for m, other in enumerate(self.others):
            pick = (sel == m).nonzero().flatten()
            if not len(pick):
                continue
            t_ids, t_vals, t_mask = other.rows(samples[pick], width)
            t_mask &= positions[pick]
            ids[pick] = torch.where(t_mask[..., None], t_ids, ids[pick])
            vals[pick] = torch.where(t_mask[..., None], t_vals, vals[pick])
            teacher[pick] = t_mask
            hole[pick] = positions[pick] & ~t_mask
        one_hot = torch.zeros_like(positions)
        nxt, nxt_target = self._next_tokens(samples, width)
        if self.unaligned == "own":
            own |= hole
        elif self.unaligned == "one_hot" and bool(hole.any()):
            # Appendix B 3(d): a one-hot target on the ground-truth next token.
            one_hot = hole & (nxt >= 0)
            ids[one_hot] = 0
            ids[..., 0] = torch.where(one_hot, nxt, ids[..., 0])
            vals[one_hot] = PAD_VALUE
            vals[..., 0] = torch.where(one_hot, torch.zeros((), dtype=vals.dtype), vals[..., 0])
        mask = (teacher | own | one_hot) & positions
        if self.counts is not None:  # positions that predict a real token (kd_positions: all)
            real = torch.arange(width)[None, :] < (lengths - 1)[:, None]
            # diagnostic: does the projected teacher's top-1 name the learner's next token?
            top1 = ids.gather(-1, vals.float().argmax(-1, keepdim=True)).squeeze(-1)
            agree = teacher & real & (top1 == nxt)
            parts = (("teacher", teacher & real), ("one_hot", one_hot & real),
                     ("own", own & real), ("teacher_top1", agree),
                     ("teacher_target", teacher & real & nxt_target),
                     ("teacher_top1_target", agree & nxt_target))
            for key, part in parts:
                self.counts[key] = self.counts.get(key, 0) + int(part.sum())
        return ids, vals, mask

    def _next_tokens(self, samples: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """Ground-truth next token at each position of ``samples`` (-1 past the end) and
        whether it is a target token (the answer, or EOS after it)."""
        nxt = torch.full((len(samples), width), -1, dtype=torch.int64)
        target = torch.zeros((len(samples), width), dtype=torch.bool)
        for b, n in enumerate(samples.tolist()):
            seq = self.public.seqs[n]
            ids = seq["input_ids"][1: width + 1]
            nxt[b, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
            labels = torch.tensor(seq.get("labels", seq["input_ids"])[1: width + 1],
                                  dtype=torch.int64)  # no labels: every token a target
            target[b, : len(labels)] = labels != IGNORE_INDEX
        return nxt, target

    def diagnostics(self) -> dict[str, float]:
        """What DualMinCE and the projection gave, over every distilled batch so far:
        ``kd_teacher_top1`` (``_target``): share of the teacher's positions (predicting a
        target token) whose top-1 is the learner's ground-truth next token."""
        c = self.counts or {}
        return {"kd_teacher_top1": c.get("teacher_top1", 0) / max(c.get("teacher", 0), 1),
                "kd_teacher_top1_target": c.get("teacher_top1_target", 0)
                / max(c.get("teacher_target", 0), 1)}


def build_targets(own: TopKLogits, others: list[Received], public: PublicSet,
                  selection: Tensor, *, fallback_to_own: bool = False,
                  unaligned: str = "one_hot") -> KDTargets:
    """The targets of every public sample, given which model each one distils from.

    ``own``: the learner's S on D_p; ``others``: received knowledge sets joined to D_p
    (:func:`to_receiver`); ``selection`` [N]: the other model each sample distils from, -1
    none (FedMKT: DualMinCE).  A sample with -1 is left out of L_KD unless
    ``fallback_to_own`` (FATE-LLM: distil towards the learner's own top-K).  Where the
    selected model has no aligned position: ``unaligned`` = ``one_hot`` (ground-truth
    token, FedMKT Appendix B 3(d)), ``own`` (the learner's own top-K) or ``skip`` (no
    distillation there).
    """
    if unaligned not in ("one_hot", "own", "skip"):
        raise ValueError(f"build_targets: unaligned must be one_hot, own or skip, got "
                         f"{unaligned!r}")
    return KDTargets(own, list(others), selection, public, public.index(),
                     fallback_to_own=fallback_to_own, unaligned=unaligned, counts={})


def kd_loss(targets: KDTargets, model_outputs: Any, batch: dict[str, Tensor], *,
            temperature: float, positions: str) -> Tensor:
    """L_KD of one batch (FedMKT Eqs. 7, 8): CE of the model against its rows' top-K targets.

    A batch row finds its public sample by its token ids.  Logits at t predict token
    t + 1, so position t counts when t + 1 is a real token (``all``) or a target token.
    """
    ids = batch["input_ids"].cpu().numpy().astype(np.int64)
    lens = batch["attention_mask"].sum(1).tolist()
    rows = torch.tensor([targets.index[ids[b, :n].tobytes()] for b, n in enumerate(lens)])
    logits = model_outputs.logits
    width = logits.shape[1]
    tgt_ids, tgt_vals, mask = targets.batch(rows, width)
    tgt_ids, tgt_vals, mask = (t.to(logits.device) for t in (tgt_ids, tgt_vals, mask))
    nxt = (batch["labels"] != IGNORE_INDEX) if positions == "target" \
        else batch["attention_mask"] > 0
    mask[:, :-1] &= nxt[:, 1:]
    mask[:, -1] = False
    outside = tgt_ids >= logits.shape[-1]  # a mapped id past this model's output layer
    if bool(outside.any()):
        tgt_vals = tgt_vals.masked_fill(outside, PAD_VALUE)
        tgt_ids = tgt_ids.masked_fill(outside, 0)
    return sparse_kd_loss(logits, tgt_ids, tgt_vals, mask, temperature)


def _fit(t: Tensor, width: int) -> Tensor:
    """``t`` [N, L, ...] cut or zero-padded to L = ``width``."""
    if t.shape[1] >= width:
        return t[:, :width]
    out = torch.zeros((t.shape[0], width, *t.shape[2:]), dtype=t.dtype)
    out[:, : t.shape[1]] = t
    return out
