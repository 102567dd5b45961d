"""FedSP: tunable soft prompts are the messengers (Dong et al., EMNLP Findings 2023).

Dong, Xie, Ding, Shen, Li, "Tunable Soft Prompts are Messengers in Federated
Learning", Findings of EMNLP 2023, Sec. 3.  The paper has no algorithm box: steps are
cited as "step N (Sec. 3.2, <its paragraph>)" (docs/architecture.md).

The server owns a global LLM and never shares it.  Clients train an *auxiliary
model* (:mod:`fedkt.models.auxiliary`): N of the LLM's layers (bottom, middle or
top), its embeddings, final norm and head, with cross-layer parameter sharing so that
the N layers run L times, L being the LLM's depth.  Every one of the L virtual layers
carries its own prefix (peft prefix tuning, ``training.prefix_tokens`` = 40 virtual
tokens), so the same soft prompts ``P`` (``[40, L * 2 * kv_dim]``) plug into both
models.

Step 0 (Sec. 3.2, Initialization): before round 1 the server distils the LLM into the
auxiliary model, no prompts attached (Eq. 2)::

    min over (aux weights, W_S) of  MSE( H_LLM(x), W_S H_aux(x) )    on the server's data

and sends it to every client once (only the chosen layers, embeddings, final norm and
head travel; clients keep it on their disk).  Then every round:

1. (Sec. 3.2, first paragraph) the server sends the current prompts P;
2. (Sec. 3.2, Alternative Local Training) client k (i) freezes P and trains its auxiliary model on its data with the task
   loss (*global model alignment*: the prompts carry the global model's knowledge and
   the auxiliary model learns to work with them), then (ii) freezes the auxiliary
   model and trains P on its data (*local knowledge capturing*); it uploads P_k only;
3. (Sec. 3.2, first paragraph; Eq. 1) the server aggregates
   ``P = sum_k n_k P_k / sum_k n_k``, plugs P into the
   LLM and optimises it further on its own data (``server_prompt_steps``);
4. P goes out again.  Evaluation is of the LLM with the final prompts.

Phase (i) uses the local task loss, as in the reference implementation (the client
has no access to the LLM, so there is no distillation target on the client); each
client's aligned layers stay on its disk across rounds.

Variants (one server, one set of flags; all registered):

``fedsp``             the method above;
``fedprompt``         clients hold the whole LLM and only exchange prompts (Zhao et al.);
``fedprompt_single``  clients hold a 1-layer model (no sharing, no distillation, no
                      alternating training); its one-layer prompts are repeated across
                      the LLM's L layers on upload and the LLM's are averaged over the
                      layers on download (the reference's ``merge_param_dict``).

Ablations: ``distill: false`` (w/o KD), ``cross_layer_sharing: false`` (the N layers
run once, depth N; prompts repeated up / averaged down as FedPrompt-Single's, or with
``prompt_transfer: slots`` only the prefixes of the layers the cut came from),
``alternating: false`` (clients train prompts only); ``layer_position: bot|mid|top`` and
``aux_layers: 1..4``.  Control: ``server_only: true`` (the server trains the prompts on
its own data, the clients take no part).

Protocol (defaults are the paper's and the reference scripts'): the server's
own prompt steps after each aggregation (Sec. 3.2), AdamW with betas (0.9, 0.999), weight
decay 0.01, warm-up 0.1 then linear decay, one optimiser per client and stage kept across
rounds (Sec. 4.3), a learning rate per method (FedSP 5e-4, FedPrompt-Single 5e-3,
FedPrompt 5e-2), 40 prompt tokens, 5,000 KD steps at 5e-4.

``prompt_init: text`` (not in the paper, which starts from peft's random prefix; the
shared ``training.prefix_init: text`` does the same) initialises P with the LLM's own
keys/values of the server's data (:func:`fedkt.models.adapters.text_prefix`), so that
the LLM with P behaves at the start exactly as if that text preceded every input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedkt.errors import ConfigError
from fedkt.eval import predictions
from fedkt.federated.payload import Payload, PayloadError
from fedkt.infra.placement import client_device, pick_device, server_device
from fedkt.methods.base import ClientContext, Clients, RoundError, Server, mean_metric
from fedkt.models.adapters import PREFIX_KEY, apply_peft, text_prefix
from fedkt.models.auxiliary import (
    AuxSpec,
    aux_state,
    build_auxiliary,
    config_dict,
    cut_state,
    make_spec,
    prompts_averaged,
    prompts_for_aux,
    prompts_into_llm,
    prompts_repeated,
    unwrap,
)
from fedkt.train.lm import LM, client_test_metrics, evaluate_lm, get_lm, prefix_init_text

from .aux_model import (
    AUX,
    client_auxiliary,
    keep_auxiliary,
    pack_auxiliary,
    reset_auxiliary,
    state_id,
)
from .config import PromptMessengerConfig, check_config
from .training import (
    align_auxiliary,
    align_params,
    capture_local_knowledge,
    distill_auxiliary,
    get_prompts,
    precision_key,
    prefix_training,
    prompt_param,
    run_stage,
    set_prompts,
    text_init,
)

PROMPT_KEY = PREFIX_KEY  # peft's prefix embedding, adapter name dropped


# --------------------------------------------------------------------------- server


class FedSPServer(Server[PromptMessengerConfig]):
    """Sec. 3: KD-initialised auxiliary model sent once; prompts back and forth (Eq. 1)."""

    def setup(self) -> None:
        cfg, method = self.cfg, self.method
        check_config(cfg)
        public = self.data().public
        needs = [what for what, on in (
            ("distillation (Eq. 2)", method.client_model == "auxiliary" and method.distill
             and method.kd_steps > 0),
            ("server prompt optimisation", method.server_prompt_steps > 0),
            ("prompt_init 'text'", text_init(cfg))) if on]
        if needs and not public:
            raise ConfigError(f"data.split: {', '.join(needs)} use(s) the server's own data, the "
                              "public split, which is empty; set data.split.public_fraction > 0")
        self.training = prefix_training(cfg)
        self.llm = get_lm(cfg.server, self.training, cfg.seed, server_device(cfg))
        if text_init(cfg):
            self.prompts = text_prefix(self.llm.model, self.llm.tokenizer,
                                       prefix_init_text(cfg, public, data=self.data()),
                                       cfg.training.prefix_tokens)
        else:
            self.prompts = self.llm.initial[PROMPT_KEY].clone()
        self.spec: AuxSpec | None = None
        self.kd_done = False
        self._aux_id: str | None = None
        if method.client_model == "auxiliary":
            base = unwrap(self.llm.model)
            depth = int(base.config.num_hidden_layers)
            self.spec = make_spec(depth, method.aux_layers, method.layer_position,
                                  method.cross_layer_sharing)
            self.aux_config = config_dict(base)
            aux = build_auxiliary(self.aux_config, cut_state(base, self.spec), self.spec)
            aux = apply_peft(aux, self.training, seed=cfg.seed).to(pick_device(server_device(cfg)))
            self.aux = LM(aux, self.llm.tokenizer, {})
            hidden = int(base.config.hidden_size)
            self.w_s = nn.Linear(hidden, hidden, bias=False)  # W_S of Eq. 2, from the identity
            with torch.no_grad():
                self.w_s.weight.copy_(torch.eye(hidden))
            self.w_s.to(next(aux.parameters()).device)
            if self.repeats and depth % self.spec.depth:
                raise ConfigError(f"method.aux_layers = {method.aux_layers}: prompt_transfer "
                                  f"'repeat' tiles the cut's prompts over the LLM's {depth} "
                                  "layers, so aux_layers must divide it")
        self.opt_state: dict[str, Tensor] | None = None  # the server stage's optimiser

    @property
    def repeats(self) -> bool:
        """Whether the clients' prompts are repeated up / averaged down (the reference's
        merge_param_dict for a cut without sharing) rather than mapped slot by slot."""
        return (self.spec is not None and not self.spec.shared
                and self.method.prompt_transfer == "repeat")

    # ----------------------------------------------------------------- payloads

    def client_prompts(self) -> Tensor:
        """Download: the prompts as the clients' model takes them (the LLM's, its slots, or
        the mean of its layer blocks)."""
        if self.spec is None:
            return self.prompts.clone()
        if self.repeats:
            return prompts_averaged(self.prompts, self.prompts.shape[1] // self.spec.llm_depth
                                    * self.spec.depth)
        return prompts_for_aux(self.prompts, self.spec)

    def merged_prompts(self, avg: Tensor) -> Tensor:
        """Upload: the clients' averaged prompts as the LLM's (Eq. 1's P)."""
        if self.spec is None:
            return avg.clone()
        if self.repeats:
            return prompts_repeated(avg, self.prompts.shape[1]).to(self.prompts.dtype)
        return prompts_into_llm(self.prompts, avg, self.spec)

    def kd_key(self) -> str:
        """Cache key of the distilled auxiliary model: the whole teacher (every LLM weight),
        the cut's config and spec, KD and optimiser settings, data and seed."""
        m, t = self.method, self.cfg.training
        assert self.spec is not None
        teacher = unwrap(self.llm.model).state_dict()
        return state_id(teacher, self.aux_config, self.spec.to_json(),
                        m.model_dump(include={"kd_steps", "kd_lr", "kd_batch_size", "kd_map",
                                              "trainable"}),
                        [t.batch_size, t.betas, t.weight_decay, t.warmup_ratio,
                         t.max_grad_norm, *precision_key(self.cfg, self.aux.model)],
                        self.cfg.data.max_length, self.data().template,
                        self.data().public, self.seed(1, "kd"),
                        # chat-wrapped public texts (only when set: older keys stay valid)
                        *([self.cfg.data.chat_template]
                          if self.cfg.data.chat_template != "none" else []))

    @property
    def aux_id(self) -> str:
        """Content hash of the auxiliary model the clients hold ("" for FedPrompt)."""
        if self.spec is None:
            return ""
        if self._aux_id is None:
            self._aux_id = state_id(aux_state(self.aux.model), self.aux_config,
                                    self.spec.to_json())
        return self._aux_id

    # ----------------------------------------------------------------- the round

    def distill(self, rnd: int) -> dict[str, float]:
        """Eq. 2 on the server's data (the public split), before anything is sent."""
        m = self.method
        params = align_params(self.aux.model, m.trainable)
        names = {id(p): n for n, p in unwrap(self.aux.model).named_parameters()}
        public = self.data().public
        seed = self.seed(1, "kd")

        def distill(tmp: Path | None = None) -> dict[str, Any]:
            stats = distill_auxiliary(
                self.cfg, self.llm.model, self.aux.model, self.w_s, self.llm.tokenizer, public,
                data=self.data(), steps=m.kd_steps, lr=m.kd_lr, seed=seed, params=params,
                batch_size=m.kd_batch_size, learn_map=m.kd_map == "learned")
            if tmp is not None:
                from safetensors.torch import save_file

                tensors = {names[id(p)]: p.detach().to("cpu").contiguous() for p in params}
                tensors["w_s.weight"] = self.w_s.weight.detach().to("cpu").contiguous()
                save_file(tensors, str(tmp), metadata={"stats": json.dumps(stats)})
            return stats

        def load(path: Path) -> dict[str, Any]:
            from safetensors import safe_open
            from safetensors.torch import load_file

            saved = load_file(str(path))
            with safe_open(str(path), "pt") as fh:
                stats = json.loads(fh.metadata()["stats"])
            values = [saved[names[id(p)]] for p in params]  # all found before any is copied
            w_s = saved["w_s.weight"]
            with torch.no_grad():
                for p, value in zip(params, values, strict=True):
                    p.copy_(value)
                self.w_s.weight.copy_(w_s)
            return {**stats, "kd_cached": 1}

        if m.kd_cache:
            from fedkt.infra.cache import cache_dir, cached

            key = self.kd_key()
            stats = cached(cache_dir("fedsp-kd") / f"{key[:40]}.safetensors", distill, load)
        else:
            stats = distill()
        self.kd_done = True
        return stats

    def ship(self, clients: Clients) -> None:
        """Send the auxiliary model to each client that lacks it, one at a time (they keep
        it on their disk). A client that fails is excluded from this round (the 'train'
        call checks the quorum) and is sent the model again next round."""
        assert self.spec is not None
        payload = pack_auxiliary(self.aux.model, self.aux_config, self.spec, self.llm.tokenizer)
        aux_id = self._aux_id = payload["aux_id"]
        for cid in self.holdings.lacking(clients.ids, AUX, aux_id):
            try:
                replies = clients.call("setup", {cid: payload}, evaluate=False)
            except RoundError:
                replies = {}
            if cid in replies and replies[cid].get("aux_id") != aux_id:
                raise PayloadError(f"client {cid}: stored auxiliary model has id "
                                   f"{replies[cid].get('aux_id')!r}, sent {aux_id!r}")
            self.holdings.confirm([cid], replies, AUX, aux_id)

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        m = self.method
        metrics: dict[str, float] = {}
        if not m.server_only:
            metrics.update(self.federated_round(rnd, clients))
        # ... then the server optimises P in the LLM on its own data
        if m.server_prompt_steps:
            lr = m.server_prompt_lr or m.prompt_lr
            lm = self.llm.reset({PROMPT_KEY: self.prompts})
            stats, self.opt_state = run_stage(
                capture_local_knowledge, self.cfg, [prompt_param(lm.model)], lr=lr,
                steps=m.server_prompt_steps, saved=self.opt_state, lm=lm,
                records=self.data().public, data=self.data(), seed=self.seed(rnd, "server"))
            self.prompts = get_prompts(self.llm.model)
            metrics["server_loss"] = stats["loss"]
        return {f"train/{k}": v for k, v in metrics.items()}

    def federated_round(self, rnd: int, clients: Clients) -> dict[str, float]:
        """Steps 0-3 (Sec. 3.2): ship the auxiliary model if needed, send P, aggregate the
        P_k."""
        m = self.method
        metrics: dict[str, float] = {}
        aux_id = ""
        if self.spec is not None:
            if m.distill and not self.kd_done:
                metrics.update(self.distill(rnd))  # step 0 (Eq. 2), once, no prompts
            if self.holdings.lacking(clients.ids, AUX, self.aux_id):
                self.ship(clients)  # the auxiliary model, to the clients that lack it
            aux_id = self.aux_id
        # step 1: send P; step 2 (Sec. 3.2, Alternative Local Training): clients (i) align
        # the aux model, (ii) train P on local data
        sent = self.client_prompts()
        msg = Payload(prompts=sent, aux_id=aux_id)
        # step 3 (Eq. 1): P = sum_k n_k P_k / sum_k n_k (by SecAgg+ when secure aggregation
        # is on)
        replies, avg = clients.aggregate("train", {cid: msg for cid in clients.ids},
                                         field="prompts", like=sent, weighted=m.weighted)
        counts = {c: r.number("num_examples", source=f"client {c}", low=0)
                  for c, r in replies.items()}
        self.prompts = self.merged_prompts(avg)
        for key, name in (("train/loss", "loss"), ("train/align_loss", "align_loss")):
            value = mean_metric(replies, key, [c for c in replies if counts[c] > 0])
            if value is not None:
                metrics[name] = value
        return metrics

    def evaluate(self, rnd: int) -> dict[str, float]:
        """The LLM with the current prompts (and the auxiliary model's, ``aux_*``)."""
        test = self.data().test
        out = evaluate_lm(self.cfg, self.llm.reset({PROMPT_KEY: self.prompts}), test,
                          data=self.data())
        if self.method.eval_aux and self.spec is not None:
            set_prompts(self.aux.model, prompts_for_aux(self.prompts, self.spec))
            with predictions.scope("aux"):
                aux = evaluate_lm(self.cfg, self.aux, test, data=self.data())
            out.update({f"aux_{k}": v for k, v in aux.items()})
        return out

    def server_model(self) -> LM:
        """The LLM with the current prompts."""
        return self.llm.reset({PROMPT_KEY: self.prompts})

    def state_dict(self) -> dict[str, Tensor]:
        state = {"prompts": self.prompts.clone(),
                 "flags": torch.tensor([int(self.kd_done)])}
        if self.spec is not None:
            names = {id(p): n for n, p in unwrap(self.aux.model).named_parameters()}
            for p in align_params(self.aux.model, self.method.trainable):
                state[f"aux.{names[id(p)]}"] = p.detach().to("cpu").clone()
            state["w_s.weight"] = self.w_s.weight.detach().to("cpu").clone()
        for key, value in (self.opt_state or {}).items():
            state[f"opt.{key}"] = value.clone()
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.prompts = state["prompts"].clone()
        self.kd_done = bool(state["flags"][0])
        self._aux_id = None
        self.opt_state = {k[4:]: v.clone() for k, v in state.items() if k.startswith("opt.")
                          } or None
        if self.spec is not None:
            params = dict(unwrap(self.aux.model).named_parameters())
            with torch.no_grad():
                for key, value in state.items():
                    if key.startswith("aux."):
                        params[key[4:]].copy_(value)
                self.w_s.weight.copy_(state["w_s.weight"])


# --------------------------------------------------------------------------- clients


def client_setup(ctx: ClientContext, msg: Payload) -> Payload:
    """Receive the auxiliary model once and keep it on this client's disk."""
    aux_id, num_parameters = keep_auxiliary(ctx, msg)
    return Payload(aux_id=aux_id, num_parameters=num_parameters)


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """(i) align the model with the prompts frozen, (ii) train the prompts; send P_k."""
    m = ctx.method
    cfg = ctx.cfg
    if m.client_model == "llm":
        lm = get_lm(cfg.server, prefix_training(cfg), cfg.seed, client_device(cfg, ctx.cid))
        params: list[nn.Parameter] = []
    else:
        entry = client_auxiliary(ctx, str(msg.get("aux_id", "")))
        reset_auxiliary(entry, ctx.load_state("aux_local") if m.alternating else None)
        lm = entry.lm
        params = align_params(lm.model, m.trainable)
    shape = tuple(prompt_param(lm.model).shape)
    received = msg.tensor("prompts", source="server", shape=shape)
    set_prompts(lm.model, received)
    records = ctx.private
    reply = Payload(num_examples=len(records))
    metrics: dict[str, float] = {}
    # One optimiser per stage, its state on this client's disk across rounds (Sec. 4.3).
    if m.alternating and records:
        stats, opt = run_stage(align_auxiliary, cfg, params, lr=m.align_lr, steps=m.align_steps,
                               saved=ctx.load_state("opt_align"), lm=lm, records=records,
                               data=ctx.data(), seed=ctx.seed("align"), params=params)
        names = {id(p): n for n, p in unwrap(lm.model).named_parameters()}
        ctx.save_state("aux_local", {names[id(p)]: p.detach() for p in params})
        if opt is not None:
            ctx.save_state("opt_align", opt)
        metrics["train/align_loss"] = stats["loss"]
    if records:
        stats, opt = run_stage(capture_local_knowledge, cfg, [prompt_param(lm.model)],
                               lr=m.prompt_lr, steps=m.prompt_steps,
                               saved=ctx.load_state("opt_prompts"), lm=lm, records=records,
                               data=ctx.data(), seed=ctx.seed("prompts"))
        if opt is not None:
            ctx.save_state("opt_prompts", opt)
        metrics["train/loss"] = stats["loss"]
        metrics["train/steps"] = stats["steps"]
    reply["prompts"] = ctx.privatize({"p": get_prompts(lm.model)}, {"p": received})["p"]
    reply["metrics"] = {**metrics, **client_test_metrics(ctx, lm)}
    return reply
