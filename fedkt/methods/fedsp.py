"""FedSP: tunable soft prompts are the messengers (Dong et al., EMNLP Findings 2023).

Dong, Xie, Ding, Shen, Li, "Tunable Soft Prompts are Messengers in Federated
Learning", Findings of EMNLP 2023, Sec. 3.

The server owns a global LLM and never shares it.  Clients train an *auxiliary
model* (:mod:`fedkt.models.auxiliary`): N of the LLM's layers (bottom, middle or
top), its embeddings, final norm and head, with cross-layer parameter sharing so that
the N layers run L times, L being the LLM's depth.  Every one of the L virtual layers
carries its own prefix (peft prefix tuning, ``training.prefix_tokens`` = 40 virtual
tokens), so the same soft prompts ``P`` (``[40, L * 2 * kv_dim]``) plug into both
models.

Before round 1 the server distils the LLM into the auxiliary model, no prompts
attached (Eq. 2)::

    min over (aux weights, W_S) of  MSE( H_LLM(x), W_S H_aux(x) )    on the server's data

and sends it to every client once (only the chosen layers, embeddings, final norm and
head travel; clients keep it on their disk).  Then every round:

1. the server sends the current prompts P;
2. client k (i) freezes P and trains its auxiliary model on its data with the task
   loss (*global model alignment*: the prompts carry the global model's knowledge and
   the auxiliary model learns to work with them), then (ii) freezes the auxiliary
   model and trains P on its data (*local knowledge capturing*); it uploads P_k only;
3. the server aggregates ``P = sum_k n_k P_k / sum_k n_k`` (Eq. 1), plugs P into the
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

Protocol (issue #18; defaults are the paper's and the reference scripts'): the server's
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

import hashlib
import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from fedkt.config import MethodConfig, RunConfig, TrainingConfig
from fedkt.eval import predictions
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Clients, Method, RoundError, Server, mean_number
from fedkt.models.adapters import PREFIX_KEY, prefix_param, set_prefix, text_prefix
from fedkt.models.auxiliary import (
    AuxSpec,
    aux_param_groups,
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
from fedkt.payload import Payload, PayloadError
from fedkt.precision import autocast, grad_scaler, resolve_precision, upcast
from fedkt.train.lm import (
    LM,
    client_test_metrics,
    evaluate_lm,
    get_lm,
    lm_batches,
    prefix_init_text,
    train_lm,
)
from fedkt.train.loop import run_steps
from fedkt.train.optim import make_optimizer, pick_device, step

PROMPT_KEY = PREFIX_KEY  # peft's prefix embedding, adapter name dropped
_META = "__fedsp_meta__"  # reserved keys of the client's cached auxiliary model
_TOK = "__fedsp_tok__/"


class PromptMessengerConfig(MethodConfig):
    """Settings shared by FedSP, FedPrompt and FedPrompt-Single (defaults: the paper's and,
    where the paper is silent, the reference scripts').

    Local and server training use ``training.batch_size``; ``training.prefix_tokens``
    is the prompt length (40 in the paper); ``training.peft`` is ignored (always
    prefix tuning).
    """

    # "auxiliary": FedSP's cut model; "llm": clients hold the whole LLM (FedPrompt).
    client_model: Literal["auxiliary", "llm"] = "auxiliary"
    # N real layers of the auxiliary model and where they come from in the LLM.
    aux_layers: int = Field(1, ge=1)
    layer_position: Literal["bot", "mid", "top"] = "bot"
    # N layers run L times (virtual depth L); off: depth N, prefixes of those layers only.
    cross_layer_sharing: bool = True
    # Eq. 2 before round 1: the paper runs 5,000 steps at lr 5e-4 on the server's data.
    distill: bool = True
    kd_steps: int = Field(5000, ge=0)
    kd_lr: float = Field(5e-4, gt=0)
    kd_batch_size: int | None = Field(None, ge=1)
    # W_S of Eq. 2: learned (paper), or the identity (the reference code's plain MSE, which
    # makes the auxiliary model's own last hidden states, the ones its head reads, match).
    kd_map: Literal["learned", "identity"] = "learned"
    # Keep the distilled auxiliary model in the fedkt cache, keyed by everything that
    # determines it (LLM weights, spec, data, settings), so runs that share it skip Eq. 2.
    kd_cache: bool = True
    # Client: (i) align the auxiliary model with frozen prompts, then (ii) train the prompts.
    alternating: bool = True
    align_steps: int = Field(10, ge=1)
    prompt_steps: int = Field(10, ge=1)
    # Learning rates (None: training.lr); each method's own default is the reference
    # scripts' (FedSP 5e-4 for both phases, FedPrompt-Single 5e-3, FedPrompt 5e-2).
    align_lr: float | None = Field(5e-4, gt=0)
    prompt_lr: float | None = Field(5e-4, gt=0)
    # Server: further optimisation of the aggregated prompts in the LLM on its own data
    # (Sec. 3.2; the reference's MAKE_GLOBAL_TRAIN).  server_lr None: prompt_lr.
    server_prompt_steps: int = Field(10, ge=0)
    server_lr: float | None = Field(None, gt=0)
    # Optimiser of every stage (client align, client prompts, server prompts): "paper"
    # (Sec. 4.3: AdamW, betas (0.9, 0.999), weight decay 0.01, warm-up over 0.1 of the
    # run's steps then linear decay; one optimiser per client and stage, its state kept
    # across rounds, the clients' on their disk); "training": training.betas /
    # weight_decay / warmup_ratio, a fresh AdamW for every phase.
    optimizer: Literal["paper", "training"] = "paper"
    # Prompts of a cut without sharing (depth N < L) to and from the LLM's: "repeat" (the
    # reference's merge_param_dict: upload tiled across the L layers, download the mean of
    # the L/N blocks) or "slots" (only the prefixes of the layers the cut came from).
    prompt_transfer: Literal["repeat", "slots"] = "repeat"
    # Control: the server trains the prompts on its own data alone, the clients take no part.
    server_only: bool = False
    # Auxiliary weights that KD and phase (i) update: the N layers + final norm, or also
    # the embeddings/head (the reference trains everything; costly for a 49k vocabulary).
    trainable: Literal["layers", "all"] = "layers"
    # Initial prompts: peft's random prefix (paper) or the LLM's keys/values of server text.
    prompt_init: Literal["random", "text"] = "random"
    # Eq. 1: weight each client's prompts by its number of examples (else equal weights).
    weighted: bool = True
    # Also score the server's auxiliary model with the prompts (``aux_*`` test metrics).
    eval_aux: bool = False

    @model_validator(mode="after")
    def _llm_clients(self) -> PromptMessengerConfig:
        if self.client_model == "llm" and (self.distill or self.alternating):
            raise ValueError("client_model 'llm' (FedPrompt): the clients' model is the LLM "
                             "itself, so set distill: false and alternating: false")
        if self.server_only and not self.server_prompt_steps:
            raise ValueError("server_only: the server trains the prompts alone, so "
                             "server_prompt_steps must be > 0")
        return self


class FedSPConfig(PromptMessengerConfig):
    name: Literal["fedsp"] = "fedsp"


class FedPromptConfig(PromptMessengerConfig):
    name: Literal["fedprompt"] = "fedprompt"
    client_model: Literal["auxiliary", "llm"] = "llm"
    distill: bool = False
    alternating: bool = False
    align_lr: float | None = Field(None, gt=0)
    prompt_lr: float | None = Field(5e-2, gt=0)


class FedPromptSingleConfig(PromptMessengerConfig):
    """A 1-layer model (no sharing, no KD, no alternation); its one-layer prompts are
    repeated across the LLM's layers on upload and averaged on download (the reference)."""

    name: Literal["fedprompt_single"] = "fedprompt_single"
    aux_layers: int = Field(1, ge=1)
    cross_layer_sharing: bool = False
    distill: bool = False
    alternating: bool = False
    align_lr: float | None = Field(None, gt=0)
    prompt_lr: float | None = Field(5e-3, gt=0)


# --------------------------------------------------------------------------- helpers


def prefix_training(cfg: RunConfig) -> TrainingConfig:
    """``cfg.training`` with prefix tuning (the prompts are what travels).

    ``prefix_init`` is reset to ``random``: the server sets the initial prompts itself
    (:func:`text_init`) and sends them; clients start from what they receive.
    """
    return cfg.training.model_copy(update={"peft": "prefix", "prefix_init": "random"})


def text_init(cfg: RunConfig) -> bool:
    """Whether P starts from text: ``method.prompt_init`` or ``training.prefix_init``."""
    return cfg.method.prompt_init == "text" or cfg.training.prefix_init == "text"


# FedSP's names for the shared prefix helpers: the prompts are peft's prefix embedding.
prompt_param = prefix_param
set_prompts = set_prefix


def get_prompts(model: nn.Module) -> Tensor:
    return prompt_param(model).detach().to("cpu").clone()


@contextmanager
def only_trainable(model: nn.Module, params: list[nn.Parameter]) -> Iterator[None]:
    """Within the block exactly ``params`` require gradients; restored afterwards."""
    before = [(p, p.requires_grad) for p in model.parameters()]
    chosen = {id(p) for p in params}
    for p, _ in before:
        p.requires_grad_(id(p) in chosen)
    try:
        yield
    finally:
        for p, flag in before:
            p.requires_grad_(flag)


def steps_config(cfg: RunConfig, records: list[dict], steps: int,
                 batch_size: int | None = None) -> RunConfig:
    """``cfg`` whose training runs exactly ``steps`` optimiser steps over ``records``."""
    bs = batch_size or cfg.training.batch_size
    per_epoch = max(1, math.ceil(len(records) / bs))
    training = cfg.training.model_copy(update={
        "max_steps": steps, "local_epochs": float(max(1, math.ceil(steps / per_epoch))),
        "batch_size": bs})
    return cfg.model_copy(update={"training": training})


PAPER_ADAMW = {"betas": (0.9, 0.999), "weight_decay": 0.01, "warmup_ratio": 0.1}  # Sec. 4.3


def stage_optimizer(cfg: RunConfig, params: list[nn.Parameter], *, lr: float | None,
                    steps_per_round: int, saved: dict[str, Tensor] | None
                    ) -> tuple[torch.optim.Optimizer, Any] | None:
    """The paper's optimiser of one stage, resumed from ``saved`` (its last round's
    :func:`optimizer_tensors`): warm-up and linear decay span ``rounds * steps_per_round``
    steps.  ``None`` with ``method.optimizer: training`` (a fresh one per phase)."""
    if cfg.method.optimizer != "paper":
        return None
    tcfg = cfg.training.model_copy(update=PAPER_ADAMW)
    done = int(saved["schedule"][0]) if saved else 0
    opt, sched = make_optimizer(params, tcfg, max(1, cfg.rounds * steps_per_round), lr=lr,
                                decay=True, done_steps=done)
    if saved:
        state: dict[int, dict[str, Tensor]] = {}
        for i, p in enumerate(params):
            moments = {k: saved[f"{i}.{k}"] for k in ("exp_avg", "exp_avg_sq", "step")
                       if f"{i}.{k}" in saved}
            if moments and tuple(moments["exp_avg"].shape) != tuple(p.shape):
                raise PayloadError(f"saved optimiser state {i} has shape "
                                   f"{tuple(moments['exp_avg'].shape)}, the weight {tuple(p.shape)}")
            if moments:
                state[i] = {k: v.to(p.device) for k, v in moments.items()}
        opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
    return opt, sched


def optimizer_tensors(opt: torch.optim.Optimizer, sched: Any) -> dict[str, Tensor]:
    """An AdamW's moments and its position in the schedule, as tensors to keep on disk."""
    out = {"schedule": torch.tensor([int(sched.last_epoch)], dtype=torch.int64)}
    for i, moments in opt.state_dict()["state"].items():
        for key, value in moments.items():
            out[f"{i}.{key}"] = torch.as_tensor(value).detach().to("cpu").clone()
    return out


def run_stage(train: Any, cfg: RunConfig, trained: list[nn.Parameter], *, lr: float | None,
              steps: int, saved: dict[str, Tensor] | None, **kwargs: Any
              ) -> tuple[dict[str, float], dict[str, Tensor] | None]:
    """Run a training phase (:func:`align_auxiliary` / :func:`capture_local_knowledge`) that
    updates ``trained`` with the stage's resumed optimiser; its stats and the optimiser
    state to keep."""
    opt = stage_optimizer(cfg, trained, lr=lr, steps_per_round=steps, saved=saved)
    stats = train(cfg, steps=steps, lr=lr, optimizer=opt, **kwargs)
    return stats, None if opt is None else optimizer_tensors(*opt)


def align_params(model: nn.Module, trainable: str) -> list[nn.Parameter]:
    """What KD and phase (i) update: the N real layers + final norm (+ embeddings/head)."""
    groups = aux_param_groups(model)
    return groups["layers"] + (groups["embeddings"] if trainable == "all" else [])


def state_id(state: dict[str, Tensor], *extra: Any) -> str:
    """A content hash of tensors (names, dtypes, shapes, bytes) and JSON-able extras."""
    digest = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _bytes_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


# --------------------------------------------------------------------------- training


def align_auxiliary(cfg: RunConfig, lm: LM, records: list[dict], *, steps: int, seed: int,
                    params: list[nn.Parameter], lr: float | None = None,
                    optimizer: tuple[torch.optim.Optimizer, Any] | None = None
                    ) -> dict[str, float]:
    """Phase (i), global model alignment: prompts frozen, ``params`` trained (task loss)."""
    with only_trainable(lm.model, params):
        return train_lm(steps_config(cfg, records, steps), lm, records, seed=seed, lr=lr,
                        desc="fedsp align", optimizer=optimizer)


def capture_local_knowledge(cfg: RunConfig, lm: LM, records: list[dict], *, steps: int,
                            seed: int, lr: float | None = None,
                            optimizer: tuple[torch.optim.Optimizer, Any] | None = None
                            ) -> dict[str, float]:
    """Phase (ii), local knowledge capturing: the model frozen, only the prompts trained."""
    with only_trainable(lm.model, [prompt_param(lm.model)]):
        return train_lm(steps_config(cfg, records, steps), lm, records, seed=seed, lr=lr,
                        desc="fedsp prompts", optimizer=optimizer)


def _body(model: nn.Module) -> nn.Module:
    """The transformer body (embeddings .. final norm) of a causal LM, without prompts."""
    return unwrap(model).base_model


def distill_auxiliary(cfg: RunConfig, teacher: nn.Module, student: nn.Module, w_s: nn.Linear,
                      tokenizer: Any, records: list[dict], *, steps: int, lr: float, seed: int,
                      params: list[nn.Parameter], batch_size: int | None = None,
                      learn_map: bool = True) -> dict[str, float]:
    """Eq. 2: ``MSE(H_LLM, W_S H_aux)`` of the last hidden states, no prompts attached.

    Updates ``params`` (the auxiliary model's) and, with ``learn_map``, ``W_S`` (else
    ``W_S`` is the identity); the LLM is frozen.  The mean is over non-padding
    positions and hidden units.  One shuffle of ``records`` is cycled through, so the
    LLM's hidden states are computed once per batch.
    """
    if steps <= 0 or not records:
        return {}
    bs = batch_size or cfg.training.batch_size
    batches = lm_batches(cfg, tokenizer, records, seed=seed, batch_size=bs)
    targets: dict[int, Tensor] = {}
    proj: nn.Module = w_s if learn_map else nn.Identity()
    trained = [*params, *(w_s.parameters() if learn_map else [])]
    opt, sched = make_optimizer(trained, cfg.training, steps, lr=lr)
    device = next(student.parameters()).device
    scaler = grad_scaler(cfg, device)
    teacher_body, student_body = _body(teacher), _body(student)

    def batch_loss(i: int, batch: dict[str, Tensor]) -> Tensor:
        batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        j = i % len(batches)
        with autocast(cfg, device):
            if j not in targets:
                with torch.no_grad():
                    targets[j] = upcast(teacher_body(**batch).last_hidden_state)
            target = targets[j]
            hidden = upcast(proj(student_body(**batch).last_hidden_state))  # MSE in fp32
        mask = batch["attention_mask"][..., None].to(hidden.dtype)
        diff = (hidden - target) ** 2 * mask
        return diff.sum() / (mask.sum() * hidden.shape[-1]).clamp_min(1.0)  # Eq. 2

    with only_trainable(student, params):
        stats = run_steps((batches[i % len(batches)] for i in range(steps)), batch_loss,
                          lambda loss: step(loss, [opt], clip=[trained], scaler=scaler,
                                            max_grad_norm=cfg.training.max_grad_norm,
                                            schedules=[sched]),
                          modules=[student], seed=seed, total=steps, desc="fedsp kd")
    losses = stats.losses
    tail = losses[-max(1, len(losses) // 10):]
    return {"kd_loss_first": losses[0], "kd_loss": sum(tail) / len(tail), "kd_steps": steps}


def _precision_key(cfg: RunConfig, model: nn.Module) -> list[str]:
    """The resolved precision for the KD cache key (fp32 adds nothing: old keys stay valid)."""
    dtype = resolve_precision(cfg.training.precision, model)
    return [] if dtype is None else [str(dtype)]


# --------------------------------------------------------------------------- server


def check_config(cfg: RunConfig) -> None:
    """The server holds the LLM; the clients' model derives from it."""
    name = cfg.method.name
    if cfg.server is None:
        raise ValueError(f"server: {name} needs the server's LLM (server: {{name: ...}})")
    if cfg.clients.models:
        raise ValueError(f"clients.models: {name} derives the clients' model from the "
                         "server's LLM; leave clients.models empty")


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
            raise ValueError(f"data.split: {', '.join(needs)} use(s) the server's own data, the "
                             "public split, which is empty; set data.split.public_fraction > 0")
        self.training = prefix_training(cfg)
        self.llm = get_lm(cfg.server, self.training, cfg.seed, cfg.runtime.device)
        if text_init(cfg):
            self.prompts = text_prefix(self.llm.model, self.llm.tokenizer,
                                       prefix_init_text(cfg, public), cfg.training.prefix_tokens)
        else:
            self.prompts = self.llm.initial[PROMPT_KEY].clone()
        self.spec: AuxSpec | None = None
        self.kd_done = False
        self.shipped_to: set[int] = set()  # clients holding the current auxiliary model
        self._aux_id: str | None = None
        if method.client_model == "auxiliary":
            base = unwrap(self.llm.model)
            depth = int(base.config.num_hidden_layers)
            self.spec = make_spec(depth, method.aux_layers, method.layer_position,
                                  method.cross_layer_sharing)
            self.aux_config = config_dict(base)
            aux = build_auxiliary(self.aux_config, cut_state(base, self.spec), self.spec)
            from fedkt.models.adapters import apply_peft

            aux = apply_peft(aux, self.training, seed=cfg.seed).to(pick_device(cfg.runtime.device))
            self.aux = LM(aux, self.llm.tokenizer, {})
            hidden = int(base.config.hidden_size)
            self.w_s = nn.Linear(hidden, hidden, bias=False)  # W_S of Eq. 2, from the identity
            with torch.no_grad():
                self.w_s.weight.copy_(torch.eye(hidden))
            self.w_s.to(next(aux.parameters()).device)
            if self.repeats and depth % self.spec.depth:
                raise ValueError(f"method.aux_layers = {method.aux_layers}: prompt_transfer "
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
                         t.max_grad_norm, *_precision_key(self.cfg, self.aux.model)],
                        self.cfg.data.max_length, self.data().template,
                        self.data().public, self.seed(1, "kd"))

    def aux_payload(self) -> Payload:
        """What a client receives once: the cut model, the LLM's config, the spec, the tokenizer."""
        assert self.spec is not None
        state = aux_state(self.aux.model)
        with tempfile.TemporaryDirectory() as tmp:
            self.llm.tokenizer.save_pretrained(tmp)
            tok = {p.name: _bytes_tensor(p.read_bytes()) for p in sorted(Path(tmp).iterdir())
                   if p.is_file()}
        spec = self.spec.to_json()
        return Payload(aux_model=state, aux_config=self.aux_config, aux_spec=spec,
                       aux_tokenizer=tok, aux_id=state_id(state, self.aux_config, spec))

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
                steps=m.kd_steps, lr=m.kd_lr, seed=seed, params=params,
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
            from fedkt.cache import cache_dir, cached

            key = self.kd_key()
            stats = cached(cache_dir("fedsp-kd") / f"{key[:40]}.safetensors", distill, load)
        else:
            stats = distill()
        self.kd_done = True
        return stats

    def ship(self, clients: Clients) -> str:
        """Send the auxiliary model to each client that lacks it, one at a time (they cache
        it on disk). A client that fails is excluded from this round (the 'train' call
        checks the quorum) and is sent the model again next round."""
        payload = self.aux_payload()
        for cid in clients.ids:
            if cid in self.shipped_to:
                continue
            try:
                replies = clients.call("setup", {cid: payload}, evaluate=False)
            except RoundError:
                continue
            if cid in replies and replies[cid].get("aux_id") != payload["aux_id"]:
                raise PayloadError(f"client {cid}: stored auxiliary model has id "
                                   f"{replies[cid].get('aux_id')!r}, sent {payload['aux_id']!r}")
            self.shipped_to.update(replies)
        self._aux_id = payload["aux_id"]
        return self._aux_id

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        m = self.method
        metrics: dict[str, float] = {}
        if not m.server_only:
            metrics.update(self.federated_round(rnd, clients))
        # ... then the server optimises P in the LLM on its own data
        if m.server_prompt_steps:
            lr = m.server_lr or m.prompt_lr
            lm = self.llm.reset({PROMPT_KEY: self.prompts})
            stats, self.opt_state = run_stage(
                capture_local_knowledge, self.cfg, [prompt_param(lm.model)], lr=lr,
                steps=m.server_prompt_steps, saved=self.opt_state, lm=lm,
                records=self.data().public, seed=self.seed(rnd, "server"))
            self.prompts = get_prompts(self.llm.model)
            metrics["server_loss"] = stats["loss"]
        return {f"train/{k}": v for k, v in metrics.items()}

    def federated_round(self, rnd: int, clients: Clients) -> dict[str, float]:
        """Steps 1-3: ship the auxiliary model if needed, send P, aggregate the P_k."""
        m = self.method
        metrics: dict[str, float] = {}
        aux_id = ""
        if self.spec is not None:
            if m.distill and not self.kd_done:
                metrics.update(self.distill(rnd))  # Eq. 2, once, no prompts attached
            aux_id = self.ship(clients) if set(clients.ids) - self.shipped_to else self.aux_id
        # 1. send P; 2. clients: (i) align the aux model, (ii) train P on local data
        sent = self.client_prompts()
        msg = Payload(prompts=sent, aux_id=aux_id)
        # 3. P = sum_k n_k P_k / sum_k n_k (Eq. 1; by SecAgg+ when secure aggregation is on)
        replies, avg = clients.aggregate("train", {cid: msg for cid in clients.ids},
                                         field="prompts", like=sent, weighted=m.weighted)
        counts = {c: r.number("num_examples", source=f"client {c}", low=0)
                  for c, r in replies.items()}
        self.prompts = self.merged_prompts(avg)
        for key in ("loss", "align_loss"):
            value = mean_number(replies, key, [c for c, r in replies.items()
                                               if key in r and counts[c] > 0])
            if value is not None:
                metrics[key] = value
        return metrics

    def evaluate(self, rnd: int) -> dict[str, float]:
        """The LLM with the current prompts (and the auxiliary model's, ``aux_*``)."""
        test = self.data().test
        out = evaluate_lm(self.cfg, self.llm.reset({PROMPT_KEY: self.prompts}), test)
        if self.method.eval_aux and self.spec is not None:
            set_prompts(self.aux.model, prompts_for_aux(self.prompts, self.spec))
            with predictions.scope("aux"):
                aux = evaluate_lm(self.cfg, self.aux, test)
            out.update({f"aux_{k}": v for k, v in aux.items()})
        return out

    def server_model(self) -> LM:
        """The LLM with the current prompts."""
        return self.llm.reset({PROMPT_KEY: self.prompts})

    def state_dict(self) -> dict[str, Tensor]:
        state = {"prompts": self.prompts.clone(),
                 "flags": torch.tensor([int(self.kd_done)]),
                 "shipped_to": torch.tensor(sorted(self.shipped_to), dtype=torch.int64)}
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
        self.shipped_to = {int(c) for c in state["shipped_to"].tolist()}
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


@dataclass
class _ClientAux:
    """A client's auxiliary model, built once per process from its disk copy."""

    lm: LM
    spec: AuxSpec
    aux_id: str
    base: dict[str, Tensor]  # the received values of what phase (i) trains


_AUX_CACHE: dict[str, _ClientAux] = {}


def client_setup(ctx: ClientContext, msg: Payload) -> Payload:
    """Receive the auxiliary model once and keep it on this client's disk."""
    state = msg.state("aux_model", source="server")
    config, spec = msg.get("aux_config"), msg.get("aux_spec")
    if not isinstance(config, dict) or not isinstance(spec, dict):
        raise PayloadError("server: fields 'aux_config' and 'aux_spec' must be mappings")
    AuxSpec.from_json(spec)
    tok = msg.state("aux_tokenizer", source="server")
    aux_id = state_id(state, config, spec)
    if aux_id != msg.get("aux_id"):
        raise PayloadError(f"server: auxiliary model does not match its id {msg.get('aux_id')!r}")
    meta = json.dumps({"config": config, "spec": spec, "aux_id": aux_id}).encode()
    ctx.save_state("aux_model", {**state, _META: _bytes_tensor(meta),
                                 **{_TOK + k: v for k, v in tok.items()}})
    return Payload(aux_id=aux_id, num_parameters=sum(t.numel() for t in state.values()))


def _load_client_aux(ctx: ClientContext, aux_id: str) -> _ClientAux:
    entry = _AUX_CACHE.get(aux_id)
    if entry is not None:
        return entry
    saved = ctx.load_state("aux_model")
    if saved is None:
        raise PayloadError(f"client {ctx.cid} has no auxiliary model on its disk; the server "
                           "sends it with 'setup' before the first 'train'")
    meta = json.loads(bytes(saved.pop(_META).tolist()).decode())
    if meta["aux_id"] != aux_id:
        raise PayloadError(f"client {ctx.cid} holds auxiliary model {meta['aux_id'][:12]}, the "
                           f"server trains {aux_id[:12]}")
    tok_files = {k[len(_TOK):]: saved.pop(k) for k in list(saved) if k.startswith(_TOK)}
    from transformers import AutoTokenizer

    from fedkt.models.adapters import apply_peft
    from fedkt.models.tokenizers import ensure_pad_token

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in tok_files.items():
            (Path(tmp) / name).write_bytes(bytes(data.tolist()))
        tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(tmp))
    spec = AuxSpec.from_json(meta["spec"])
    model = build_auxiliary(meta["config"], saved, spec)
    model = apply_peft(model, prefix_training(ctx.cfg), seed=ctx.cfg.seed)
    model.to(pick_device(ctx.cfg.runtime.device))
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    base = {names[id(p)]: p.detach().clone() for p in align_params(model, ctx.method.trainable)}
    entry = _ClientAux(LM(model, tokenizer, {}), spec, aux_id, base)
    while len(_AUX_CACHE) >= 2:
        _AUX_CACHE.pop(next(iter(_AUX_CACHE)))
    _AUX_CACHE[aux_id] = entry
    return entry


def _reset_aux(entry: _ClientAux, own: dict[str, Tensor] | None) -> None:
    """Load this client's aligned weights (or the received ones) into the shared copy."""
    params = dict(unwrap(entry.lm.model).named_parameters())
    values = own if own is not None else entry.base
    if set(values) != set(entry.base):
        raise PayloadError("the client's saved auxiliary weights do not match its model")
    with torch.no_grad():
        for key, value in values.items():
            params[key].copy_(value)


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """(i) align the model with the prompts frozen, (ii) train the prompts; send P_k."""
    m = ctx.method
    cfg = ctx.cfg
    if m.client_model == "llm":
        lm = get_lm(cfg.server, prefix_training(cfg), cfg.seed, cfg.runtime.device)
        params: list[nn.Parameter] = []
    else:
        entry = _load_client_aux(ctx, str(msg.get("aux_id", "")))
        _reset_aux(entry, ctx.load_state("aux_local") if m.alternating else None)
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
                               seed=ctx.seed("align"), params=params)
        names = {id(p): n for n, p in unwrap(lm.model).named_parameters()}
        ctx.save_state("aux_local", {names[id(p)]: p.detach() for p in params})
        if opt is not None:
            ctx.save_state("opt_align", opt)
        reply["align_loss"] = metrics["train/align_loss"] = stats["loss"]
    if records:
        stats, opt = run_stage(capture_local_knowledge, cfg, [prompt_param(lm.model)],
                               lr=m.prompt_lr, steps=m.prompt_steps,
                               saved=ctx.load_state("opt_prompts"), lm=lm, records=records,
                               seed=ctx.seed("prompts"))
        if opt is not None:
            ctx.save_state("opt_prompts", opt)
        reply["loss"] = metrics["train/loss"] = stats["loss"]
        metrics["train/steps"] = stats["steps"]
    reply["prompts"] = ctx.privatize({"p": get_prompts(lm.model)}, {"p": received})["p"]
    reply["metrics"] = {**metrics, **client_test_metrics(ctx, lm)}
    return reply


