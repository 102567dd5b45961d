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
computed or sent and nothing is distilled.  ``client_kd: false`` skips steps 6-7 only
(a control of clients -> LLM whose clients no claim reads).  The receiving-side options
(``receiving``: rehearsal, anchoring, T**2, selective taking) are
:mod:`fedkt.alignment.receiving`'s.

Messages per round and client: one ``train_and_share`` call (steps 1-2) and one
``distill`` call (step 7, and the client's evaluation).  S_0 is the held object ``s0``
(:mod:`fedkt.methods.holdings`, version = the round whose step 6 made it): a client is
sent it only when it does not hold that version (LLM2SLM: once).

What a participant knows and how it learns from the other side's is one interface,
:class:`~.knowledge.Knowledge` (:mod:`.knowledge`): top-K logits (the paper) or choice
posteriors (``knowledge: choices``), each computed, packed, unpacked and validated on
receipt, and learned from by :func:`~.knowledge.learn_from_knowledge`, the one step
behind the server's steps 4-5 and a client's step 7.  Wire formats, token alignment and
targets are :mod:`fedkt.alignment`'s; DualMinCE and the distillation step :mod:`.distill`'s.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fedkt.alignment import choices
from fedkt.alignment.topk import TopKLogits
from fedkt.data.formatting import check_shared_template
from fedkt.errors import ConfigError
from fedkt.federated.payload import Payload
from fedkt.methods.base import ClientContext, Clients, Server, mean_metric
from fedkt.train.lm import LM, client_lm, client_test_metrics, evaluate_lm, server_lm, train_lm

from .config import FedMKTConfig
from .knowledge import (
    KDStep,
    Knowledge,
    Sender,
    knowledge_for,
    learn_from_knowledge,
    model_tokenizer,
)

S0 = "s0"  # the held object: the server's knowledge set S_0, by the round that made it


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
        if m.knowledge == "choices":  # each model scores the choices in its own tokens
            choices.require_choice_task(self.data().task)
        self.llm = server_lm(cfg, self.data())
        if m.knowledge == "logits":  # aligned token by token: one text for every model
            check_shared_template(cfg.data.chat_template, {"server": self.llm.tokenizer, **{
                f"client {cid}": model_tokenizer(cfg.clients.model_for(cid))
                for cid in cfg.client_ids()}}, cfg.method.name)
        self.adapter = self.llm.trainable()
        # the LLM's knowledge of D_p (top-K logits along the gold answers, or posteriors)
        self.knowledge: Knowledge = knowledge_for(cfg, self.llm.tokenizer, records,
                                                    data=self.data())
        self.public = getattr(self.knowledge, "public", None)  # D_p in the LLM's tokens
        self.global_adapter: dict[str, Tensor] | None = None
        self.s0: TopKLogits | Tensor | None = None  # S_0 of the current adapter
        self.s0_version = 0  # round whose step 6 made S_0 (0: the initial adapter)

    def own_knowledge(self) -> TopKLogits | Tensor:
        """S_0 of the LLM's current adapter (recomputed after training or a resume): its
        top-K logits, or with ``knowledge: choices`` its [N, C] posteriors."""
        if self.s0 is None:
            self.s0 = self.knowledge.compute(self.llm.reset(self.adapter))
        return self.s0

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        """One round of Algorithm 1 (server side); the extensions are in the helpers it
        calls (:meth:`learn_own_data`, :meth:`clients_distill`, :meth:`s0_message`)."""
        m: FedMKTConfig = self.method
        # steps 1-2 (Alg. 1 l. 11, 24-31): clients train on private data (Eq. 4), share S_k
        exchange = m.teacher != "none"  # teacher: none (a control): no step 2-7 but step 1
        msg = Payload(share=m.llm_training and exchange)
        replies = clients.call("train_and_share", {cid: msg for cid in clients.ids})
        metrics = _mean_reported(replies, "train/loss")  # the clients' mean
        metrics.update(self.learn_own_data(rnd))  # an extension: needs the server's own data
        # steps 3-5 (Alg. 1 l. 12-18): align each S_k, DualMinCE, train the LLM on L2
        metrics.update(self.learn_from_clients(rnd, replies, clients))
        # step 6 (Alg. 1 l. 19): S_0 of the (new) adapter goes to every client lacking it
        msgs = {cid: Payload() for cid in replies}  # no S_0, no KD (the controls)
        if m.sends_s0:
            fields, s0 = self.s0_message()
            msgs = {cid: self.holdings.offer(Payload(fields), cid, S0, self.s0_version, s0)
                    for cid in replies}
        # step 7 (Alg. 1 l. 20, 33-41): clients align S_0, DualMinCE against their own
        # loss, train on L3
        got = self.clients_distill(msgs, clients)
        if m.sends_s0:
            self.holdings.confirm(msgs, got, S0, self.s0_version)
            metrics.update(_mean_reported(got, "train/kd_loss", "train/client_kd_loss"))
        return metrics

    def learn_from_clients(self, rnd: int, replies: dict[int, Payload], clients: Clients
                           ) -> dict[str, float]:
        """Steps 3-5 (Alg. 1 l. 12-18): each S_k validated and aligned to the LLM's tokens
        (a client whose S_k fails is left out of the round, with the reason), DualMinCE,
        the LLM trained on L2; its objective is the row's ``server_loss``.  LLM2SLM
        (``llm_training: false``, the paper's baseline) skips them: the LLM only teaches;
        so does ``teacher: none`` (the no-exchange control: no S_k came)."""
        m: FedMKTConfig = self.method
        if not m.llm_training:
            return {}
        if m.teacher == "none":
            return {"train/kd_steps": 0}
        own = self.own_knowledge()
        # step 3 (Alg. 1 l. 12): each S_k on receipt: validated, mapped to the LLM's tokens
        received = clients.validate(dict(sorted(replies.items())), lambda cid, reply: (
            self.knowledge.unpack(reply, Sender(f"client {cid}", self.cfg.clients.model_for(cid)),
                                  own)), "train_and_share")
        # steps 4-5 (Alg. 1 l. 13-18; Alg. 2 l. 6-11): DualMinCE; L2 = lambda L_FT +
        # (1 - lambda) L_KD (Eqs. 5, 7, 9)
        step = KDStep(m.server_kd_epochs, self.cfg.server.lr, self.seed(rnd, "kd"),
                      "server kd", rehearse=self.data().server)
        out = learn_from_knowledge(self.knowledge, self.llm.reset(self.adapter), own,
                                   list(received.values()), step, objective="server_loss",
                                   taken="kd_from_clients")
        self.adapter = self.llm.trainable()
        self.s0, self.s0_version = None, rnd  # S_0 of the new adapter: step 6 makes it
        return {**out, **self.knowledge.traffic([replies[cid] for cid in received]),
                "train/rejected_clients": len(replies) - len(received)}

    def s0_message(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """Step 6's request fields and S_0 packed for the wire.  ``teacher: shuffled`` (a
        control) permutes S_0's samples, by a permutation fixed for each S_0 version;
        ``marginal`` gives every sample S_0's mean posterior; ``teacher_from: clients``
        leaves S_0 as it is."""
        sent = self.knowledge.sent(self.own_knowledge(), self.seed(self.s0_version, "shuffle"),
                                   "server")
        fields = self.knowledge.pack(sent)
        return fields, fields.pop(self.knowledge.field)

    def clients_distill(self, msgs: dict[int, Payload], clients: Clients) -> dict[int, Payload]:
        """Step 7 (Alg. 1 l. 20, the paper's ClientUpdate2): every client's ``distill``
        call; the replies that arrived.  ``post_fedavg`` (an extension, FATE-LLM's option
        for homogeneous SLMs; the paper does not average) FedAvgs their adapters after
        it, which every client then adopts and evaluates."""
        if not (self.method.post_fedavg and msgs):
            return clients.call("distill", msgs)
        got, self.global_adapter = clients.aggregate(
            "distill", msgs, field="adapter", like=client_lm(self.cfg, 0, self.data()).initial)
        clients.call("adopt", {cid: Payload(adapter=self.global_adapter) for cid in got})
        return got

    def learn_own_data(self, rnd: int) -> dict[str, float]:
        """An extension (``data.split.server_size``): the LLM trains on the server's own
        labelled data with the task loss, as a client does on its private data (Eq. 4).
        Nothing without such data."""
        if not self.data().server:
            return {}
        stats = train_lm(self.cfg, self.llm.reset(self.adapter), self.data().server,
                         data=self.data(), seed=self.seed(rnd, "own"), lr=self.cfg.server.lr,
                         desc="server train")
        self.adapter = self.llm.trainable()
        self.s0, self.s0_version = None, rnd  # S_0 of the new adapter: step 6 makes it
        return {"train/server_own_loss": stats["loss"]}

    def evaluate(self, rnd: int) -> dict[str, float]:
        return evaluate_lm(self.cfg, self.llm.reset(self.adapter), self.data().test,
                           data=self.data())

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


def _mean_reported(replies: dict[int, Payload], metric: str, key: str | None = None
                   ) -> dict[str, float]:
    """``{key (default: metric): the replies' mean of their reported metric}``
    (:func:`mean_metric`), or nothing when no reply reported it."""
    mean = mean_metric(replies, metric)
    return {} if mean is None else {key or metric: mean}


# --------------------------------------------------------------------------- client side


def _knowledge(ctx: ClientContext, lm: LM) -> Knowledge:
    """This client's knowledge of D_p, in its model's tokens."""
    return knowledge_for(ctx.cfg, lm.tokenizer, ctx.data().public, data=ctx.data())


def _kept(knowledge: Knowledge) -> str:
    """Where a client keeps its own knowledge between steps 2 and 7."""
    return f"own_{knowledge.field}"


def client_train_and_share(ctx: ClientContext, msg: Payload) -> Payload:
    """Steps 1-2 (Alg. 1 l. 24-31): train the LoRA on private data (Eq. 4), compute S_k,
    upload it if asked."""
    m: FedMKTConfig = ctx.method
    lm = client_lm(ctx.cfg, ctx.cid, ctx.data())
    lm.reset(ctx.load_state("adapter"))  # None in round 1: the initial adapter
    lr = ctx.cfg.clients.model_for(ctx.cid).lr  # D.1: each SLM's own rate
    stats = train_lm(ctx.cfg, lm, ctx.private, data=ctx.data(), seed=ctx.seed("train"),
                     lr=lr, desc=f"{ctx.name} train")
    ctx.save_state("adapter", lm.trainable())
    metrics = {"train/steps": stats["steps"]}
    if math.isfinite(stats["loss"]):  # a client without records has no loss
        metrics["train/loss"] = stats["loss"]
    reply = Payload(metrics=metrics)
    if m.teacher == "none":  # the no-exchange control: no knowledge, step 7 distils nothing
        return reply
    knowledge = _knowledge(ctx, lm)
    own = knowledge.compute(lm)  # step 2 (Alg. 1 l. 29-31): S_k on D_p
    fields = knowledge.pack(own)
    ctx.save_state(_kept(knowledge), fields[knowledge.field])  # for step 7's own selection
    if msg.get("share"):
        sent = knowledge.sent(own, ctx.seed("shuffle"), "clients")  # the sender-side controls
        reply.update(fields if sent is own else knowledge.pack(sent))
        metrics.update(knowledge.traffic([reply]))
    return reply


def client_distill(ctx: ClientContext, msg: Payload) -> Payload:
    """Step 7 (Alg. 1 l. 33-41): align S_0 to this client's tokens, DualMinCE against its
    own S_k of step 2 (its adapter has not changed since), train on L3 (Eqs. 6, 8, 10)."""
    m: FedMKTConfig = ctx.method
    lm = client_lm(ctx.cfg, ctx.cid, ctx.data())
    lm.reset(ctx.load_state("adapter"))
    if not m.sends_s0:  # the controls: the model of step 1, evaluated
        return _step7_reply(ctx, lm, Payload(metrics={"train/kd_steps": 0}))
    knowledge = _knowledge(ctx, lm)
    kept = ctx.load_state(_kept(knowledge))
    if kept is None:
        raise RuntimeError(f"{ctx.name}: no knowledge of its own on disk; 'train_and_share' "
                           "must run before 'distill'")
    own = knowledge.unpack(Payload({knowledge.field: kept}), Sender(f"{ctx.name} (own)"))
    # S_0, sent now or kept from an earlier round: validated, aligned (Alg. 1 l. 35)
    s0 = ctx.received(msg, S0, finite=knowledge.finite)
    s0 = knowledge.unpack(Payload(msg, **{knowledge.field: s0}), Sender("server", ctx.cfg.server),
                          own)
    # Alg. 1 l. 36-41: DualMinCE against its own loss; L3 = lambda L_FT + (1 - lambda) L_KD
    step = KDStep(m.client_kd_epochs, m.client_kd_lr or ctx.cfg.clients.model_for(ctx.cid).lr,
                  ctx.seed("kd"), f"{ctx.name} kd", rehearse=ctx.private, client=True)
    metrics = learn_from_knowledge(knowledge, lm, own, [s0], step, objective="l3_loss",
                                   taken="kd_from_server")
    ctx.save_state("adapter", lm.trainable())
    return _step7_reply(ctx, lm, Payload(metrics=metrics))


def _step7_reply(ctx: ClientContext, lm: LM, reply: Payload) -> Payload:
    """Step 7's reply: with ``post_fedavg`` the adapter for the averaging (evaluated in
    'adopt'), else the client's test metrics added to its ``metrics``."""
    if ctx.method.post_fedavg:
        reply.update(adapter=lm.trainable(), num_examples=len(ctx.private))
    else:
        reply["metrics"].update(client_test_metrics(ctx, lm))
    return reply


def client_adopt(ctx: ClientContext, msg: Payload) -> Payload:
    """``post_fedavg``: keep the averaged adapter as this client's model and evaluate it."""
    lm = client_lm(ctx.cfg, ctx.cid, ctx.data())
    lm.reset(msg.state("adapter", like=lm.initial, source="server"))
    ctx.save_state("adapter", lm.trainable())
    return Payload(metrics=client_test_metrics(ctx, lm))
