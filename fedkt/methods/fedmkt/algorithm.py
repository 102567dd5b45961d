"""FedMKT: federated mutual knowledge transfer between a server LLM and client SLMs.

Fan, Ma, Kang, Gu, Song, Fan, Chen, Yang, "FedMKT: Federated Mutual Knowledge Transfer
for Large and Small Language Models", COLING 2025 (arXiv:2406.02224), Algorithms 1-2,
Appendix A (the steps of a round) and B (token alignment).  Steps are cited as
"step N (Alg. 1 l. L)", by the numbered lines of the paper's Algorithm 1 (and Algorithm 2,
DualMinCE).

The server holds an LLM with a LoRA adapter; client k holds its own SLM (any
architecture and tokenizer) with a LoRA adapter that never leaves it.  Both sides
know the public set D_p (``data.split``: the ``public`` part).  One round:

1. (Alg. 1 l. 26-28) client k trains its LoRA on its private data with the task loss
   (Eq. 4);
2. (Alg. 1 l. 29-31) it computes its knowledge set S_k on D_p: per-sample loss and the top-K logits of
   every position (:class:`~fedkt.alignment.TopKLogits`, 6 bytes an entry), and uploads
   it (no text: samples are named by their index in D_p);
3. (Alg. 1 l. 12) the server maps each S_k into the LLM's token space: positions through the sequence
   alignment of the two tokenizations of each public sample (computed once per
   tokenizer pair, cached in memory and on disk), ids through the MinED vocabulary
   mapping (:mod:`fedkt.alignment`);
4. (Alg. 1 l. 13; Alg. 2 l. 6-11) DualMinCE (:func:`dual_min_ce`): per public sample the client logits
   with the smallest loss are used only if that loss is below the LLM's own loss on
   the sample; otherwise the sample gets no distillation (it is not in S~), or, with
   ``fallback_to_own: true`` (FATE-LLM's "greater" strategy), the LLM's own top-K;
   a position without an aligned teacher position gets a one-hot target on the
   ground-truth token (Appendix B 3(d); ``unaligned``);
5. (Alg. 1 l. 15-18) the server trains its LoRA on D_p with L2 = lambda L_FT + (1 - lambda) L_KD (Eqs. 5, 7, 9;
   lambda is ``method.ft_weight``);
6. (Alg. 1 l. 19-20) the server computes S_0 on D_p with its new adapter and sends it to
   every client;
7. (Alg. 1 l. 35-41) client k maps S_0 into its own token space, applies DualMinCE against its own
   loss (its S_k of step 2) and trains on L3 = lambda L_FT + (1 - lambda) L_KD (Eqs. 6, 8, 10).

The server row's ``train/loss`` is the clients' mean task loss of step 1 (the
convention of every method, docs/architecture.md); the server's own objective L2 of
step 5 is ``train/server_loss``.

``L_KD`` is the cross-entropy of the student against the softmax of the selected top-K
logits (:func:`~fedkt.alignment.sparse_kd_loss`, no dense [B, L, V] target).

Settings: heterogeneous (every client its own model), homogeneous (one client model;
``post_fedavg`` averages the client adapters after step 7 as FATE-LLM's option does),
one-to-one (one client).  ``llm2slm`` is the baseline where the LLM stays frozen and
only teaches: steps 2-5 are skipped and S_0 travels once (clients keep it on disk).

Controls (extensions, ``teacher``): ``shuffled`` and ``marginal`` change what a sender
sends (its knowledge permuted across D_p, or every sample its mean posterior), ``self``
what a learner takes (its own knowledge); ``none`` skips steps 2-7 but the local
training of step 1, the LLM's own-data epochs and the evaluation: no knowledge is
computed or sent and nothing is distilled.  The receiving-side options
(``receiving``: rehearsal, anchoring, T**2, selective taking) are
:mod:`fedkt.alignment.receiving`'s.

Messages per round and client: one ``train_and_share`` call (steps 1-2) and one
``distill`` call (step 7, and the client's evaluation).  S_0 is the held object ``s0``
(:mod:`fedkt.methods.holdings`, version = the round whose step 6 made it): a client is
sent it only when it does not hold that version (LLM2SLM: once).

Knowledge sets, their wire format and the targets built from them are in
:mod:`fedkt.alignment` (``knowledge``, ``targets``, one cross-tokenizer ``bridge``);
DualMinCE and the distillation step are in :mod:`.distill`.
"""

