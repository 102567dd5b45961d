"""Causal language models: build once, reset per use, train on (prompt, target) pairs, score.

* :func:`get_lm` builds (once per process) a model with its PEFT adapter and resets the
  trainable weights on every use, so a cached model gives the same numbers as a fresh
  one; :func:`client_lm` / :func:`server_lm` are the run's client and server models
  (a ``prefix_init: text`` prefix starts from the public split's text,
  :func:`prefix_init_text`);
* :func:`train_lm` runs local epochs over (prompt, target) pairs: ``task_weight * CE``
  plus an optional extra term (distillation), through :func:`fedkt.train.loop.run_steps`;
* :func:`evaluate_lm` scores a model on records of the run's task (accuracy, F1 or
  Rouge-L); :func:`client_test_metrics` is a client's ``test/*`` metrics of it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fedkt.config import ModelConfig, RunConfig, TrainingConfig
from fedkt.errors import ConfigError
from fedkt.infra.placement import client_device, pick_device, server_device
from fedkt.infra.precision import autocast, autocast_dtype, frozen_cast, grad_scaler, upcast
from fedkt.train.logits import forward_kept, keeps_positions, kept_positions, target_mask
from fedkt.train.loop import run_steps
from fedkt.train.optim import make_optimizer, step, trainable

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = [
    "LM",
    "ExtraLoss",
    "clear_cache",
    "client_lm",
    "client_test_metrics",
    "evaluate_lm",
    "get_lm",
    "lm_batches",
    "lm_pairs",
    "prefix_init_text",
    "saved_client_lm",
    "server_lm",
    "train_lm",
]

# (model, batch, outputs, step) -> an extra loss term (e.g. distillation)
ExtraLoss = Callable[[torch.nn.Module, dict[str, torch.Tensor], Any, int], torch.Tensor]


@dataclass
class LM:
    """A causal LM with its tokenizer and the initial values of its trainable weights."""

    model: torch.nn.Module
    tokenizer: Any
    initial: dict[str, torch.Tensor]
    lr: float | None = None  # the model config's own learning rate (None: training.lr)
    # The model config it was built from (``fedkt export`` rebuilds the base from it).
    source: ModelConfig | None = None

    def reset(self, trainable: dict[str, torch.Tensor] | None = None) -> LM:
        """Load ``trainable`` (or the initial adapter) into the model; return self."""
        from fedkt.models.adapters import load_adapter_state

        load_adapter_state(self.model, trainable if trainable is not None else self.initial)
        return self

    def trainable(self) -> dict[str, torch.Tensor]:
        from fedkt.models.adapters import adapter_state

        return adapter_state(self.model)


_LM_CACHE: dict[str, LM] = {}


def get_lm(model_cfg: ModelConfig, training: TrainingConfig, seed: int, device: str = "auto",
           prefix_text: str | None = None) -> LM:
    """The model ``model_cfg`` names with the configured PEFT, reset to its initial adapter.

    Base weights are frozen and never change, so one cached copy serves every
    client with the same model config in this process.  ``prefix_text``: the text a
    ``prefix_init: text`` prefix starts from (:func:`prefix_init_text`).
    """
    text_key = (hashlib.sha256((prefix_text or "").encode()).hexdigest()
                if training.prefix_from_text else "")
    key = "|".join([model_cfg.model_dump_json(exclude={"lr"}), training.peft, training.lora.model_dump_json(),
                    str(training.prefix_tokens), text_key, str(seed), device,
                    str(training.gradient_checkpointing)])
    lm = _LM_CACHE.get(key)
    if lm is None:
        from fedkt.infra.placement import placed_by_loader
        from fedkt.models.adapters import adapter_state, apply_peft
        from fedkt.models.causal_lm import load_causal_lm

        model, tokenizer = load_causal_lm(model_cfg, seed=seed, device=device)
        if model_cfg.quantization is not None and training.peft in ("lora", "prefix"):
            # A student on a quantised base (QLoRA): norms and head in fp32, inputs that
            # carry gradients to the adapter. A frozen teacher (peft: none) only runs.
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = apply_peft(model, training, seed=seed, prefix_text=prefix_text,
                           tokenizer=tokenizer)
        if not placed_by_loader(model):  # quantised / device-mapped models stay put
            model = model.to(pick_device(device))
        if training.gradient_checkpointing:
            from fedkt.models.adapters import enable_gradient_checkpointing

            enable_gradient_checkpointing(model)
        lm = LM(model, tokenizer, {k: v.clone() for k, v in adapter_state(model).items()},
                source=model_cfg)
        _LM_CACHE[key] = lm
    lm.lr = model_cfg.lr  # one cached copy may serve models that differ only in lr
    return lm.reset()


def clear_cache() -> None:
    _LM_CACHE.clear()


def lm_pairs(cfg: RunConfig, records: list[dict], tokenizer: Any = None, *,
             data: FederatedData) -> list[tuple[str, str]]:
    """(prompt, target) training pairs for the task of ``data`` (the run's data, which
    ``records`` come from: its task, label names and template), for the model of
    ``tokenizer`` (its chat template with ``data.chat_template``; None: plain prompts)."""
    from fedkt.data.formatting import chat_format, lm_pair

    chat = chat_format(cfg.data.chat_template, tokenizer) if tokenizer is not None else None
    return [lm_pair(r, data.task, data.label_names, data.template, chat) for r in records]


def lm_batches(cfg: RunConfig, tokenizer: Any, records: list[dict], seed: int | None,
               batch_size: int | None = None, *,
               data: FederatedData) -> list[dict[str, torch.Tensor]]:
    """Padded batches of ``records``' (prompt, target) pairs (:func:`lm_pairs` of the task
    of ``data``), shuffled with ``seed``."""
    from fedkt.data.lm_batches import make_batches, tokenize_pairs

    tokenized = tokenize_pairs(tokenizer, lm_pairs(cfg, records, tokenizer, data=data),
                               cfg.data.max_length)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return make_batches(tokenized, batch_size or cfg.training.batch_size, seed, pad)


def train_lm(
    cfg: RunConfig,
    lm: LM,
    records: list[dict],
    *,
    data: FederatedData,
    seed: int,
    extra_loss: ExtraLoss | None = None,
    task_weight: float = 1.0,
    lr: float | None = None,
    desc: str = "train",
    optimizer: tuple[torch.optim.Optimizer, Any] | None = None,
) -> dict[str, float]:
    """Local training on ``records`` (of the task of ``data``, the run's data): loss =
    task_weight * CE (+ extra_loss).

    ``extra_loss(model, batch, outputs, step)`` adds e.g. a distillation term.
    ``lr``: None takes the model's own (``lm.lr``: ``server.lr`` /
    ``clients.models[i].lr``), else ``training.lr``.  ``optimizer``: an (optimiser,
    schedule) over the trainable weights to continue (e.g. kept across rounds) instead of a
    fresh :func:`~fedkt.train.optim.make_optimizer`.
    Returns the mean loss, the number of steps and of examples.

    Plain training from the model's initial adapter (no ``extra_loss``, a fresh optimiser)
    is reused under ``training.reuse``: the trained weights are stored under a key of
    everything that decides them (the model as it starts, tokenizer, the batches' tokens,
    the training settings, learning rate, seed, precision, code: :mod:`fedkt.eval.reuse`), so
    the local training that every arm of a suite's seed does before its exchange is
    computed once.  A reused result loads the weights and torch's random state the
    training left, and reports the seconds it spared as ``train_saved_seconds``.
    """
    if cfg.training.reuse and records and extra_loss is None and optimizer is None \
            and cfg.training.peft in ADAPTERS and _at_initial(lm):
        return _reused_training(cfg, lm, records, data=data, seed=seed,
                                task_weight=task_weight, lr=lr, desc=desc)
    return _train_lm(cfg, lm, records, data=data, seed=seed, extra_loss=extra_loss,
                     task_weight=task_weight, lr=lr, desc=desc, optimizer=optimizer)


def _at_initial(lm: LM) -> bool:
    """Whether ``lm``'s trainable weights are its initial adapter (before any training)."""
    now = lm.trainable()
    return now.keys() == lm.initial.keys() and all(
        torch.equal(now[k], lm.initial[k].to(now[k].device)) for k in now)


