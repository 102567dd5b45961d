"""FedSP's training procedures: the two client phases, Eq. 2, and the paper's optimiser.

* phase (i), *global model alignment* (:func:`align_auxiliary`): prompts frozen, the
  auxiliary model's layers trained on the task loss;
* phase (ii), *local knowledge capturing* (:func:`capture_local_knowledge`): the model
  frozen, only the prompts trained (also the server's own prompt steps);
* Eq. 2 (:func:`distill_auxiliary`): the auxiliary model learns the LLM's last hidden
  states, ``MSE(H_LLM, W_S H_aux)``, no prompts attached;
* Sec. 4.3's optimiser (:func:`stage_optimizer`): AdamW, betas (0.9, 0.999), weight decay
  0.01, warm-up then linear decay over the run, one per client and stage, its state kept
  across rounds (:func:`optimizer_tensors`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedkt.config import RunConfig, TrainingConfig
from fedkt.federated.payload import PayloadError
from fedkt.infra.precision import (
    autocast,
    autocast_dtype,
    grad_scaler,
    resolve_precision,
    upcast,
)
from fedkt.infra.timing import timed
from fedkt.models.adapters import prefix_param, set_prefix
from fedkt.models.auxiliary import aux_param_groups, unwrap
from fedkt.train.lm import LM, lm_batches, train_lm
from fedkt.train.loop import run_steps
from fedkt.train.optim import make_optimizer, step

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData


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
                                   f"{tuple(moments['exp_avg'].shape)}, "
                                   f"the weight {tuple(p.shape)}")
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


def align_auxiliary(cfg: RunConfig, lm: LM, records: list[dict], *, data: FederatedData,
                    steps: int, seed: int, params: list[nn.Parameter], lr: float | None = None,
                    optimizer: tuple[torch.optim.Optimizer, Any] | None = None
                    ) -> dict[str, float]:
    """Phase (i), global model alignment: prompts frozen, ``params`` trained (task loss)."""
    with only_trainable(lm.model, params):
        return train_lm(steps_config(cfg, records, steps), lm, records, data=data, seed=seed,
                        lr=lr, desc="fedsp align", optimizer=optimizer)


def capture_local_knowledge(cfg: RunConfig, lm: LM, records: list[dict], *,
                            data: FederatedData, steps: int, seed: int, lr: float | None = None,
                            optimizer: tuple[torch.optim.Optimizer, Any] | None = None
                            ) -> dict[str, float]:
    """Phase (ii), local knowledge capturing: the model frozen, only the prompts trained."""
    with only_trainable(lm.model, [prompt_param(lm.model)]):
        return train_lm(steps_config(cfg, records, steps), lm, records, data=data, seed=seed,
                        lr=lr, desc="fedsp prompts", optimizer=optimizer)


def _body(model: nn.Module) -> nn.Module:
    """The transformer body (embeddings .. final norm) of a causal LM, without prompts."""
    return unwrap(model).base_model


@timed("distill")
def distill_auxiliary(cfg: RunConfig, teacher: nn.Module, student: nn.Module, w_s: nn.Linear,
                      tokenizer: Any, records: list[dict], *, data: FederatedData, steps: int,
                      lr: float, seed: int, params: list[nn.Parameter],
                      batch_size: int | None = None,
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
    batches = lm_batches(cfg, tokenizer, records, seed=seed, batch_size=bs, data=data)
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
                          modules=[student], seed=seed, total=steps, desc="fedsp kd",
                          cast=autocast_dtype(cfg, device))
    losses = stats.losses
    tail = losses[-max(1, len(losses) // 10):]
    return {"kd_loss_first": losses[0], "kd_loss": sum(tail) / len(tail), "kd_steps": steps}


def precision_key(cfg: RunConfig, model: nn.Module) -> list[str]:
    """The resolved precision for the KD cache key (fp32 adds nothing: old keys stay valid)."""
    dtype = resolve_precision(cfg.training.precision, model)
    return [] if dtype is None else [str(dtype)]