from __future__ import annotations

import math
from typing import Any

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
from fedkt.data.formatting import check_shared_template
from fedkt.errors import ConfigError
from fedkt.eval import reuse
from fedkt.federated.payload import Payload, PayloadError
from fedkt.infra.precision import autocast
from fedkt.methods.base import ClientContext, Clients, Server, mean_number
from fedkt.train.lm import LM, client_lm, client_test_metrics, evaluate_lm, server_lm, train_lm

from .config import FedMKTConfig
from .distill import DIAGNOSTICS, distill, dual_min_ce

S0 = "s0"  # the held object: the server's knowledge set S_0, by the round that made it


def other_losses(others: list[Received], own: TopKLogits) -> Tensor:
    """[M, N]: each received set's per-sample loss (``inf`` where it sent nothing)."""
    n = own.values.shape[0]
    return torch.stack([o.losses for o in others]) if others else torch.zeros(0, n)


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
        if m.knowledge == "choices":
            choices.require_choice_task(self.data().task)
        self.llm = server_lm(cfg)
        if m.knowledge == "logits":  # aligned token by token: one text for every model
            check_shared_template(cfg.data.chat_template, {"server": self.llm.tokenizer, **{
                f"client {cid}": _tokenizer(cfg.clients.model_for(cid))
                for cid in cfg.client_ids()}}, cfg.method.name)
        self.adapter = self.llm.trainable()
        # D_p tokenized with its gold answers (the top-K logits are taken along them)
        self.public = (PublicSet.build(cfg, self.llm.tokenizer, records)
                       if m.knowledge == "logits" else None)
        self.global_adapter: dict[str, Tensor] | None = None
        self.s0: TopKLogits | Tensor | None = None  # S_0 of the current adapter
        self.s0_version = 0  # round whose step 6 made S_0 (0: the initial adapter)
        self._client_sides: dict[str, tuple[Any, PublicSet]] = {}

    def own_knowledge(self) -> TopKLogits | Tensor:
        """S_0 of the LLM's current adapter (recomputed after training or a resume): its
        top-K logits, or with ``knowledge: choices`` its [N, C] posteriors."""
        if self.s0 is None:
            self.s0 = own_knowledge(self.cfg, self.llm.reset(self.adapter), self.public)
        return self.s0

    def client_side(self, cid: int) -> tuple[Any, PublicSet]:
        """Client ``cid``'s tokenizer and its tokenization of D_p (for step 3)."""
        mcfg: ModelConfig = self.cfg.clients.model_for(cid)
        key = mcfg.model_dump_json()
        if key not in self._client_sides:
            tok = _tokenizer(mcfg)
            self._client_sides[key] = (tok, PublicSet.build(self.cfg, tok, self.data().public))
        return self._client_sides[key]

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        """One round of Algorithm 1 (server side); the extensions are in the helpers it
        calls (:meth:`learn_own_data`, :meth:`client_update2`, :meth:`s0_message`)."""
        m: FedMKTConfig = self.method
        # steps 1-2 (Alg. 1 l. 11, 24-31): clients train on private data (Eq. 4), share S_k
        exchange = m.teacher != "none"  # teacher: none (a control): no step 2-7 but step 1
        msg = Payload(share=m.llm_training and exchange)
        replies = clients.call("train_and_share", {cid: msg for cid in clients.ids})
        metrics = _mean_reported(replies, "train_loss", "train/loss")  # the clients' mean
        metrics.update(self.learn_own_data(rnd))  # an extension: needs the server's own data
        # steps 3-5 (Alg. 1 l. 12-18): align each S_k, DualMinCE, train the LLM on L2
        metrics.update(self.learn_from_clients(rnd, replies, clients))
        # step 6 (Alg. 1 l. 19): S_0 of the (new) adapter goes to every client lacking it
        msgs = {cid: Payload() for cid in replies}  # teacher: none: no S_0, no KD
        if exchange:
            fields, s0 = self.s0_message()
            msgs = {cid: self.holdings.offer(Payload(fields), cid, S0, self.s0_version, s0)
                    for cid in replies}
        # step 7 (Alg. 1 l. 20, 33-41): clients align S_0, DualMinCE against their own
        # loss, train on L3
        got = self.client_update2(msgs, clients)
        if exchange:
            self.holdings.confirm(msgs, got, S0, self.s0_version)
            metrics.update(_mean_reported(got, "kd_loss", "train/client_kd_loss"))
        return metrics

    def client_update2(self, msgs: dict[int, Payload], clients: Clients) -> dict[int, Payload]:
        """Step 7 (Alg. 1 l. 20, ClientUpdate2): the clients' ``distill`` call; the replies
        that arrived.  ``post_fedavg`` (an extension, FATE-LLM's option for homogeneous
        SLMs; the paper does not average) FedAvgs their adapters after it, which every
        client then adopts and evaluates."""
        if not (self.method.post_fedavg and msgs):
            return clients.call("distill", msgs)
        got, self.global_adapter = clients.aggregate(
            "distill", msgs, field="adapter", like=client_lm(self.cfg, 0).initial)
        clients.call("adopt", {cid: Payload(adapter=self.global_adapter) for cid in got})
        return got

    def s0_message(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """Step 6's request fields and S_0 packed for the wire.  ``teacher: shuffled`` (a
        control) permutes S_0's samples, by a permutation fixed for each S_0 version;
        ``marginal`` gives every sample S_0's mean posterior."""
        m: FedMKTConfig = self.method
        own = self.own_knowledge()
        if m.knowledge == "logits":
            return {"vocab_size": own.vocab_size, "k": m.top_k}, pack_topk(own)
        return {}, choices.pack(choices.sent(own, m.teacher,
                                             self.seed(self.s0_version, "shuffle")))

    def learn_own_data(self, rnd: int) -> dict[str, float]:
        """An extension (``data.split.server_size``): the LLM trains on the server's own
        labelled data with the task loss, as a client does on its private data (Eq. 4).
        Nothing without such data."""
        if not self.data().server:
            return {}
        stats = train_lm(self.cfg, self.llm.reset(self.adapter), self.data().server,
                         seed=self.seed(rnd, "own"), lr=self.cfg.server.lr, desc="server train")
        self.adapter = self.llm.trainable()
        self.s0, self.s0_version = None, rnd  # S_0 of the new adapter: step 6 makes it
        return {"train/server_own_loss": stats["loss"]}

    def learn_from_clients(self, rnd: int, replies: dict[int, Payload], clients: Clients
                           ) -> dict[str, float]:
        """Steps 3-5 (Alg. 1 l. 12-18): validate and align each S_k, DualMinCE, train the
        LLM on L2; its objective is the row's ``server_loss``.  LLM2SLM (``llm_training:
        false``, the paper's baseline) skips them: the LLM only teaches; so does ``teacher:
        none`` (the no-exchange control: no S_k came).

        A client whose S_k fails validation is excluded from the round (with the reason).
        """
        m: FedMKTConfig = self.method
        if not m.llm_training:
            return {}
        if m.teacher == "none":
            return {"train/kd_steps": 0}
        if m.knowledge == "choices":
            return self.learn_from_clients_choices(rnd, replies, clients)
        own = self.own_knowledge()

        def receive(cid: int, reply: Payload) -> tuple[Received, dict]:
            source = f"client {cid}"
            tok, pub = self.client_side(cid)
            packed = reply.state("topk", source=source, finite=False)
            if reply.get("k") != m.top_k:
                raise PayloadError(f"{source}: field 'k' is {reply.get('k')!r}, "
                                   f"expected {m.top_k}")
            topk = unpack_topk(packed, vocab_size(tok), m.top_k, source)  # on receipt
            # step 3 (Alg. 1 l. 12): SLM -> LLM tokens
            return to_receiver(topk, tok, pub, self.llm.tokenizer, self.public, source), packed

        checked = clients.validate(dict(sorted(replies.items())), receive, "train_and_share")
        rejected = len(replies) - len(checked)
        others: list[Received] = [aligned for aligned, _ in checked.values()]
        entries = tensor_bytes = 0
        for _, packed in checked.values():
            e, b = packed_entries(packed)
            entries, tensor_bytes = entries + e, tensor_bytes + b
        # step 4 (Alg. 1 l. 13; Alg. 2 l. 6-11): DualMinCE; step 5 (Alg. 1 l. 15-18):
        # L2 = lambda L_FT + (1 - lambda) L_KD (Eqs. 5, 7, 9)
        selection = dual_min_ce(own.losses, other_losses(others, own))
        targets = build_targets(own, others, self.public, selection,
                                fallback_to_own=m.fallback_to_own, unaligned=m.unaligned)
        stats = distill(self.cfg, self.llm.reset(self.adapter), self.data().public, targets,
                        epochs=m.server_kd_epochs, lr=self.cfg.server.lr, seed=self.seed(rnd, "kd"),
                        desc="server kd")
        self.adapter = self.llm.trainable()
        self.s0, self.s0_version = None, rnd  # S_0 of the new adapter: step 6 makes it
        out = {"train/server_loss": stats["loss"], "train/kd_loss": stats["kd_loss"],
               "train/kd_from_clients": targets.fraction_from_others(),
               "train/kd_one_hot": stats["kd_one_hot"],
               **{f"train/{k}": stats[k] for k in DIAGNOSTICS},
               "train/topk_entries": entries, "train/rejected_clients": rejected}
        if entries:
            out["train/topk_bytes_per_entry"] = tensor_bytes / entries
        return out

    def learn_from_clients_choices(self, rnd: int, replies: dict[int, Payload],
                                   clients: Clients) -> dict[str, float]:
        """Steps 3-5 with ``knowledge: choices`` (an extension): each client's posteriors
        over the task's choices, validated; per sample a teacher by ``selection``; the LLM
        trains on lambda CE + (1 - lambda) KL over the choices (no alignment needed)."""
        m: FedMKTConfig = self.method
        own = self.own_knowledge()
        n, c = own.shape
        checked = clients.validate(
            dict(sorted(replies.items())),
            lambda cid, reply: choices.unpack(reply.get(choices.FIELD), n, c, f"client {cid}"),
            "train_and_share")
        stats = learn_choices(self.cfg, self.llm.reset(self.adapter), self.data().public, own,
                              list(checked.values()), epochs=m.server_kd_epochs,
                              lr=self.cfg.server.lr, seed=self.seed(rnd, "kd"), desc="server kd",
                              rehearse=self.data().server)
        self.adapter = self.llm.trainable()
        self.s0, self.s0_version = None, rnd  # S_0 of the new adapter: step 6 makes it
        return _finite({"train/server_loss": stats["loss"], "train/kd_loss": stats["kd_loss"],
                        "train/kd_from_clients": stats["kd_taken"], "train/kd_steps": stats["steps"],
                        "train/rejected_clients": len(replies) - len(checked),
                        **_receiving_metrics(stats)})

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


def own_knowledge(cfg: RunConfig, lm: LM, public: PublicSet | None) -> TopKLogits | Tensor:
    """A model's knowledge of D_p: its knowledge set S (the top-K logits along the gold
    answers, the paper) or, with ``knowledge: choices``, its [N, C] choice posteriors."""
    m: FedMKTConfig = cfg.method
    if m.knowledge == "choices":
        return choices.choice_knowledge(cfg, lm, run_public(cfg), temperature=m.temperature)
    def compute() -> dict[str, Tensor]:
        s = knowledge_set(lm, public, m.top_k, batch_size=cfg.eval.batch_size,
                          reduction=m.selection_loss)
        return {**{f: getattr(s, f) for f in TENSOR_FIELDS},
                "vocab_size": torch.tensor([s.vocab_size])}

    with autocast(cfg, lm.model):  # a model, public set and settings seen before: reused
        got = reuse.tensors(cfg.eval.reuse, "topk", lm.model, lm.tokenizer,
                            {"public": public.seqs, "pad_id": public.pad_id, "k": m.top_k,
                             "batch_size": cfg.eval.batch_size,
                             "reduction": m.selection_loss}, compute)
    return TopKLogits(vocab_size=int(got["vocab_size"][0]), **{f: got[f] for f in TENSOR_FIELDS})


def _mean_reported(replies: dict[int, Payload], field: str, key: str) -> dict[str, float]:
    """``{key: the replies' mean of field}`` (:func:`mean_number`), or nothing when no
    reply reported it."""
    mean = mean_number(replies, field)
    return {} if mean is None else {key: mean}


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics without NaN (a loss over no step: nothing was distilled)."""
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def _receiving_metrics(stats: dict[str, float]) -> dict[str, float]:
    """``train/*`` of the receiving options a distillation ran (:mod:`fedkt.alignment.
    receiving`): its KD and rehearsal steps, rehearsal CE and anchoring KL."""
    return {f"train/{k}": stats[k] for k in ("kd_steps", "rehearsal_steps", "rehearsal_loss",
                                             "anchor_loss") if k in stats}


def run_public(cfg: RunConfig) -> list[dict]:
    from fedkt.data.splits import run_data

    return run_data(cfg.data, cfg.clients.num_clients, cfg.seed).public


def learn_choices(cfg: RunConfig, lm: LM, public: list[dict], own: Tensor,
                  others: list[Tensor], *, epochs: float, lr: float | None, seed: int,
                  desc: str, rehearse: list[dict]) -> dict[str, float]:
    """Steps 4-5 / 7 with ``knowledge: choices`` (an extension): pick a teacher per sample
    (``selection``: DualMinCE on the gold choice, the lowest entropy, or always), then
    L = lambda CE + (1 - lambda) KL(teacher || learner) over the choices.  ``teacher:
    self`` (a control) distils every sample towards the learner's own posteriors instead
    of the others'.  The receiving options (``receiving``) narrow the samples taken, add
    the anchoring term to ``own`` and T**2, and rehearse on the learner's own labelled
    records ``rehearse``."""
    m: FedMKTConfig = cfg.method
    rule = {"dual_min_ce": "min_ce"}.get(m.selection, m.selection)
    if m.teacher == "self":
        others, rule = [own], "always"
    gold = (torch.tensor([int(r["label"]) for r in public]) if rule == "min_ce" else None)
    targets, chosen = choices.select(own, others, rule, gold)
    taken = receiving.taken(m.receiving, targets, own, chosen)
    return choices.distill_choices(
        cfg, lm, public, targets, taken, epochs=epochs, lr=lr, seed=seed,
        kd_weight=1.0 - m.ft_weight, ft_weight=m.ft_weight, temperature=m.temperature,
        desc=desc, **receiving.distill_options(m.receiving, m.temperature, own, rehearse))


def client_train_and_share(ctx: ClientContext, msg: Payload) -> Payload:
    """Steps 1-2 (Alg. 1 l. 24-31): train the LoRA on private data (Eq. 4), compute S_k,
    upload it if asked."""
    m: FedMKTConfig = ctx.method
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(ctx.load_state("adapter"))  # None in round 1: the initial adapter
    lr = ctx.cfg.clients.model_for(ctx.cid).lr  # D.1: each SLM's own rate
    stats = train_lm(ctx.cfg, lm, ctx.private, seed=ctx.seed("train"), lr=lr,
                     desc=f"{ctx.name} train")
    ctx.save_state("adapter", lm.trainable())
    loss = stats["loss"] if math.isfinite(stats["loss"]) else 0.0
    metrics = {"train/loss": stats["loss"], "train/steps": stats["steps"]}
    reply = Payload(train_loss=loss, metrics=metrics)
    if m.teacher == "none":  # the no-exchange control: no knowledge, step 7 distils nothing
        return reply
    if m.knowledge == "choices":  # an extension: posteriors over the task's choices
        own_p = own_knowledge(ctx.cfg, lm, None)
        ctx.save_state("own_choices", choices.pack(own_p))  # for step 7's selection
        if msg.get("share"):
            sent = choices.sent(own_p, m.teacher, ctx.seed("shuffle"))
            reply[choices.FIELD] = choices.pack(sent)
        return reply
    own = own_knowledge(ctx.cfg, lm, _client_public(ctx, lm))
    packed = pack_topk(own)
    ctx.save_state("own_topk", packed)  # for this client's own DualMinCE in step 7
    if msg.get("share"):
        entries, nbytes = packed_entries(packed)
        reply.update(topk=packed, vocab_size=own.vocab_size, k=m.top_k)
        metrics.update({"train/topk_entries": entries,
                        "train/topk_bytes_per_entry": nbytes / entries if entries else 0.0})
    return reply


def client_distill(ctx: ClientContext, msg: Payload) -> Payload:
    """Step 7 (Alg. 1 l. 33-41): align S_0 to this client's tokens, DualMinCE, train on L3
    (Eqs. 6, 8, 10)."""
    m: FedMKTConfig = ctx.method
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(ctx.load_state("adapter"))
    if m.teacher == "none":  # the no-exchange control: the model of step 1, evaluated
        return _step7_reply(ctx, lm, Payload(metrics={"train/kd_steps": 0}))
    if m.knowledge == "choices":
        return _client_distill_choices(ctx, msg, lm)
    public = _client_public(ctx, lm)
    own_packed = ctx.load_state("own_topk")
    if own_packed is None:
        raise RuntimeError(f"{ctx.name}: no knowledge set of its own on disk; 'train_and_share' "
                           "must run before 'distill'")
    own = unpack_topk(own_packed, vocab_size(lm.tokenizer), m.top_k, f"{ctx.name} (own)")
    server_tok = _tokenizer(ctx.cfg.server)
    packed = ctx.received(msg, S0, finite=False)  # sent now, or kept from an earlier round
    s0 = unpack_topk(packed, vocab_size(server_tok), m.top_k, "server")  # validated on receipt
    server_public = PublicSet.build(ctx.cfg, server_tok, ctx.data().public)
    aligned = to_receiver(s0, server_tok, server_public, lm.tokenizer, public, "server")
    selection = dual_min_ce(own.losses, other_losses([aligned], own))  # Alg. 2 l. 6-11
    targets = build_targets(own, [aligned], public, selection,
                            fallback_to_own=m.fallback_to_own, unaligned=m.unaligned)
    stats = distill(ctx.cfg, lm, ctx.data().public, targets, epochs=m.client_kd_epochs,
                    lr=m.client_kd_lr or ctx.cfg.clients.model_for(ctx.cid).lr,
                    seed=ctx.seed("kd"), desc=f"{ctx.name} kd")
    ctx.save_state("adapter", lm.trainable())
    metrics = {"train/kd_loss": stats["kd_loss"], "train/l3_loss": stats["loss"],
               "train/kd_from_server": targets.fraction_from_others(),
               "train/kd_one_hot": stats["kd_one_hot"],
               **{f"train/{k}": stats[k] for k in DIAGNOSTICS}}
    return _step7_reply(ctx, lm, Payload(kd_loss=stats["kd_loss"], metrics=metrics))


def _step7_reply(ctx: ClientContext, lm: LM, reply: Payload) -> Payload:
    """Step 7's reply: with ``post_fedavg`` the adapter for the averaging (evaluated in
    'adopt'), else the client's test metrics added to its ``metrics``."""
    if ctx.method.post_fedavg:
        reply.update(adapter=lm.trainable(), num_examples=len(ctx.private))
    else:
        reply["metrics"].update(client_test_metrics(ctx, lm))
    return reply


def _client_distill_choices(ctx: ClientContext, msg: Payload, lm: LM) -> Payload:
    """Step 7 with ``knowledge: choices`` (an extension): S_0's posteriors validated, a
    teacher per sample against this client's own posteriors of step 2, KD over the choices."""
    m: FedMKTConfig = ctx.method
    own_packed = ctx.load_state("own_choices")
    if own_packed is None:
        raise RuntimeError(f"{ctx.name}: no posteriors of its own on disk; 'train_and_share' "
                           "must run before 'distill'")
    public = ctx.data().public
    own = choices.unpack(own_packed, len(public), own_packed["posteriors"].shape[-1],
                         f"{ctx.name} (own)")
    s0 = choices.unpack(ctx.received(msg, S0), *own.shape, "server")
    stats = learn_choices(ctx.cfg, lm, public, own, [s0], epochs=m.client_kd_epochs,
                          lr=m.client_kd_lr or ctx.cfg.clients.model_for(ctx.cid).lr,
                          seed=ctx.seed("kd"), desc=f"{ctx.name} kd", rehearse=ctx.private)
    ctx.save_state("adapter", lm.trainable())
    metrics = _finite({"train/kd_loss": stats["kd_loss"], "train/l3_loss": stats["loss"],
                       "train/kd_from_server": stats["kd_taken"], "train/kd_steps": stats["steps"],
                       **_receiving_metrics(stats)})
    return _step7_reply(ctx, lm, Payload(
        kd_loss=stats["kd_loss"] if math.isfinite(stats["kd_loss"]) else 0.0, metrics=metrics))


def client_adopt(ctx: ClientContext, msg: Payload) -> Payload:
    """``post_fedavg``: keep the averaged adapter as this client's model and evaluate it."""
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(msg.state("adapter", like=lm.initial, source="server"))
    ctx.save_state("adapter", lm.trainable())
    return Payload(metrics=client_test_metrics(ctx, lm))