_PAPER = ("Dong, Xie, Ding, Shen, Li, Tunable Soft Prompts are Messengers in Federated "
          "Learning, Findings of EMNLP 2023")
_HANDLERS = {"setup": client_setup, "train": client_train}

register(Method("fedsp", FedSPConfig, FedSPServer, _HANDLERS, paper=_PAPER, aggregates=True,
                check=check_config, server_sees="soft prompts", clients_see="auxiliary model (once), prompts",
                summary="soft prompts between the server LLM and clients' KD-initialised "
                        "cut-and-shared auxiliary models"))
register(Method("fedprompt", FedPromptConfig, FedSPServer, _HANDLERS, paper=_PAPER, aggregates=True,
                check=check_config, server_sees="soft prompts", clients_see="the whole LLM (once), prompts",
                summary="FedAvg of prefix prompts; clients hold the whole LLM (FedSP baseline)"))
register(Method("fedprompt_single", FedPromptSingleConfig, FedSPServer, _HANDLERS, paper=_PAPER, aggregates=True,
                check=check_config, server_sees="soft prompts", clients_see="a 1-layer cut of the LLM (once), prompts",
                summary="prompts trained on a 1-layer model without sharing, KD or alignment, "
                        "repeated up / averaged down (FedSP baseline)"))
