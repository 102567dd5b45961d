"""The ``training`` section (local optimisation, PEFT, precision) and the ``clients``
section (how many, their models, who takes part)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedkt.config.base import _Strict
from fedkt.config.bounds import BatchSize, Beta, Clients, Epochs, LearningRate, Steps, Tokens
from fedkt.config.model_schema import LoraSettings, ModelConfig
from fedkt.errors import ConfigError

__all__ = ["ClientsConfig", "TrainingConfig"]


class TrainingConfig(_Strict):
    """Local optimisation (FedMKT paper defaults)."""

    lr: LearningRate = Field(3e-4, description=(
        "Learning rate of local training (AdamW), unless a model's own lr or a method's stage lr "
        "sets one."))
    batch_size: BatchSize = Field(4, description="Examples per optimiser step.")
    local_epochs: Epochs = Field(1.0, description=(
        "Passes over a client's private data per round (a fraction runs part of one)."))
    max_steps: Steps | None = Field(None, description=(
        "Cap on optimiser steps per local training (None: local_epochs decides)."))
    betas: tuple[Beta, Beta] = Field((0.9, 0.95), description="AdamW's (beta1, beta2).")
    weight_decay: float = Field(0.1, ge=0, le=10, description="AdamW's decoupled weight decay.")
    warmup_ratio: float = Field(0.008, ge=0, lt=1, description=(
        "Share of a training's steps with a linear learning-rate warm-up."))
    max_grad_norm: float | None = Field(1.0, gt=0, le=1e6, description=(
        "Clip the gradient's L2 norm to this (None: no clipping)."))
    reuse: bool = Field(True, description=(
        "Reuse a plain local training that starts from a model's initial adapter (a client's "
        "local epochs, an LLM's own-data epochs before any exchange) when the model, tokenizer, "
        "batches, training settings, learning rate, seed, precision and fedkt code were all "
        "seen before: the suite arms of one seed then compute it once (stored in "
        "$FEDKT_CACHE/reuse/train); so is a choice distillation of an adapter (knowledge: "
        "choices) whose model, targets, samples and settings were seen before (a control arm "
        "repeating one side's distillation; $FEDKT_CACHE/reuse/distill). Rows equal those of a "
        "run with reuse: false, but for timings (train_saved_seconds, distill_saved_seconds)."))
    peft: Literal["lora", "prefix", "full", "none"] = Field("lora", description=(
        "What trains: a LoRA adapter, a prefix (prefix tuning), every weight (full), or nothing "
        "(none: a frozen model)."))
    lora: LoraSettings = Field(default_factory=LoraSettings, description=(
        "LoRA's settings (with peft: lora)."))
    prefix_tokens: Tokens = Field(40, description=(
        "Prefix tuning: the number of virtual tokens (the prompt length)."))
    prefix_init: Literal["random", "text"] = Field("random", description=(
        "peft: prefix only. random: peft's random prefix; text: the model's own keys/values of "
        "the first prefix_tokens tokens of the public split (the same on server and clients), so "
        "the model starts as if that text preceded every input (FedSP: method.prompt_init)."))
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field("auto", description=(
        "Mixed precision of training, scoring and generation (torch.autocast; weights, adapters "
        "and optimiser state stay fp32). auto: bf16 on a CPU with native bf16 (AVX512-BF16/AMX) "
        "or a CUDA GPU that supports it, else fp32. fp16 needs CUDA (see fedkt/infra/precision.py)."))
    kd_micro_batch: BatchSize | None = Field(None, description=(
        "Choice-posterior distillation (method.knowledge: choices; FedMKT and FedCoLLM): run "
        "each batch_size batch as micro-batches of this many samples and accumulate their "
        "gradients into one optimiser step. The same loss and update (up to float rounding and "
        "dropout's draws), with the activations of this many samples instead of batch_size "
        "(docs/performance.md, memory). None: the whole batch at once."))
    gradient_checkpointing: bool = Field(False, description=(
        "Recompute each decoder layer's activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing, non-reentrant): activation memory of training "
        "falls from all layers' to about one layer's, for about a third more compute per step; "
        "the numbers stay the same (docs/performance.md, memory). Causal LMs only."))

    @model_validator(mode="after")
    def _checkpointing_fits_peft(self) -> TrainingConfig:
        if self.gradient_checkpointing and self.peft == "prefix":
            raise ValueError("gradient_checkpointing: prefix tuning passes its virtual tokens "
                             "as a key/value cache, which transformers drops under gradient "
                             "checkpointing; use peft: lora, or turn it off")
        return self

    @property
    def prefix_from_text(self) -> bool:
        """Prefix tuning that starts from text (``peft: prefix``, ``prefix_init: text``)."""
        return self.peft == "prefix" and self.prefix_init == "text"


class ClientsConfig(_Strict):
    num_clients: Clients = Field(4, description=(
        "How many clients the private data is split among."))
    models: list[ModelConfig] = Field(default_factory=list, description=(
        "One model for all clients, or one per client (heterogeneous settings)."))
    fraction: float = Field(1.0, gt=0, le=1, description=(
        "Share of the clients taking part in each round, sampled uniformly without replacement "
        "from (seed, round), at least one (FedAvg's C; 1.0: all)."))
    min_replies: Clients | None = Field(None, description=(
        "The round fails unless at least this many clients reply."))
    participants: list[int] | None = Field(None, description=(
        "Only these client ids take part (None: all); the data is still split num_clients ways, "
        "so each participant's private data is the same as in the full run."))

    @model_validator(mode="after")
    def _models_match(self) -> ClientsConfig:
        if len(self.models) not in (0, 1, self.num_clients):
            raise ValueError(
                f"'models' has {len(self.models)} entries; give 1 (shared by all clients) "
                f"or num_clients={self.num_clients} (one per client)"
            )
        if self.participants is not None:
            ids = self.participants
            bad = sorted({c for c in ids if not 0 <= c < self.num_clients})
            dup = sorted({c for c in ids if ids.count(c) > 1})
            if not ids or bad or dup:
                raise ValueError(
                    f"'participants' {ids} must list unique client ids in 0..{self.num_clients - 1} "
                    f"(num_clients={self.num_clients}); "
                    + (f"out of range: {bad}" if bad else f"repeated: {dup}" if dup else "empty")
                )
        return self

    def model_for(self, cid: int) -> ModelConfig:
        if not self.models:
            raise ConfigError("clients.models: this method needs a client model")
        return self.models[0] if len(self.models) == 1 else self.models[cid]
