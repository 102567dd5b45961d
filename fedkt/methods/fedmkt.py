"""FedMKT: federated mutual knowledge transfer between a server LLM and client SLMs.

Fan, Ma, Kang, Gu, Song, Fan, Chen, Yang, "FedMKT: Federated Mutual Knowledge Transfer
for Large and Small Language Models", COLING 2025 (arXiv:2406.02224), Algorithms 1-2,
Appendix A (the steps of a round) and B (token alignment).

The server holds an LLM with a LoRA adapter; client k holds its own SLM (any
architecture and tokenizer) with a LoRA adapter that never leaves it.  Both sides
know the public set D_p (``data.split``: the ``public`` part).  One round:

1. client k trains its LoRA on its private data with the task loss (Eq. 4);
2. it computes its knowledge set S_k on D_p: per-sample loss and the top-K logits of
   every position (:class:`~fedkt.alignment.TopKLogits`, 6 bytes an entry), and uploads
   it (no text: samples are named by their index in D_p);
3. the server maps each S_k into the LLM's token space: positions through the sequence
   alignment of the two tokenizations of each public sample (computed once per
   tokenizer pair, cached in memory and on disk), ids through the MinED vocabulary
   mapping (:mod:`fedkt.alignment`);
4. DualMinCE (Algorithm 2, :func:`dual_min_ce`): per public sample the client logits
   with the smallest loss are used only if that loss is below the LLM's own loss on
   the sample; otherwise the sample gets no distillation (it is not in S~), or, with
   ``fallback_to_own: true`` (FATE-LLM's "greater" strategy), the LLM's own top-K;
   a position without an aligned teacher position gets a one-hot target on the
   ground-truth token (Appendix B 3(d); ``unaligned``);
5. the server trains its LoRA on D_p with L2 = lam L_FT + (1 - lam) L_KD (Eqs. 5, 7, 9);
6. the server computes S_0 on D_p with its new adapter and sends it to every client;
7. client k maps S_0 into its own token space, applies DualMinCE against its own
   loss (its S_k of step 2) and trains on L3 = lam L_FT + (1 - lam) L_KD (Eqs. 6, 8, 10).

``L_KD`` is the cross-entropy of the student against the softmax of the selected top-K
logits (:func:`~fedkt.alignment.sparse_kd_loss`, no dense [B, L, V] target).

Settings: heterogeneous (every client its own model), homogeneous (one client model;
``post_fedavg`` averages the client adapters after step 7 as FATE-LLM's option does),
one-to-one (one client).  ``llm2slm`` is the baseline where the LLM stays frozen and
only teaches: steps 2-5 are skipped and S_0 travels once (clients keep it on disk).

Messages per round and client: one ``train_and_share`` call (steps 1-2) and one
``distill`` call (step 7, and the client's evaluation).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedkt.alignment import (
    PAD_VALUE,
    Alignment,
    TopKLogits,
    align_sequences,
    cache_dir,
    project_topk,
    sparse_kd_loss,
    vocab_hash,
    vocab_mapping,
)
from fedkt.config import ConfigError, MethodConfig, ModelConfig, RunConfig
from fedkt.data.lm_batches import IGNORE_INDEX, make_batches, pad_token_id, tokenize_pairs
from fedkt.losses import lambda_mix
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Clients, Method, Server, mean_number
from fedkt.payload import Payload, PayloadError, check_tensor
from fedkt.precision import autocast, upcast
from fedkt.train.lm import (
    LM,
    client_evaluate,
    client_lm,
    client_test_metrics,
    evaluate_lm,
    lm_pairs,
    saved_client_lm,
    server_lm,
    train_lm,
)
from fedkt.train.optim import grad_norm

log = logging.getLogger("fedkt.fedmkt")

__all__ = [
    "FedMKTConfig",
    "FedMKTServer",
    "KDTargets",
    "LLM2SLMConfig",
    "PublicSet",
    "Received",
    "build_targets",
    "dual_min_ce",
    "knowledge_set",
    "pack_topk",
    "unpack_topk",
]


class FedMKTConfig(MethodConfig):
    """FedMKT hyper-parameters.

    Paper defaults live in ``training`` (LoRA r=8, alpha=16, dropout 0.05; AdamW betas
    (0.9, 0.95), weight decay 0.1, warm-up 0.008, max grad norm 1.0, batch 4, one local
    epoch); the method's own are below.
    """

    name: Literal["fedmkt"] = "fedmkt"
    # lambda of Eqs. 9-10: weight of the fine-tuning loss against the distillation loss.
    lam: float = Field(0.9, ge=0.0, le=1.0)
    # Logits kept per position in S_k and S_0 (FATE-LLM's top_k_logits_keep).
    top_k: int = Field(128, ge=1)
    # Softmax temperature of L_KD (no T**2 factor).
    temperature: float = Field(1.0, gt=0)
    # Passes over D_p per round: the server's step 5 and each client's step 7.
    server_kd_epochs: float = Field(1.0, gt=0)
    client_kd_epochs: float = Field(1.0, gt=0)
    # Learning rate of step 7 only (None: the client model's, clients.models[i].lr, else
    # training.lr).  The LLM's rate is server.lr (D.1), the SLMs' clients.models[i].lr.
    client_kd_lr: float | None = Field(None, gt=0)
    # False: LLM2SLM, the LLM is frozen and only transfers knowledge to the SLMs.
    llm_training: bool = True
    # Per-sample loss DualMinCE compares: mean CE over the target tokens ("mean", as the
    # paper and FATE-LLM) or their sum, the negative log-likelihood of the target text,
    # which does not depend on how finely a tokenizer cuts it ("sum").
    selection_loss: Literal["mean", "sum"] = "mean"
    # Where no other model beats this model's own loss: leave the sample out of L_KD
    # (False: Algorithm 2, S~ holds only samples where the other model's loss is lower) or
    # distil towards the model's own top-K (True: FATE-LLM's choice, an extension).
    fallback_to_own: bool = False
    # A position of a selected sample with no aligned teacher position gets a one-hot
    # target on the ground-truth next token ("one_hot", Appendix B 3(d)), the model's own
    # top-K ("own", an extension) or no distillation ("skip").
    unaligned: Literal["one_hot", "own", "skip"] = "one_hot"
    # Positions L_KD covers: every position that predicts a real token ("all", the paper)
    # or only those predicting target tokens ("target", like L_FT).
    kd_positions: Literal["all", "target"] = "all"
    # Homogeneous setting only: FedAvg of the client adapters after step 7.
    post_fedavg: bool = False


    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, values: Any) -> Any:
        if isinstance(values, dict) and "server_lr" in values:
            raise ValueError("server_lr: the LLM's learning rate is now server.lr (a learning "
                             "rate per model, FedMKT D.1); remove method.server_lr")
        return values


class LLM2SLMConfig(FedMKTConfig):
    """The LLM2SLM baseline: FedMKT with the server LLM frozen (only LLM -> SLM)."""

    name: Literal["llm2slm"] = "llm2slm"  # type: ignore[assignment]
    llm_training: bool = False


# --------------------------------------------------------------------------- DualMinCE


def dual_min_ce(own_loss: Tensor, other_losses: Tensor) -> Tensor:
    """Algorithm 2 (DualMinCE) for every sample: which model's logits to distil from.

    ``own_loss`` [N]: the learner's own per-sample loss; ``other_losses`` [M, N]: the
    other models' (``inf`` where a model sent nothing for the sample).  Returns int64
    [N]: the index ``m`` of the other model with the smallest loss when that loss is
    strictly below the own loss, else -1 (keep the learner's own knowledge).  Ties
    between other models go to the lowest index.
    """
    own_loss = torch.as_tensor(own_loss, dtype=torch.float64)
    other = torch.as_tensor(other_losses, dtype=torch.float64)
    if other.dim() != 2 or other.shape[1] != own_loss.shape[0]:
        raise ValueError(f"dual_min_ce: other_losses should be [M, {own_loss.shape[0]}], "
                         f"got {tuple(other.shape)}")
    if other.shape[0] == 0:
        return torch.full(own_loss.shape, -1, dtype=torch.int64)
    other = torch.nan_to_num(other, nan=math.inf)
    best = other.argmin(dim=0)  # first minimum: lowest index on ties
    best_loss = other.gather(0, best[None]).squeeze(0)
    return torch.where(best_loss < own_loss, best, torch.full_like(best, -1))


# --------------------------------------------------------------------------- knowledge sets


def vocab_size(tokenizer: Any) -> int:
    """Ids a tokenizer can produce: the range the top-K ids of its model must lie in."""
    vocab = tokenizer.get_vocab()
    return max(len(tokenizer), max(vocab.values()) + 1 if vocab else 0)


@dataclass
class PublicSet:
    """D_p tokenized for one model: (prompt, target) sequences in public-set order."""

    seqs: list[dict[str, list[int]]]
    pad_id: int

    @classmethod
    def build(cls, cfg: RunConfig, tokenizer: Any, records: list[dict]) -> PublicSet:
        seqs = tokenize_pairs(tokenizer, lm_pairs(cfg, records), cfg.data.max_length)
        return cls(seqs, pad_token_id(tokenizer))

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def lengths(self) -> list[int]:
        return [len(s["input_ids"]) for s in self.seqs]

    def index(self) -> dict[bytes, int]:
        """Token ids -> sample index (a batch row finds its sample; equal ids, equal knowledge)."""
        out: dict[bytes, int] = {}
        for i, s in enumerate(self.seqs):
            out.setdefault(np.asarray(s["input_ids"], dtype=np.int64).tobytes(), i)
        return out

    def digest(self) -> str:
        h = hashlib.sha256()
        for s in self.seqs:
            h.update(len(s["input_ids"]).to_bytes(4, "little"))
            h.update(np.asarray(s["input_ids"], dtype=np.int64).tobytes())
        return h.hexdigest()


def _sample_losses(logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
    """Per-sample CE of next-token predictions on the target tokens (mean or sum)."""
    tgt = labels[:, 1:]
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), tgt.clamp_min(0), reduction="none")
    keep = (tgt != IGNORE_INDEX).to(ce.dtype)
    total = (ce * keep).sum(1)
    return total if reduction == "sum" else total / keep.sum(1).clamp_min(1.0)


@torch.no_grad()
def knowledge_set(lm: LM, public: PublicSet, k: int, *, batch_size: int,
                  reduction: str = "mean") -> TopKLogits:
    """S on D_p: top-K logits of every position and each sample's loss (Appendix A).

    Logits are cut to the tokenizer's id range before the top-K, so every shipped id is
    a token the receiver can map.  The top-K is taken on the model's device.
    """
    model = lm.model
    device = next(model.parameters()).device
    vocab = vocab_size(lm.tokenizer)
    n, width = len(public), max(public.lengths, default=0)
    values = torch.zeros(n, width, k, dtype=torch.float16)
    indices = torch.zeros(n, width, k, dtype=torch.int32)
    losses = torch.zeros(n, dtype=torch.float32)
    was_training = model.training
    model.eval()
    row = 0
    for batch in make_batches(public.seqs, batch_size, None, public.pad_id):
        batch = {key: v.to(device) for key, v in batch.items()}
        logits = model(input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"]).logits
        if k > min(vocab, logits.shape[-1]):
            raise ValueError(f"method.top_k={k} exceeds the model's vocabulary "
                             f"({min(vocab, logits.shape[-1])})")
        top_v, top_i = torch.topk(logits[..., :vocab], k, dim=-1)
        b, w = top_v.shape[:2]
        pad = (batch["attention_mask"] == 0).cpu()[..., None]
        top_v = top_v.float().cpu().clamp(PAD_VALUE, -PAD_VALUE).masked_fill(pad, 0.0)
        values[row:row + b, :w] = top_v.to(torch.float16)
        indices[row:row + b, :w] = top_i.cpu().to(torch.int32).masked_fill(pad, 0)
        losses[row:row + b] = _sample_losses(logits, batch["labels"], reduction).cpu()
        row += b
    model.train(was_training)
    return TopKLogits(sample_ids=torch.arange(n, dtype=torch.int64), values=values,
                      indices=indices, lengths=torch.tensor(public.lengths, dtype=torch.int32),
                      vocab_size=vocab, losses=losses)


# --------------------------------------------------------------------------- wire format


def pack_topk(topk: TopKLogits) -> dict[str, Tensor]:
    """Contiguous tensors for a payload: only real positions travel (no padding).

    ``values`` fp16 [T, K] and ``indices`` int32 [T, K] (T = sum of lengths, 6 bytes an
    entry), ``lengths`` int32 [N], ``sample_ids`` int64 [N], ``losses`` float32 [N].
    """
    valid = torch.arange(topk.values.shape[1])[None, :] < topk.lengths[:, None].long()
    return {"values": topk.values[valid].contiguous(), "indices": topk.indices[valid].contiguous(),
            "lengths": topk.lengths, "sample_ids": topk.sample_ids, "losses": topk.losses}


def packed_entries(packed: dict[str, Tensor]) -> tuple[int, int]:
    """(top-K entries, bytes of their values + ids) of a packed knowledge set."""
    v, i = packed["values"], packed["indices"]
    return v.numel(), v.numel() * v.element_size() + i.numel() * i.element_size()


def unpack_topk(packed: dict[str, Tensor], vocab: int, k: int, source: str) -> TopKLogits:
    """Rebuild a received knowledge set and validate it (shapes, K, id range, finite).

    Raises :class:`~fedkt.payload.PayloadError` naming ``source`` and the field.
    """
    want = {"values": torch.float16, "indices": torch.int32, "lengths": torch.int32,
            "sample_ids": torch.int64, "losses": torch.float32}
    missing = sorted(set(want) - set(packed))
    if missing:
        raise PayloadError(f"{source}: top-K payload lacks field(s) {missing}")
    extra = sorted(set(packed) - set(want))
    if extra:
        raise PayloadError(f"{source}: top-K payload has unexpected field(s) {extra}")
    for name, dtype in want.items():
        ndim = 2 if name in ("values", "indices") else 1
        check_tensor(packed[name], f"{source}: top-K field {name!r}",
                     shape=[None] * ndim, dtype=dtype, finite=False)
    lengths = packed["lengths"]
    n = lengths.shape[0]
    for name in ("sample_ids", "losses"):
        if packed[name].shape[0] != n:
            raise PayloadError(f"{source}: top-K field {name!r} has {packed[name].shape[0]} "
                               f"entries for {n} samples")
    if n and int(lengths.min()) < 0:
        raise PayloadError(f"{source}: top-K field 'lengths' holds a negative length")
    total = int(lengths.long().sum())
    for name in ("values", "indices"):
        t = packed[name]
        if tuple(t.shape) != (total, k):
            raise PayloadError(f"{source}: top-K field {name!r} has shape {tuple(t.shape)}, "
                               f"expected ({total}, {k}) (sum of lengths, K)")
    width = int(lengths.max()) if n else 0
    valid = torch.arange(width)[None, :] < lengths[:, None].long()
    values = torch.zeros(n, width, k, dtype=torch.float16)
    indices = torch.zeros(n, width, k, dtype=torch.int32)
    values[valid] = packed["values"]
    indices[valid] = packed["indices"]
    topk = TopKLogits(sample_ids=packed["sample_ids"], values=values, indices=indices,
                      lengths=lengths, vocab_size=vocab, losses=packed["losses"])
    try:
        topk.validate(vocab, k, source)
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    v = packed["values"]
    if v.numel() and not bool((v[:, :-1] >= v[:, 1:]).all()):  # torch.topk order
        raise PayloadError(f"{source}: top-K field 'values' is not sorted in descending order")
    return topk


# --------------------------------------------------------------------------- alignment


_ALIGN_MEMORY: OrderedDict[str, list[Alignment]] = OrderedDict()
_MAP_MEMORY: dict[tuple[str, str], np.ndarray] = {}


def public_alignments(src_tok: Any, tgt_tok: Any, src: PublicSet, tgt: PublicSet
                      ) -> list[Alignment]:
    """Alignment of every public sample's two tokenizations (src = the teacher's).

    Computed once per (public set, tokenizer pair): kept in this process and on disk
    under ``cache_dir()/alignments``, keyed by both vocabularies and the token ids.
    """
    from fedkt.alignment.sequence import ALIGNMENT_VERSION, cached_alignments

    key = hashlib.sha256(f"fedmkt:{ALIGNMENT_VERSION}:{vocab_hash(src_tok)}:{vocab_hash(tgt_tok)}:"
                         f"{src.digest()}:{tgt.digest()}".encode()).hexdigest()[:32]
    if key in _ALIGN_MEMORY:
        _ALIGN_MEMORY.move_to_end(key)
        return _ALIGN_MEMORY[key]
    aligns = cached_alignments(
        cache_dir("alignments") / f"fedmkt-{key}.npz",
        lambda: [align_sequences(a["input_ids"], b["input_ids"], src_tok, tgt_tok)
                 for a, b in zip(src.seqs, tgt.seqs, strict=True)],
        len(src))
    _ALIGN_MEMORY[key] = aligns
    while len(_ALIGN_MEMORY) > 16:
        _ALIGN_MEMORY.popitem(last=False)
    return aligns


def _vocab_map(src_tok: Any, tgt_tok: Any) -> np.ndarray:
    key = (vocab_hash(src_tok), vocab_hash(tgt_tok))
    if key not in _MAP_MEMORY:
        _MAP_MEMORY[key] = vocab_mapping(src_tok, tgt_tok)
    return _MAP_MEMORY[key]


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


def to_receiver(topk: TopKLogits, src_tok: Any, src: PublicSet, tgt_tok: Any, tgt: PublicSet,
                source: str) -> Received:
    """Steps 3/7: a received knowledge set joined to D_p, ready to project into the
    receiver's tokens batch by batch (:meth:`Received.rows`).

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
    if ids.numel() and not (vocab_hash(src_tok) == vocab_hash(tgt_tok)
                            and src.digest() == tgt.digest()):
        out.aligns = public_alignments(src_tok, tgt_tok, src, tgt)
        out.vocab_map = _vocab_map(src_tok, tgt_tok)
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


