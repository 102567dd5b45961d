"""What a FedMKT participant knows of the public set D_p, and how it learns from others'.

Fan, Ma, Kang, Gu, Song, Fan, Chen, Yang, "FedMKT: Federated Mutual Knowledge Transfer for
Large and Small Language Models", COLING 2025 (arXiv:2406.02224).  The server and every
client do the same four things with knowledge, only the direction differs (steps 2-5 one
way, 6-7 the other): compute their own, send it, receive the other side's, learn from it.
:class:`Knowledge` is that interface; its two implementations are

* :class:`TopKKnowledge` (the paper): the knowledge set S, the top-K logits of every
  position of every public sample and each sample's loss (Appendix A), aligned to the
  learner's tokens on receipt (Appendix B), DualMinCE (Algorithm 2) and L = lambda L_FT +
  (1 - lambda) L_KD (Eqs. 5-10);
* :class:`ChoiceKnowledge` (``knowledge: choices``, an extension): each public sample's
  posterior over the task's choices, a teacher per sample by ``selection`` and KD over
  the choices (:mod:`fedkt.alignment.choices`; no alignment).

:func:`learn_from_knowledge` is the one learning step: the server's steps 4-5 and a
client's step 7 both run it.  The wire formats, token alignment and targets are
:mod:`fedkt.alignment`'s; DualMinCE and the distillation step are :mod:`.distill`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from fedkt.alignment import choices, receiving
from fedkt.alignment.knowledge import (
    PublicSet,
    knowledge_set,
    pack_topk,
    packed_entries,
    unpack_topk,
    vocab_size,
)
from fedkt.alignment.targets import Received, build_targets, to_receiver
from fedkt.alignment.topk import TENSOR_FIELDS, TopKLogits
from fedkt.config import ModelConfig, RunConfig
from fedkt.eval import reuse
from fedkt.federated.payload import Payload, PayloadError
from fedkt.infra.precision import autocast, frozen_cast
from fedkt.train.lm import LM

from .config import FedMKTConfig, Side
from .distill import DIAGNOSTICS, distill, dual_min_ce

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = ["ChoiceKnowledge", "KDStep", "Knowledge", "Sender", "TopKKnowledge",
           "knowledge_for", "learn_from_knowledge", "model_tokenizer", "other_losses"]


@dataclass(frozen=True)
class Sender:
    """Where a knowledge set came from: ``name`` (named in every error about it) and its
    ``model`` (whose tokens the set is in; None: the learner's own set)."""

    name: str
    model: ModelConfig | None = None


@dataclass(frozen=True)
class KDStep:
    """How a learner's distillation runs: passes over D_p, learning rate (None: the
    model's), seed, progress label, and the learner's own labelled records (rehearsal,
    ``receiving``: an extension of the choice path); ``client``: the learner is a client's
    SLM (``receiving.client_anchor_weight``), not the LLM."""

    epochs: float
    lr: float | None
    seed: int
    desc: str
    rehearse: Sequence[dict] = ()
    client: bool = False


class Knowledge(Protocol):
    """A model's knowledge of D_p: computed, packed for the wire, unpacked and validated
    on receipt, learned from.  A learner builds it with its own tokenizer and D_p."""

    field: str  # the payload field that carries a set
    finite: bool  # whether every value of a set must be finite on receipt

    def compute(self, lm: LM) -> Any:
        """``lm``'s own knowledge of D_p (a client's S_k, the server's S_0)."""
        ...

    def sent(self, own: Any, seed: int, sender: Side) -> Any:
        """What ``sender`` sends of ``own`` under ``method.teacher`` and
        ``method.teacher_from`` (the controls)."""
        ...

    def pack(self, knowledge: Any) -> dict[str, Any]:
        """The payload fields: ``{field: the wire tensors}`` and what travels beside them."""
        ...

    def unpack(self, message: Payload, sender: Sender, own: Any = None) -> Any:
        """The set in ``message`` validated (a ``PayloadError`` names ``sender``) and
        joined to the learner's D_p in its tokens, for a learner whose own knowledge is
        ``own``; without ``own``, the learner's own set as it kept it."""
        ...

    def learn(self, lm: LM, own: Any, received: list[Any], step: KDStep) -> dict[str, float]:
        """Per sample a teacher among ``received`` (against ``own``), the targets and the
        distillation of ``lm``: ``loss`` (the objective), ``kd_loss``, ``kd_taken`` (the
        share of samples that took a teacher) and what else the step reports."""
        ...

    def traffic(self, messages: list[Payload]) -> dict[str, float]:
        """``train/*`` sizes of the sets in ``messages`` (nothing where none are kept)."""
        ...


def knowledge_for(cfg: RunConfig, tokenizer: Any, records: list[dict], *,
                  data: FederatedData) -> Knowledge:
    """The learner's knowledge (``method.knowledge``), with its ``tokenizer`` and D_p
    ``records`` (of ``data``, the run's data)."""
    if cfg.method.knowledge == "choices":
        return ChoiceKnowledge(cfg, records, data=data)
    return TopKKnowledge(cfg, tokenizer, records, data=data)


def learn_from_knowledge(knowledge: Knowledge, lm: LM, own: Any, received: list[Any],
                         step: KDStep, *, objective: str, taken: str) -> dict[str, float]:
    """The learning step of Algorithm 1, on either side: the server's steps 4-5 (l. 13-18)
    and a client's step 7 (l. 36-41).  A teacher per public sample against the learner's
    own knowledge (DualMinCE, Algorithm 2), the targets, and ``lm`` trained on D_p with
    L = lambda L_FT + (1 - lambda) L_KD (Eq. 9 on the server, Eq. 10 on a client).

    Returns the step's ``train/*`` stats, the objective L under ``objective`` and the
    share of samples that took a teacher under ``taken``."""
    stats = knowledge.learn(lm, own, received, step)
    names = {"loss": objective, "kd_taken": taken}
    return {f"train/{names.get(k, k)}": v for k, v in stats.items()}


# --------------------------------------------------------------------------- top-K logits


_TOKENIZERS: dict[str, Any] = {}


def model_tokenizer(mcfg: ModelConfig) -> Any:
    """A model's tokenizer, loaded once per process."""
    from fedkt.models import load_tokenizer

    key = mcfg.model_dump_json()
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(mcfg)
    return _TOKENIZERS[key]


def other_losses(others: list[Received], own: TopKLogits) -> Tensor:
    """[M, N]: each received set's per-sample loss (``inf`` where it sent nothing)."""
    n = own.values.shape[0]
    return torch.stack([o.losses for o in others]) if others else torch.zeros(0, n)


class TopKKnowledge:
    """The paper's knowledge set S: the top-K logits of every position of the prompt and
    its gold answer, and each sample's loss (:class:`~fedkt.alignment.TopKLogits`, packed
    at 6 bytes an entry); a received set is aligned to the learner's tokens on receipt."""

    field = "topk"
    finite = False  # a loss is inf where a sender left a sample out

    def __init__(self, cfg: RunConfig, tokenizer: Any, records: list[dict], *,
                 data: FederatedData) -> None:
        self.cfg, self.method = cfg, cfg.method
        self.tokenizer, self.records, self.data = tokenizer, records, data
        # D_p in the learner's tokens
        self.public = PublicSet.build(cfg, tokenizer, records, data=data)
        self._senders: dict[str, tuple[Any, PublicSet]] = {}

    def compute(self, lm: LM) -> TopKLogits:
        """S on D_p along the gold answers (reused when the model, D_p and settings were
        seen before: ``eval.reuse``)."""
        cfg, m = self.cfg, self.method

        def compute() -> dict[str, Tensor]:  # inside the store's digest of the fp32 weights
            with frozen_cast(cfg, lm.model):
                s = knowledge_set(lm, self.public, m.top_k, batch_size=cfg.eval.batch_size,
                                  reduction=m.selection_loss)
            return {**{f: getattr(s, f) for f in TENSOR_FIELDS},
                    "vocab_size": torch.tensor([s.vocab_size])}

        with autocast(cfg, lm.model):
            got = reuse.tensors(cfg.eval.reuse, "topk", lm.model, lm.tokenizer,
                                {"public": self.public.seqs, "pad_id": self.public.pad_id,
                                 "k": m.top_k, "batch_size": cfg.eval.batch_size,
                                 "reduction": m.selection_loss}, compute)
        return TopKLogits(vocab_size=int(got["vocab_size"][0]),
                          **{f: got[f] for f in TENSOR_FIELDS})

    def sent(self, own: TopKLogits, seed: int, sender: Side) -> TopKLogits:
        """As it is: the sender-side controls need ``knowledge: choices`` (the config
        refuses them here)."""
        return own

    def pack(self, knowledge: TopKLogits) -> dict[str, Any]:
        return {self.field: pack_topk(knowledge), "vocab_size": knowledge.vocab_size,
                "k": self.method.top_k}

    def unpack(self, message: Payload, sender: Sender, own: Any = None
               ) -> TopKLogits | Received:
        """Validated (:func:`~fedkt.alignment.knowledge.unpack_topk`: shapes, K, ids inside
        the sender's vocabulary) and, when received, joined to D_p and readied for
        projection into the learner's tokens (:func:`~fedkt.alignment.targets.to_receiver`:
        sample ids, lengths; steps 3 and 7, Alg. 1 l. 12 and 35)."""
        k = self.method.top_k
        packed = message.state(self.field, source=sender.name, finite=False)
        if own is None:  # the learner's own set, in its own tokens
            return unpack_topk(packed, vocab_size(self.tokenizer), k, sender.name)
        if message.get("k") != k:
            raise PayloadError(f"{sender.name}: field 'k' is {message.get('k')!r}, "
                               f"expected {k}")
        tok, pub = self._sender_side(sender.model)
        topk = unpack_topk(packed, vocab_size(tok), k, sender.name)
        return to_receiver(topk, tok, pub, self.tokenizer, self.public, sender.name)

    def _sender_side(self, mcfg: ModelConfig | None) -> tuple[Any, PublicSet]:
        """A sender model's tokenizer and its tokenization of D_p (cached per model)."""
        if mcfg is None:
            raise ValueError("TopKKnowledge.unpack: a received set needs its sender's model")
        key = mcfg.model_dump_json()
        if key not in self._senders:
            tok = model_tokenizer(mcfg)
            self._senders[key] = (tok, PublicSet.build(self.cfg, tok, self.records,
                                                                 data=self.data))
        return self._senders[key]

    def learn(self, lm: LM, own: TopKLogits, received: list[Received], step: KDStep
              ) -> dict[str, float]:
        """DualMinCE on the per-sample losses (Alg. 2 l. 6-11), top-K targets with a
        one-hot target where unaligned (Appendix B 3(d)), L_KD against them (Eqs. 7-10)."""
        m = self.method
        selection = dual_min_ce(own.losses, other_losses(received, own))
        targets = build_targets(own, received, self.public, selection,
                                fallback_to_own=m.fallback_to_own, unaligned=m.unaligned)
        stats = distill(self.cfg, lm, self.records, targets, data=self.data,
                        epochs=step.epochs, lr=step.lr, seed=step.seed, desc=step.desc)
        return {"loss": stats["loss"], "kd_loss": stats["kd_loss"],
                "kd_taken": targets.fraction_from_others(), "kd_one_hot": stats["kd_one_hot"],
                **{k: stats[k] for k in DIAGNOSTICS}}

    def traffic(self, messages: list[Payload]) -> dict[str, float]:
        """Top-K entries sent, and the bytes of their values and ids per entry."""
        entries = nbytes = 0
        for message in messages:
            e, b = packed_entries(message[self.field])
            entries, nbytes = entries + e, nbytes + b
        out: dict[str, float] = {"train/topk_entries": entries}
        if entries:
            out["train/topk_bytes_per_entry"] = nbytes / entries
        return out


# --------------------------------------------------------------------------- choices


class ChoiceKnowledge:
    """``knowledge: choices`` (an extension): each public sample's posterior over the
    task's choices, [N, C] (:mod:`fedkt.alignment.choices`): no gold answer read, no
    alignment (every model scores the same choices in its own tokens)."""

    field = choices.FIELD
    finite = True

    def __init__(self, cfg: RunConfig, records: list[dict], *, data: FederatedData) -> None:
        self.cfg, self.method, self.records, self.data = cfg, cfg.method, records, data

    def compute(self, lm: LM) -> Tensor:
        m: FedMKTConfig = self.method
        return choices.choice_knowledge(self.cfg, lm, self.records, data=self.data,
                                       temperature=m.temperature)

    def sent(self, own: Tensor, seed: int, sender: Side) -> Tensor:
        """Permuted across D_p (``shuffled``), every row the mean (``marginal``), or as it
        is (:func:`fedkt.alignment.choices.sent`): as it is too from a sender that
        ``teacher_from`` leaves out."""
        m: FedMKTConfig = self.method
        return choices.sent(own, m.teacher if m.controls(sender) else "real", seed)

    def pack(self, knowledge: Tensor) -> dict[str, Any]:
        return {self.field: choices.pack(knowledge)}

    def unpack(self, message: Payload, sender: Sender, own: Any = None) -> Tensor:
        """Validated (:func:`fedkt.alignment.choices.unpack`): [N, C] like ``own``,
        probabilities, rows summing to 1."""
        packed = message.get(self.field)
        n, c = own.shape if own is not None else (len(self.records),
                                                  packed["posteriors"].shape[-1])
        return choices.unpack(packed, n, c, sender.name)

    def learn(self, lm: LM, own: Tensor, received: list[Tensor], step: KDStep
              ) -> dict[str, float]:
        """Pick a teacher per sample (``selection``: DualMinCE on the gold choice, the
        lowest entropy, or always), then L = lambda CE + (1 - lambda) KL(teacher ||
        learner) over the choices.  ``teacher: self`` (a control) distils towards the
        learner's own posteriors instead of the others'.  The receiving options
        (``receiving``) narrow the samples taken, add the anchoring term to ``own`` and
        T**2, and rehearse on ``step.rehearse``.  Stats without NaN (a loss over no step:
        nothing was distilled)."""
        m: FedMKTConfig = self.method
        rule = {"dual_min_ce": "min_ce"}.get(m.selection, m.selection)
        others = received
        if m.teacher == "self":
            others, rule = [own], "always"
        gold = (torch.tensor([int(r["label"]) for r in self.records]) if rule == "min_ce"
                else None)
        targets, chosen = choices.select(own, others, rule, gold)
        taken = receiving.taken(m.receiving, targets, own, chosen)
        stats = choices.distill_choices(
            self.cfg, lm, self.records, targets, taken, data=self.data, epochs=step.epochs,
            lr=step.lr, seed=step.seed, kd_weight=1.0 - m.ft_weight, ft_weight=m.ft_weight,
            temperature=m.temperature, desc=step.desc,
            **receiving.distill_options(m.receiving, m.temperature, own, step.rehearse,
                                        client=step.client))
        out = {"loss": stats["loss"], "kd_loss": stats["kd_loss"], "kd_taken": stats["kd_taken"],
               "kd_steps": stats["steps"],
               **{k: stats[k] for k in ("kd_steps", "rehearsal_steps", "rehearsal_loss",
                                        "anchor_loss") if k in stats}}
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def traffic(self, messages: list[Payload]) -> dict[str, float]:
        return {}