ADAPTERS = ("lora", "prefix")  # the training.peft kinds whose trained weights the store keeps
_RNG = "__torch_rng_state__"  # entries of reused training steps beside the weights
_STAT = "__stat__/"  # their stats, one entry each


def reused_steps(lm: LM, kind: str, parts: dict[str, Any],
                 compute: Callable[[], dict[str, float]], *, phase_name: str
                 ) -> dict[str, float]:
    """``compute()``, training steps of ``lm``'s adapter that return their stats, through
    the reuse store (:func:`fedkt.eval.reuse.tensors`: ``kind``, ``lm`` as it starts and
    ``parts`` are the key). Stored: the adapter they leave, torch's random state after
    them and the stats (an int stays an int). A reuse loads the adapter and the random
    state as they were left, so what follows runs as it would have; its seconds count as
    ``<phase_name>_saved_seconds``."""
    from fedkt.eval import reuse

    def run() -> dict[str, torch.Tensor]:
        stats = compute()
        return {**lm.trainable(), _RNG: torch.get_rng_state(),
                **{_STAT + k: torch.tensor([v], dtype=torch.int64 if isinstance(v, int)
                                           else torch.float64) for k, v in stats.items()}}

    got = reuse.tensors(True, kind, lm.model, lm.tokenizer, parts, run, phase_name=phase_name)
    # The computation's end state (a no-op right after computing it): weights, torch's RNG
    lm.reset({k: v for k, v in got.items() if k != _RNG and not k.startswith(_STAT)})
    torch.set_rng_state(got[_RNG])
    lm.model.eval()
    return {k[len(_STAT):]: v.item() for k, v in got.items() if k.startswith(_STAT)}


