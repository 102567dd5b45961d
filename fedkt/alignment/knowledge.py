"""Knowledge sets: what FedMKT's models know of a public set, and how it travels.

Fan et al., FedMKT (COLING 2025), Appendix A: a model's knowledge set S on the public set
D_p holds, for every position of every sample, the top-K logits (:class:`TopKLogits`, 6
bytes an entry: fp16 value, int32 id) and each sample's loss (for DualMinCE).  Samples
are named by their index in D_p, never by their text:

* :class:`PublicSet`: D_p tokenized for one model, in public-set order;
* :func:`knowledge_set`: S of a model on D_p;
* :func:`pack_topk` / :func:`unpack_topk`: the wire format (only real positions travel)
  and its validation on receipt, naming the sender and the field at fault.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedkt.alignment.topk import PAD_VALUE, TopKLogits
from fedkt.config import RunConfig
from fedkt.data.lm_batches import IGNORE_INDEX, make_batches, pad_token_id, tokenize_pairs
from fedkt.federated.payload import PayloadError, check_tensor
from fedkt.infra import progress
from fedkt.infra.timing import timed
from fedkt.train.lm import LM, lm_pairs

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = ["PublicSet", "knowledge_set", "pack_topk", "packed_entries", "unpack_topk",
           "vocab_size"]


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
    def build(cls, cfg: RunConfig, tokenizer: Any, records: list[dict], *,
              data: FederatedData) -> PublicSet:
        """``records`` (of ``data``, the run's data) as ``tokenizer``'s training pairs."""
        pairs = lm_pairs(cfg, records, tokenizer, data=data)
        seqs = tokenize_pairs(tokenizer, pairs, cfg.data.max_length)
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


LOSS_CHUNK_ELEMENTS = 1 << 26  # logits a per-sample loss takes at once (256 MB in fp32)


def _sample_losses(logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
    """Per-sample CE of next-token predictions on the target tokens (mean or sum).

    A few rows at a time (:data:`LOSS_CHUNK_ELEMENTS`): the fp32 copy and the log-softmax
    of a whole batch's logits are three times the logits: 12-15 GB for 64 rows of 84
    tokens on a 152k-token vocabulary.  Each row's loss is the same to the bit either way."""
    per_row = max(1, logits[0].numel())
    step = max(1, LOSS_CHUNK_ELEMENTS // per_row)
    return torch.cat([_rows_losses(logits[i:i + step], labels[i:i + step], reduction)
                      for i in range(0, logits.shape[0], step)])


def _rows_losses(logits: Tensor, labels: Tensor, reduction: str) -> Tensor:
    tgt = labels[:, 1:]
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), tgt.clamp_min(0), reduction="none")
    keep = (tgt != IGNORE_INDEX).to(ce.dtype)
    total = (ce * keep).sum(1)
    return total if reduction == "sum" else total / keep.sum(1).clamp_min(1.0)


@torch.no_grad()
@timed("knowledge")
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
    shown = progress.bar(n, "knowledge")
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
        shown.update(b)
    shown.close()
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

    Raises :class:`~fedkt.federated.payload.PayloadError` naming ``source`` and the field.
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