def build_targets(own: TopKLogits, others: list[Received], public: PublicSet, *,
                  fallback_to_own: bool = False, unaligned: str = "one_hot") -> KDTargets:
    """Steps 4 / 7: DualMinCE per sample (Algorithm 2).

    ``own``: the learner's S on D_p; ``others``: received knowledge sets joined to D_p
    (:func:`to_receiver`).  A sample whose best other model is not strictly better than
    the learner is left out of L_KD (Algorithm 2, line 10) unless ``fallback_to_own``
    (FATE-LLM: distil towards the learner's own top-K).  Where the selected model has no
    aligned position: ``unaligned`` = ``one_hot`` (ground-truth token, Appendix B 3(d)),
    ``own`` (the learner's own top-K) or ``skip`` (no distillation there).
    """
    if unaligned not in ("one_hot", "own", "skip"):
        raise ValueError(f"build_targets: unaligned must be one_hot, own or skip, got "
                         f"{unaligned!r}")
    n = own.values.shape[0]
    other_losses = torch.stack([o.losses for o in others]) if others else torch.zeros(0, n)
    selection = dual_min_ce(own.losses, other_losses)
    return KDTargets(own, list(others), selection, public, public.index(),
                     fallback_to_own=fallback_to_own, unaligned=unaligned, counts={})