def _reused_training(cfg: RunConfig, lm: LM, records: list[dict], *, data: FederatedData,
                     seed: int, task_weight: float, lr: float | None,
                     desc: str) -> dict[str, float]:
    """:func:`train_lm`'s plain training through the reuse store (its docstring)."""
    from fedkt.eval import reuse
    tcfg = cfg.training
    epochs = max(1, math.ceil(tcfg.local_epochs))
    batches = [b for epoch in range(epochs)
               for b in lm_batches(cfg, lm.tokenizer, records, seed=seed + epoch, data=data)]
    parts = {"batches": hashlib.sha256(b"".join(
                 reuse.tensor_digest(t).encode() for b in batches for t in b.values()
             )).hexdigest(),
             "records": len(records), "training": tcfg.model_dump(mode="json"),
             "lr": lr if lr is not None else lm.lr, "seed": seed, "task_weight": task_weight}
    return reused_steps(lm, "train", parts, lambda: _train_lm(
        cfg, lm, records, data=data, seed=seed, task_weight=task_weight, lr=lr, desc=desc,
        batches=batches), phase_name="train")


def _train_lm(cfg: RunConfig, lm: LM, records: list[dict], *, data: FederatedData, seed: int,
              extra_loss: ExtraLoss | None = None, task_weight: float = 1.0,
              lr: float | None = None, desc: str = "train",
              optimizer: tuple[torch.optim.Optimizer, Any] | None = None,
              batches: list[dict[str, torch.Tensor]] | None = None) -> dict[str, float]:
    """:func:`train_lm` itself (the computation, never reused); ``batches``: the epochs'
    batches when the caller has built them already (the same :func:`lm_batches`)."""
    tcfg = cfg.training
    model = lm.model
    device = next(model.parameters()).device
    epochs = max(1, math.ceil(tcfg.local_epochs))
    if batches is None:
        batches = [b for epoch in range(epochs)
                   for b in lm_batches(cfg, lm.tokenizer, records, seed=seed + epoch, data=data)]
    per_epoch = len(batches) // epochs if epochs else 0
    total = tcfg.max_steps or max(1, math.ceil(tcfg.local_epochs * per_epoch))
    total = min(total, len(batches))
    if total == 0:
        return {"loss": float("nan"), "steps": 0, "num_examples": 0}
    params = trainable(model)
    opt, sched = optimizer or make_optimizer(params, tcfg, total,
                                             lr=lr if lr is not None else lm.lr)
    scaler = grad_scaler(tcfg, device)

    # Without an extra loss only the task loss reads the logits: the output layer runs at
    # the target positions alone (fedkt.train.logits).
    kept = extra_loss is None and keeps_positions(model)

    def batch_loss(i: int, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(tcfg, device):  # the loss terms cast logits to fp32 themselves
            out = (forward_kept(model, batch, kept_positions(target_mask(batch["labels"])))[0]
                   if kept else model(**batch))
            loss = task_weight * upcast(out.loss)
            if extra_loss is not None:
                loss = loss + extra_loss(model, batch, out, i)
        return loss

    stats = run_steps(batches[:total], batch_loss,
                      lambda loss: step(loss, [opt], clip=[params], schedules=[sched],
                                        max_grad_norm=tcfg.max_grad_norm, scaler=scaler),
                      modules=[model], seed=seed, total=total, desc=desc,
                      cast=autocast_dtype(tcfg, device))
    return {"loss": stats.loss, "steps": total, "num_examples": len(records)}


def evaluate_lm(cfg: RunConfig, lm: LM, records: list[dict], *,
                data: FederatedData) -> dict[str, float]:
    """Evaluate a model on records of the task of ``data``, the run's data (its task, label
    names, template and drawn class order), by accuracy, F1 or Rouge-L and loss; with
    ``eval.reuse``, a stored evaluation of the same model, records and settings is reused
    (:mod:`fedkt.eval.reuse`)."""
    from fedkt.data.formatting import chat_format
    from fedkt.data.splits import drawn_groups
    from fedkt.eval import reuse
    from fedkt.eval.evaluate import evaluate_causal_lm

    fd = data
    chat = chat_format(cfg.data.chat_template, lm.tokenizer)
    settings = {"task": fd.task, "label_names": fd.label_names,
                "batch_size": cfg.eval.batch_size, "max_length": cfg.data.max_length,
                "max_new_tokens": cfg.eval.max_new_tokens,
                "positive_label": cfg.eval.positive_label, "template": fd.template,
                "class_groups": drawn_groups(cfg.eval.class_groups, fd.class_order),
                "layout": cfg.eval.scoring}
    key = {"records": records, **settings, "chat_template": cfg.data.chat_template}

    def compute() -> dict[str, float]:  # inside the store's digest of the fp32 weights
        with frozen_cast(cfg, lm.model):
            return evaluate_causal_lm(lm.model, lm.tokenizer, records, chat=chat, **settings)

    with autocast(cfg, lm.model):
        return reuse.evaluation(cfg.eval.reuse, lm.model, lm.tokenizer, key, compute)


def prefix_init_text(cfg: RunConfig, records: list[dict] | None = None, *,
                     data: FederatedData) -> str:
    """The text a ``prefix_init: text`` prefix starts from: ``records`` formatted as training
    pairs and joined, by default the public split's (the same on the server and every
    client, so every party builds the same initial prefix).  Only the first
    ``prefix_tokens`` tokens are used, so records are formatted only until the text has
    32 characters per token.  ``data``: the run's data (its public split, and the task
    that formats the records).
    """
    if records is None:
        records = data.public
        if not records:
            raise ConfigError("training.prefix_init: 'text' starts the prefix from the public "
                              "split's text, which is empty; set data.split.public_fraction > 0 "
                              "(or use prefix_init: random)")
    parts: list[str] = []
    size, need = -2, 32 * cfg.training.prefix_tokens  # size: len("\n\n".join(parts))
    for record in records:
        (prompt, target), = lm_pairs(cfg, [record], data=data)
        parts.append(prompt + target)
        size += 2 + len(parts[-1])
        if size >= need:
            break
    return "\n\n".join(parts)


def _prefix_text(cfg: RunConfig, data: FederatedData | None, who: str) -> str | None:
    """The text a ``prefix_init: text`` prefix starts from (None: no such prefix)."""
    if not cfg.training.prefix_from_text:
        return None
    if data is None:
        raise ValueError(f"{who}: training.prefix_init is 'text', which starts the prefix "
                         "from the run's public split: pass data= (the run's FederatedData)")
    return prefix_init_text(cfg, data=data)


def client_lm(cfg: RunConfig, cid: int, data: FederatedData | None = None) -> LM:
    """Client ``cid``'s model (``clients.models``), reset to its initial adapter; ``data``
    (the run's data) is needed with ``training.prefix_init: text`` only."""
    return get_lm(cfg.clients.model_for(cid), cfg.training, cfg.seed, client_device(cfg, cid),
                  prefix_text=_prefix_text(cfg, data, f"client_lm(client {cid})"))


def server_lm(cfg: RunConfig, data: FederatedData | None = None) -> LM:
    """The server's model (``server``), reset to its initial adapter; ``data`` (the run's
    data) is needed with ``training.prefix_init: text`` only."""
    if cfg.server is None:
        raise ConfigError(f"server: method {cfg.method.name!r} needs a server model")
    return get_lm(cfg.server, cfg.training, cfg.seed, server_device(cfg),
                  prefix_text=_prefix_text(cfg, data, "server_lm"))


def saved_client_lm(ctx: Any) -> LM:
    """A client's model with the adapter it last saved as ``"adapter"`` on its disk
    (``ctx.save_state``), e.g. standalone and FedMKT clients; ``Behaviour.client_model``."""
    saved = ctx.load_state("adapter")
    if saved is None:
        raise FileNotFoundError(f"{ctx.name}: no saved adapter in {ctx.state_dir} before "
                                f"round {ctx.rnd}")
    return client_lm(ctx.cfg, ctx.cid, ctx.data()).reset(saved)


def client_test_metrics(ctx: Any, lm: LM) -> dict[str, float]:
    """``test/*`` metrics of a client's LM when this call is an evaluation round."""
    return ctx.test_metrics(lambda: evaluate_lm(ctx.cfg, lm, ctx.data().test, data=ctx.data()))

