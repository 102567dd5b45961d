"""Top-K logit transport, cross-tokenizer projection and the sparse distillation loss.

FedMKT (Fan et al.) Sec. 3.3 / Appendix B: clients and server exchange only the top-K
logits of every public-set position, plus each sample's loss (for DualMinCE selection).
An entry travels as an fp16 value and an int32 id: 6 bytes.  :func:`project_topk` moves
source top-K into the target's token space (ids through the MinED vocabulary mapping,
positions through the sequence alignment); :func:`sparse_kd_loss` is the cross-entropy
of the student against the softmax over those K logits, without a dense target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedkt.alignment.sequence import Alignment

__all__ = ["PAD_VALUE", "TENSOR_FIELDS", "TopKLogits", "project_topk", "sparse_kd_loss",
           "sparse_kl"]

# Value of an empty top-K slot (after merging duplicate ids, or outside the sample):
# the most negative finite fp16, so its softmax weight is 0 and validation passes.
PAD_VALUE = float(torch.finfo(torch.float16).min)

_DTYPES: dict[str, torch.dtype] = {
    "sample_ids": torch.int64,
    "values": torch.float16,
    "indices": torch.int32,
    "lengths": torch.int32,
    "losses": torch.float32,
}
TENSOR_FIELDS: tuple[str, ...] = tuple(_DTYPES)  # a TopKLogits' tensors (plus vocab_size)


@dataclass
class TopKLogits:
    """Top-K logits of N public-set samples (positions past ``lengths[n]`` are padding).

    ``sample_ids`` int64 [N], ``values`` float16 [N, L, K], ``indices`` int32 [N, L, K],
    ``lengths`` int32 [N], ``losses`` float32 [N] (each sample's own LM loss),
    ``vocab_size``: the producing model's vocabulary size.
    """

    sample_ids: torch.Tensor
    values: torch.Tensor
    indices: torch.Tensor
    lengths: torch.Tensor
    vocab_size: int
    losses: torch.Tensor

    def __post_init__(self) -> None:
        for name in _DTYPES:
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                setattr(self, name, torch.from_numpy(value))

    @property
    def k(self) -> int:
        return int(self.values.shape[-1])

    @property
    def bytes_per_entry(self) -> int:
        """Bytes one (value, id) entry costs on the wire: 2 + 4 = 6."""
        return self.values.element_size() + self.indices.element_size()

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(self, n).numel() * getattr(self, n).element_size())
                   for n in _DTYPES)

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int, *, lengths: torch.Tensor | None = None,
                    sample_ids: torch.Tensor | None = None,
                    losses: torch.Tensor | None = None) -> TopKLogits:
        """Keep the K largest logits of ``logits`` [N, L, V] (padding positions zeroed)."""
        n, length, vocab = logits.shape
        values, indices = torch.topk(logits.detach().float(), k, dim=-1)
        lengths = (torch.full((n,), length, dtype=torch.int32) if lengths is None
                   else lengths.to(torch.int32))
        pad = torch.arange(length)[None, :] >= lengths[:, None].long()
        values = values.clamp(PAD_VALUE, -PAD_VALUE).masked_fill(pad[..., None], 0.0)
        indices = indices.masked_fill(pad[..., None], 0)
        return cls(
            sample_ids=(torch.arange(n, dtype=torch.int64) if sample_ids is None
                        else sample_ids.to(torch.int64)),
            values=values.to(torch.float16),
            indices=indices.to(torch.int32),
            lengths=lengths,
            vocab_size=int(vocab),
            losses=(torch.zeros(n, dtype=torch.float32) if losses is None
                    else losses.detach().to(torch.float32)),
        )

    def validate(self, vocab_size: int, k: int, source: str) -> TopKLogits:
        """Check shapes, dtypes, K, ids and values; ``ValueError`` names source and field."""

        def fail(field: str, why: str) -> None:
            raise ValueError(f"{source}: top-K field {field!r} {why}")

        for name, dtype in _DTYPES.items():
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor):
                fail(name, f"should be a tensor, got {type(value).__name__}")
            if value.dtype != dtype:
                fail(name, f"should have dtype {dtype}, got {value.dtype}")
        if int(self.vocab_size) != int(vocab_size):
            fail("vocab_size", f"is {self.vocab_size}, expected {vocab_size}")
        if self.values.ndim != 3:
            fail("values", f"should be [N, L, K], got shape {tuple(self.values.shape)}")
        n, length, kk = self.values.shape
        if kk != k:
            fail("values", f"has K={kk}, expected K={k}")
        if tuple(self.indices.shape) != (n, length, kk):
            fail("indices", f"has shape {tuple(self.indices.shape)}, expected {(n, length, kk)}")
        for name in ("sample_ids", "lengths", "losses"):
            if tuple(getattr(self, name).shape) != (n,):
                fail(name, f"has shape {tuple(getattr(self, name).shape)}, expected ({n},)")
        if len(torch.unique(self.sample_ids)) != n:
            fail("sample_ids", "contains duplicates")
        if n and (int(self.lengths.min()) < 0 or int(self.lengths.max()) > length):
            fail("lengths", f"has values outside [0, {length}]")
        valid = torch.arange(length)[None, :] < self.lengths[:, None].long()  # [N, L]
        ids = self.indices[valid]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            bad = ids[(ids < 0) | (ids >= vocab_size)][0]
            fail("indices", f"holds id {int(bad)} outside [0, {vocab_size})")
        if not bool(torch.isfinite(self.values[valid].float()).all()):
            fail("values", "holds non-finite values (inf/nan)")
        if not bool(torch.isfinite(self.losses).all()):
            fail("losses", "holds non-finite values (inf/nan)")
        return self


def project_topk(topk: TopKLogits, vocab_map: np.ndarray,
                 alignment: Sequence[Alignment] | Alignment, *,
                 tgt_vocab_size: int | None = None,
                 merge: Literal["logsumexp", "max"] = "logsumexp",
                 batch_size: int | None = 32,
                 ) -> tuple[TopKLogits, torch.Tensor]:
    """Move source top-K into the target's token space (still K entries per position).

    ``alignment[n]`` belongs to sample ``n`` (source = ``topk``'s model).  Target position
    ``j`` takes the source logits at ``alignment[n].logit_map[j]``; each source id becomes
    ``vocab_map[id]`` (an id mapped to -1 is dropped).  Source ids that land on the same
    target id are merged by log-sum-exp (default): the merged logit's softmax weight is
    the sum of the merged ones, so the probability mass of the top-K distribution is kept
    (exact at temperature 1); ``"max"`` keeps the largest instead.  Empty slots hold
    :data:`PAD_VALUE`.  Returns the projection and a bool mask [N, L_tgt]: True where a
    source position was aligned (train the student on the KD loss only there).

    Samples are projected ``batch_size`` at a time into the preallocated output, so the
    working memory (about eight [batch, L, K] arrays) does not grow with N; ``None``
    projects all samples at once.
    """
    if merge not in ("logsumexp", "max"):
        raise ValueError(f"project_topk: merge must be 'logsumexp' or 'max', got {merge!r}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"project_topk: batch_size must be >= 1 or None, got {batch_size}")
    aligns = [alignment] if isinstance(alignment, Alignment) else list(alignment)
    n_samples, _, k = topk.values.shape
    if len(aligns) != n_samples:
        raise ValueError(f"project_topk: {len(aligns)} alignments for {n_samples} samples")
    vocab_map = np.asarray(vocab_map, dtype=np.int64)
    out_vocab = int(tgt_vocab_size if tgt_vocab_size is not None else vocab_map.max() + 1)
    t_len = max((a.n_tgt for a in aligns), default=0)
    values = torch.full((n_samples, t_len, k), PAD_VALUE, dtype=torch.float16)
    indices = torch.zeros(n_samples, t_len, k, dtype=torch.int32)
    mask = torch.zeros(n_samples, t_len, dtype=torch.bool)
    src_values, src_indices = topk.values.numpy(), topk.indices.numpy()
    lengths = topk.lengths.numpy().astype(np.int64)
    step = n_samples if batch_size is None else batch_size
    for lo in range(0, n_samples, max(step, 1)):
        hi = min(lo + step, n_samples)
        out_vals, out_ids, m = _project_rows(
            src_values[lo:hi], src_indices[lo:hi], lengths[lo:hi], aligns[lo:hi], vocab_map,
            merge)
        width = out_vals.shape[1]
        values[lo:hi, :width] = torch.from_numpy(out_vals)
        indices[lo:hi, :width] = torch.from_numpy(out_ids)
        mask[lo:hi, :width] = torch.from_numpy(m)
    projected = TopKLogits(
        sample_ids=topk.sample_ids.clone(), values=values, indices=indices,
        lengths=torch.tensor([a.n_tgt for a in aligns], dtype=torch.int32),
        vocab_size=out_vocab, losses=topk.losses.clone())
    return projected, mask


def _project_rows(src_values: np.ndarray, src_indices: np.ndarray, lengths: np.ndarray,
                  aligns: Sequence[Alignment], vocab_map: np.ndarray, merge: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`project_topk` on a few samples: fp16 values, int32 ids [n, L_tgt, K], mask."""
    n_samples, _, k = src_values.shape
    t_len = max((a.n_tgt for a in aligns), default=0)
    src_pos = np.full((n_samples, t_len), -1, dtype=np.int64)
    for i, a in enumerate(aligns):
        src_pos[i, : a.n_tgt] = a.logit_map
    valid = (src_pos >= 0) & (src_pos < lengths[:, None])
    rows = np.arange(n_samples)[:, None]
    pos = np.where(valid, src_pos, 0)
    values = src_values[rows, pos].astype(np.float32)  # [n, Lt, K]
    src_ids = src_indices[rows, pos].astype(np.int64)
    in_map = (src_ids >= 0) & (src_ids < len(vocab_map))
    ids = np.where(in_map, vocab_map[np.where(in_map, src_ids, 0)], -1)
    ids = np.where(valid[..., None], ids, -1)
    values = np.where(ids >= 0, values, -np.inf)

    # Merge duplicate ids within each (sample, position) row, vectorised over all rows.
    flat_ids = ids.reshape(-1, k)
    flat_vals = values.reshape(-1, k)
    order = np.argsort(flat_ids, axis=1, kind="stable")
    sid = np.take_along_axis(flat_ids, order, axis=1)
    sval = np.take_along_axis(flat_vals, order, axis=1)
    new = np.ones_like(sid, dtype=bool)
    new[:, 1:] = sid[:, 1:] != sid[:, :-1]
    starts = np.flatnonzero(new.ravel())
    reducer = np.logaddexp if merge == "logsumexp" else np.maximum
    with np.errstate(invalid="ignore"):
        merged = reducer.reduceat(sval.ravel(), starts) if len(starts) else np.zeros(0)
    seg_row = starts // k
    seg_id = sid.ravel()[starts]
    slot = np.cumsum(new, axis=1).ravel()[starts] - 1
    keep = seg_id >= 0
    out_ids = np.zeros_like(flat_ids)
    out_vals = np.full(flat_vals.shape, -np.inf, dtype=np.float32)
    out_ids[seg_row[keep], slot[keep]] = seg_id[keep]
    out_vals[seg_row[keep], slot[keep]] = merged[keep]
    # Largest first, padding last.
    order = np.argsort(-out_vals, axis=1, kind="stable")
    out_ids = np.take_along_axis(out_ids, order, axis=1)
    out_vals = np.take_along_axis(out_vals, order, axis=1)
    pad = ~np.isfinite(out_vals)
    out_vals = np.clip(np.where(pad, PAD_VALUE, out_vals), PAD_VALUE, -PAD_VALUE)
    out_ids = np.where(pad, 0, out_ids)
    mask = valid & (ids >= 0).any(axis=-1)
    return (out_vals.reshape(n_samples, t_len, k).astype(np.float16),
            out_ids.reshape(n_samples, t_len, k).astype(np.int32), mask)


def sparse_kd_loss(student_logits: torch.Tensor, target_ids: torch.Tensor,
                   target_logits: torch.Tensor, mask: torch.Tensor | None = None,
                   temperature: float = 1.0) -> torch.Tensor:
    """Cross-entropy of the student against softmax(top-K target logits / T).

    ``student_logits`` [B, L, V]; ``target_ids``/``target_logits`` [B, L, K]; ``mask``
    [B, L] (True = position counts).  The student's log-probabilities are gathered at the
    K ids (log-softmax = logit - logsumexp), so no dense [B, L, V] target is built.
    Mean over counted positions (0 if none); multiply by T**2 for Hinton scaling.
    """
    if temperature <= 0:
        raise ValueError(f"sparse_kd_loss: temperature must be > 0, got {temperature}")
    if target_ids.shape != target_logits.shape or target_ids.shape[:2] != student_logits.shape[:2]:
        raise ValueError(
            f"sparse_kd_loss: shapes disagree: student {tuple(student_logits.shape)}, "
            f"ids {tuple(target_ids.shape)}, logits {tuple(target_logits.shape)}")
    z = student_logits.float() / temperature
    log_q = z.gather(-1, target_ids.long()) - torch.logsumexp(z, dim=-1, keepdim=True)
    p = torch.softmax(target_logits.float() / temperature, dim=-1)
    ce = -(p * log_q).sum(-1)  # [B, L]
    if mask is None:
        return ce.mean()
    m = mask.to(ce.dtype)
    return (ce * m).sum() / m.sum().clamp_min(1.0)


def sparse_kl(student_logits: torch.Tensor, target_ids: torch.Tensor,
              target_logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
              ) -> torch.Tensor:
    """``KL(softmax(top-K target logits / T), merged || softmax(student / T))``.

    :func:`sparse_kd_loss` minus the entropy of the target distribution, where slots that
    name the same id count as one (their probabilities summed): the KL between the
    top-K target, as a distribution over the student's vocabulary, and the student.
    Mean over the positions ``mask`` counts (0 if none).
    """
    ce = sparse_kd_loss(student_logits, target_ids, target_logits, mask, temperature)
    p = torch.softmax(target_logits / temperature, dim=-1)
    k = target_ids.shape[-1]
    # Mass of the id each slot names: the merged top-K probability, through a K x K
    # comparison or a vocabulary-sized buffer, whichever is smaller.
    if k * k <= student_logits.shape[-1]:
        merged = ((target_ids[..., :, None] == target_ids[..., None, :]) * p[..., None, :]).sum(-1)
    else:
        dense = torch.zeros(student_logits.shape, dtype=p.dtype, device=p.device)
        merged = dense.scatter_add(-1, target_ids, p).gather(-1, target_ids)
    neg_entropy = (p * merged.clamp_min(torch.finfo(p.dtype).tiny).log()).sum(-1)
    m = mask.to(neg_entropy.dtype)
    return ce + (neg_entropy * m).sum() / m.sum().clamp_min(1.0)
