"""One cross-tokenizer bridge: one model's token space mapped into another's.

A :class:`TokenBridge` from a *source* tokenizer (the teacher's) to a *target* one (the
learner's) links

* ids, through the MinED vocabulary mapping (:func:`~fedkt.alignment.vocab_mapping`,
  special tokens by role; :attr:`TokenBridge.vocab_map`), and
* positions, through the alignment of the two tokenizations of the same text
  (:func:`~fedkt.alignment.align_sequences`): for a whole public set at once, cached in
  memory and on disk (:meth:`TokenBridge.align_corpus`, FedMKT's knowledge sets), or
  for the rows of a batch (:meth:`TokenBridge.align_batch`, FedCoLLM's live logits).

:meth:`TokenBridge.kl` compares the source model's top-K distribution, mapped into the
target vocabulary, with the target model's full distribution (FedCoLLM across
tokenizers); FedMKT projects received top-K logits with
:func:`~fedkt.alignment.project_topk` through the same maps
(:class:`~fedkt.alignment.targets.Received`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedkt.alignment.introspect import vocab_hash
from fedkt.alignment.sequence import Alignment, align_sequences
from fedkt.alignment.topk import PAD_VALUE, sparse_kl
from fedkt.alignment.vocab import vocab_mapping
from fedkt.infra.cache import cache_dir
from fedkt.infra.progress import counted

if TYPE_CHECKING:
    from fedkt.alignment.knowledge import PublicSet

__all__ = ["TokenBridge"]

_ALIGN_MEMORY: OrderedDict[str, list[Alignment]] = OrderedDict()
_MAP_MEMORY: dict[tuple[str, str], np.ndarray] = {}


class TokenBridge:
    """Ids and positions of ``src_tokenizer``'s model in ``tgt_tokenizer``'s model."""

    def __init__(self, src_tokenizer: Any, tgt_tokenizer: Any) -> None:
        self.src_tok, self.tgt_tok = src_tokenizer, tgt_tokenizer
        self._map_tensor: Tensor | None = None

    @property
    def same(self) -> bool:
        """Whether both tokenizers have the same vocabulary (ids map to themselves)."""
        return vocab_hash(self.src_tok) == vocab_hash(self.tgt_tok)

    @property
    def vocab_map(self) -> np.ndarray:
        """Source id -> target id (MinED; -1: a special token without a counterpart),
        computed once per vocabulary pair in this process (and cached on disk)."""
        key = (vocab_hash(self.src_tok), vocab_hash(self.tgt_tok))
        if key not in _MAP_MEMORY:
            _MAP_MEMORY[key] = vocab_mapping(self.src_tok, self.tgt_tok)
        return _MAP_MEMORY[key]

    # ------------------------------------------------------------------ positions

    def align_corpus(self, src: PublicSet, tgt: PublicSet) -> list[Alignment]:
        """The alignment of every public sample's two tokenizations.

        Computed once per (public set, tokenizer pair): kept in this process and on disk
        under ``cache_dir()/alignments``, keyed by both vocabularies and the token ids.
        """
        from fedkt.alignment.sequence import ALIGNMENT_VERSION, cached_alignments

        key = hashlib.sha256(
            f"fedmkt:{ALIGNMENT_VERSION}:{vocab_hash(self.src_tok)}:{vocab_hash(self.tgt_tok)}:"
            f"{src.digest()}:{tgt.digest()}".encode()).hexdigest()[:32]
        if key in _ALIGN_MEMORY:
            _ALIGN_MEMORY.move_to_end(key)
            return _ALIGN_MEMORY[key]
        aligns = cached_alignments(
            cache_dir("alignments") / f"fedmkt-{key}.npz",
            lambda: [align_sequences(a["input_ids"], b["input_ids"], self.src_tok, self.tgt_tok)
                     for a, b in counted(zip(src.seqs, tgt.seqs, strict=True), len(src))],
            len(src))
        _ALIGN_MEMORY[key] = aligns
        while len(_ALIGN_MEMORY) > 16:
            _ALIGN_MEMORY.popitem(last=False)
        return aligns

    def align_batch(self, src_batch: dict[str, Tensor], tgt_batch: dict[str, Tensor]
                    ) -> tuple[Tensor, Tensor]:
        """``tgt_from_src`` [B, Lt] and ``src_from_tgt`` [B, Ls]: for each logit position of
        one side, the other side's logit position that predicts the same text (-1: none)."""
        s_ids, t_ids = src_batch["input_ids"].cpu(), tgt_batch["input_ids"].cpu()
        s_len = src_batch["attention_mask"].sum(1).tolist()
        t_len = tgt_batch["attention_mask"].sum(1).tolist()
        tgt_from_src = torch.full(t_ids.shape, -1, dtype=torch.long)
        src_from_tgt = torch.full(s_ids.shape, -1, dtype=torch.long)
        for b, (ns, nt) in enumerate(zip(s_len, t_len, strict=True)):
            a = align_sequences(s_ids[b, :ns], t_ids[b, :nt], self.src_tok, self.tgt_tok)
            tgt_from_src[b, :nt] = torch.from_numpy(a.logit_map.astype("int64"))
            src_from_tgt[b, :ns] = torch.from_numpy(a.logit_map_reverse.astype("int64"))
        return tgt_from_src, src_from_tgt

    # ------------------------------------------------------------------ distributions

    def kl(self, src_logits: Tensor, tgt_logits: Tensor, pos: Tensor, tgt_mask: Tensor,
           temperature: float, top_k: int) -> Tensor:
        """``KL(top-K of the source, mapped || the target)``, averaged over the target's
        positions in ``tgt_mask``; ``pos`` [B, Lt]: the source position of each target
        position (:meth:`align_batch`).  Detach ``src_logits`` for a fixed target.

        The source's top-K logits at the aligned position (kept in the graph) have their
        ids mapped into the target vocabulary (ids that land on the same target token are
        merged, their probabilities summed); the result is their cross-entropy with the
        target's full softmax (:func:`~fedkt.alignment.sparse_kl`) minus their entropy.
        """
        if self._map_tensor is None:
            self._map_tensor = torch.from_numpy(self.vocab_map)
        vocab_map = self._map_tensor
        if int(vocab_map.max()) >= tgt_logits.shape[-1]:
            raise ValueError(f"the vocabulary mapping reaches id {int(vocab_map.max())} but "
                             f"the model has {tgt_logits.shape[-1]} logits")
        src_logits = src_logits[..., : len(vocab_map)].float()
        k = min(top_k, src_logits.shape[-1])
        values, ids = torch.topk(src_logits, k, dim=-1)  # [B, Ls, K], values keep the graph
        pos = pos.to(src_logits.device)
        valid = tgt_mask & (pos >= 0)
        index = pos.clamp_min(0)[..., None].expand(-1, -1, k)
        tgt_values = values.gather(1, index)  # [B, Lt, K]
        tgt_ids = vocab_map.to(src_logits.device)[ids.gather(1, index)]
        dropped = tgt_ids < 0  # a special token without a counterpart: no weight
        if bool(dropped.any()):
            tgt_values = tgt_values.masked_fill(dropped, PAD_VALUE)
            tgt_ids = tgt_ids.clamp_min(0)
        return sparse_kl(tgt_logits, tgt_ids, tgt_values, valid, temperature)