def kd_loss(targets: KDTargets, model_outputs: Any, batch: dict[str, Tensor], *,
            temperature: float, positions: str) -> Tensor:
    """L_KD of one batch (Eqs. 7, 8): CE of the model against its rows' top-K targets.

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


# Logged with each distillation (server and client rows): the KD term's gradient norm over
# L_FT's on the first batch, both as weighted in L (0 at lam = 1), and the top-1 agreement
# of the projected teacher with the learner's ground-truth next token.
_DIAGNOSTICS = ("kd_grad_ratio", "kd_teacher_top1", "kd_teacher_top1_target")


def distill(cfg: RunConfig, lm: LM, records: list[dict], targets: KDTargets, *, epochs: float,
            lr: float | None, seed: int, desc: str) -> dict[str, float]:
    """Train ``lm`` on D_p with L = lam L_FT + (1 - lam) L_KD (Eq. 9 server, Eq. 10 client).

    :func:`~fedkt.training.train_lm` adds ``task_weight * L_FT`` (Eqs. 5, 6) and the
    ``extra_loss`` (1 - lam) L_KD, i.e. :func:`~fedkt.losses.lambda_mix`.
    """
    m: FedMKTConfig = cfg.method
    kd_cfg = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"local_epochs": epochs})})
    kd_sum: list[float] = []
    ratio: list[float] = []

    def extra(model: torch.nn.Module, batch: dict[str, Tensor], outputs: Any, step: int
              ) -> Tensor:
        kd = kd_loss(targets, outputs, batch, temperature=m.temperature,
                     positions=m.kd_positions)
        kd_sum.append(float(kd.detach()))
        kd_term = lambda_mix(0.0, kd, m.lam)  # (1 - lam) * L_KD
        if step == 0:  # diagnostic: the KD term's gradient against L_FT's, as weighted
            params = [p for p in model.parameters() if p.requires_grad]
            ft = lambda_mix(1.0, 0.0, m.lam) * upcast(outputs.loss)
            ratio.append(grad_norm(kd_term, params) / max(grad_norm(ft, params), 1e-30))
        return kd_term

    stats = train_lm(kd_cfg, lm, records, seed=seed, extra_loss=extra,
                     task_weight=lambda_mix(1.0, 0.0, m.lam), lr=lr, desc=desc)
    counts = targets.counts or {}
    total = max(sum(counts.get(k, 0) for k in ("teacher", "one_hot", "own")), 1)
    return {"loss": stats["loss"], "kd_loss": sum(kd_sum) / max(len(kd_sum), 1),
            "steps": stats["steps"], "kd_one_hot": counts.get("one_hot", 0) / total,
            "kd_grad_ratio": ratio[0] if ratio else 0.0, **targets.diagnostics()}


# --------------------------------------------------------------------------- server


class FedMKTServer(Server[FedMKTConfig]):
    """Algorithm 1, server side: align the clients' S_k, DualMinCE, train, send S_0."""

    def setup(self) -> None:
        cfg, m = self.cfg, self.method
        if cfg.server is None:
            raise ConfigError("server: fedmkt needs the server's LLM (server: {name: ...})")
        if not cfg.clients.models:
            raise ConfigError("clients.models: fedmkt needs the clients' SLM(s)")
        models = {c.model_dump_json(exclude={"lr"}) for c in cfg.clients.models}
        if m.post_fedavg and len(models) > 1:
            raise ConfigError("method.post_fedavg: averaging client adapters needs one model "
                              "shared by all clients (the homogeneous setting)")
        records = self.data().public
        if not records:
            raise ConfigError("data.split: fedmkt transfers knowledge on the public set, which "
                              "is empty; use split scheme 'fedmkt' or public_fraction > 0")
        self.llm = server_lm(cfg)
        self.adapter = self.llm.trainable()
        self.public = PublicSet.build(cfg, self.llm.tokenizer, records)
        self.global_adapter: dict[str, Tensor] | None = None
        self.s0: TopKLogits | None = None  # S_0 of the current adapter
        self.s0_version = 0  # round whose step 6 made S_0 (0: the initial adapter)
        self._client_sides: dict[str, tuple[Any, PublicSet]] = {}

    def own_knowledge(self) -> TopKLogits:
        """S_0 of the LLM's current adapter (recomputed after training or a resume)."""
        if self.s0 is None:
            with autocast(self.cfg, self.llm.model):
                self.s0 = knowledge_set(self.llm.reset(self.adapter), self.public,
                                        self.method.top_k, batch_size=self.cfg.eval.batch_size,
                                        reduction=self.method.selection_loss)
        return self.s0

    def client_side(self, cid: int) -> tuple[Any, PublicSet]:
        """Client ``cid``'s tokenizer and its tokenization of D_p (for step 3)."""
        mcfg: ModelConfig = self.cfg.clients.model_for(cid)
        key = mcfg.model_dump_json()
        if key not in self._client_sides:
            tok = _tokenizer(mcfg)
            self._client_sides[key] = (tok, PublicSet.build(self.cfg, tok, self.data().public))
        return self._client_sides[key]

    def round(self, rnd: int, clients) -> dict[str, float]:
        m: FedMKTConfig = self.method
        # 1-2. clients train on private data (Eq. 4) and share S_k (not in LLM2SLM); they
        # say whether they hold the S_0 this round will send (LLM2SLM: the one of round 0)
        s0_next = rnd if m.llm_training else self.s0_version
        msg = Payload(share=m.llm_training, s0_version=s0_next)
        replies = clients.call("train_and_share", {cid: msg for cid in clients.ids})
        metrics: dict[str, float] = {}
        loss = mean_number(replies, "train_loss")
        if loss is not None:
            metrics["train/client_loss"] = loss
        if m.llm_training:
            metrics.update(self.learn_from_clients(rnd, replies, clients))
            self.s0, self.s0_version = None, rnd
        # 6. S_0 of the (new) adapter goes to every client that lacks this version
        s0 = pack_topk(self.own_knowledge())
        down = Payload(s0_version=self.s0_version, vocab_size=self.s0.vocab_size, k=m.top_k)
        msgs = {}
        for cid in replies:
            has = bool(replies[cid].get("has_s0", False))
            msgs[cid] = Payload(down) if has else Payload(down, topk=s0)
        # 7. clients align S_0, DualMinCE against their own loss, train on L3
        if m.post_fedavg and msgs:  # ... and FedAvg their adapters (homogeneous SLMs), which
            # every client then adopts and evaluates (an extension: the paper does not average)
            got, self.global_adapter = clients.aggregate(
                "distill", msgs, field="adapter", like=client_lm(self.cfg, 0).initial)
            clients.call("adopt", {cid: Payload(adapter=self.global_adapter) for cid in got})
        else:
            got = clients.call("distill", msgs)
        kd = mean_number(got, "kd_loss")
        if kd is not None:
            metrics["train/client_kd_loss"] = kd
        return metrics

    def learn_from_clients(self, rnd: int, replies: dict[int, Payload], clients: Clients
                           ) -> dict[str, float]:
        """Steps 3-5: validate and align each S_k, DualMinCE, train the LLM on L2.

        A client whose S_k fails validation is excluded from the round (with the reason).
        """
        m: FedMKTConfig = self.method
        own = self.own_knowledge()

        def receive(cid: int, reply: Payload) -> tuple[Received, dict]:
            source = f"client {cid}"
            tok, pub = self.client_side(cid)
            packed = reply.state("topk", source=source, finite=False)
            if reply.get("k") != m.top_k:
                raise PayloadError(f"{source}: field 'k' is {reply.get('k')!r}, "
                                   f"expected {m.top_k}")
            topk = unpack_topk(packed, vocab_size(tok), m.top_k, source)  # on receipt
            # 3. SLM -> LLM tokens
            return to_receiver(topk, tok, pub, self.llm.tokenizer, self.public, source), packed

        checked = clients.validate(dict(sorted(replies.items())), receive, "train_and_share")
        rejected = len(replies) - len(checked)
        others: list[Received] = [aligned for aligned, _ in checked.values()]
        entries = tensor_bytes = 0
        for _, packed in checked.values():
            e, b = packed_entries(packed)
            entries, tensor_bytes = entries + e, tensor_bytes + b
        # 4. DualMinCE; 5. L2 = lam L_FT + (1 - lam) L_KD on D_p (Eqs. 5, 7, 9)
        targets = build_targets(own, others, self.public, fallback_to_own=m.fallback_to_own,
                                unaligned=m.unaligned)
        stats = distill(self.cfg, self.llm.reset(self.adapter), self.data().public, targets,
                        epochs=m.server_kd_epochs, lr=self.cfg.server.lr, seed=self.seed(rnd, "kd"),
                        desc="server kd")
        self.adapter = self.llm.trainable()
        out = {"train/loss": stats["loss"], "train/kd_loss": stats["kd_loss"],
               "train/kd_from_clients": targets.fraction_from_others(),
               "train/kd_one_hot": stats["kd_one_hot"],
               **{f"train/{k}": stats[k] for k in _DIAGNOSTICS},
               "train/topk_entries": entries, "train/rejected_clients": rejected}
        if entries:
            out["train/topk_bytes_per_entry"] = tensor_bytes / entries
        return out

    def evaluate(self, rnd: int) -> dict[str, float]:
        return evaluate_lm(self.cfg, self.llm.reset(self.adapter), self.data().test)

    def server_model(self) -> LM:
        return self.llm.reset(self.adapter)

    def state_dict(self) -> dict[str, Tensor]:
        state = {f"llm.{k}": v for k, v in self.adapter.items()}
        if self.global_adapter is not None:
            state.update({f"slm.{k}": v for k, v in self.global_adapter.items()})
        state["s0_version"] = torch.tensor([self.s0_version], dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.adapter = {k[4:]: v for k, v in state.items() if k.startswith("llm.")}
        slm = {k[4:]: v for k, v in state.items() if k.startswith("slm.")}
        self.global_adapter = slm or None
        if "s0_version" in state:
            self.s0_version = int(state["s0_version"][0])
        self.s0 = None


# --------------------------------------------------------------------------- client side


_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(mcfg: ModelConfig) -> Any:
    """A model's tokenizer, loaded once per process."""
    from fedkt.models import load_tokenizer

    key = mcfg.model_dump_json()
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(mcfg)
    return _TOKENIZERS[key]


def _client_public(ctx: ClientContext, lm: LM) -> PublicSet:
    return PublicSet.build(ctx.cfg, lm.tokenizer, ctx.data().public)


def client_train_and_share(ctx: ClientContext, msg: Payload) -> Payload:
    """Steps 1-2: train the LoRA on private data (Eq. 4), compute S_k, upload it if asked."""
    m: FedMKTConfig = ctx.method
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(ctx.load_state("adapter"))  # None in round 1: the initial adapter
    lr = ctx.cfg.clients.model_for(ctx.cid).lr  # D.1: each SLM's own rate
    stats = train_lm(ctx.cfg, lm, ctx.private, seed=ctx.seed("train"), lr=lr,
                     desc=f"{ctx.name} train")
    ctx.save_state("adapter", lm.trainable())
    with autocast(ctx.cfg, lm.model):
        own = knowledge_set(lm, _client_public(ctx, lm), m.top_k,
                            batch_size=ctx.cfg.eval.batch_size, reduction=m.selection_loss)
    packed = pack_topk(own)
    ctx.save_state("own_topk", packed)  # for this client's own DualMinCE in step 7
    stored = ctx.load_state("server_topk")
    has_s0 = stored is not None and int(stored["version"][0]) == msg.get("s0_version")
    loss = stats["loss"] if math.isfinite(stats["loss"]) else 0.0
    metrics = {"train/loss": stats["loss"], "train/steps": stats["steps"]}
    reply = Payload(train_loss=loss, has_s0=has_s0, metrics=metrics)
    if msg.get("share"):
        entries, nbytes = packed_entries(packed)
        reply.update(topk=packed, vocab_size=own.vocab_size, k=m.top_k)
        metrics.update({"train/topk_entries": entries, "train/topk_bytes_per_entry": nbytes / entries
                        if entries else 0.0})
    return reply


def client_distill(ctx: ClientContext, msg: Payload) -> Payload:
    """Step 7: align S_0 to this client's tokens, DualMinCE, train on L3 (Eqs. 6, 8, 10)."""
    m: FedMKTConfig = ctx.method
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(ctx.load_state("adapter"))
    public = _client_public(ctx, lm)
    own_packed = ctx.load_state("own_topk")
    if own_packed is None:
        raise RuntimeError(f"{ctx.name}: no knowledge set of its own on disk; 'train_and_share' "
                           "must run before 'distill'")
    own = unpack_topk(own_packed, vocab_size(lm.tokenizer), m.top_k, f"{ctx.name} (own)")
    server_tok = _tokenizer(ctx.cfg.server)
    version = msg.get("s0_version")
    if "topk" in msg:
        packed = msg.state("topk", source="server", finite=False)
        ctx.save_state("server_topk", {**packed, "version": torch.tensor([int(version)])})
    else:
        packed = ctx.load_state("server_topk")
        if packed is None or int(packed["version"][0]) != version:
            raise PayloadError(f"server: sent no S_0 but {ctx.name} holds no S_0 of version "
                               f"{version}")
        packed = {k: v for k, v in packed.items() if k != "version"}
    s0 = unpack_topk(packed, vocab_size(server_tok), m.top_k, "server")  # validated on receipt
    server_public = PublicSet.build(ctx.cfg, server_tok, ctx.data().public)
    aligned = to_receiver(s0, server_tok, server_public, lm.tokenizer, public, "server")
    targets = build_targets(own, [aligned], public, fallback_to_own=m.fallback_to_own,
                            unaligned=m.unaligned)
    stats = distill(ctx.cfg, lm, ctx.data().public, targets, epochs=m.client_kd_epochs,
                    lr=m.client_kd_lr or ctx.cfg.clients.model_for(ctx.cid).lr,
                    seed=ctx.seed("kd"), desc=f"{ctx.name} kd")
    ctx.save_state("adapter", lm.trainable())
    metrics = {"train/kd_loss": stats["kd_loss"], "train/l3_loss": stats["loss"],
               "train/kd_from_server": targets.fraction_from_others(),
               "train/kd_one_hot": stats["kd_one_hot"],
               **{f"train/{k}": stats[k] for k in _DIAGNOSTICS}}
    reply = Payload(kd_loss=stats["kd_loss"], metrics=metrics)
    if m.post_fedavg:  # evaluated in 'adopt', after the averaging
        reply.update(adapter=lm.trainable(), num_examples=len(ctx.private))
    else:
        metrics.update(client_test_metrics(ctx, lm))
    return reply


def client_adopt(ctx: ClientContext, msg: Payload) -> Payload:
    """``post_fedavg``: keep the averaged adapter as this client's model and evaluate it."""
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(msg.state("adapter", like=lm.initial, source="server"))
    ctx.save_state("adapter", lm.trainable())
    return Payload(metrics=client_test_metrics(ctx, lm))


# --------------------------------------------------------------------------- registry

_HANDLERS = {"train_and_share": client_train_and_share, "distill": client_distill,
             "adopt": client_adopt, "evaluate": client_evaluate}
_PAPER = ("Fan et al., FedMKT: Federated Mutual Knowledge Transfer for Large and Small "
          "Language Models, COLING 2025 (arXiv:2406.02224)")

METHOD = register(Method(
    name="fedmkt", config=FedMKTConfig, server=FedMKTServer, handlers=_HANDLERS,
    client_model=saved_client_lm, model_lr=True,
    server_sees="SLM top-K logits on public data", clients_see="LLM top-K logits on public data",
    summary="mutual top-K logit distillation between a server LLM and heterogeneous client "
            "SLMs (token alignment, DualMinCE)",
    paper=_PAPER,
))
LLM2SLM = register(Method(
    name="llm2slm", config=LLM2SLMConfig, server=FedMKTServer, handlers=_HANDLERS,
    client_model=saved_client_lm, model_lr=True,
    server_sees="nothing", clients_see="LLM top-K logits on public data",
    summary="FedMKT baseline: the server LLM stays frozen and only teaches the client SLMs",
    paper=_PAPER,
))
