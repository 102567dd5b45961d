"""FedSP's settings, and those of its baselines FedPrompt and FedPrompt-Single."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from fedkt.config.bounds import BatchSize, Layers, LearningRate, StepCount, Steps
from fedkt.config.method_schema import MethodConfig

if TYPE_CHECKING:
    from fedkt.config import RunConfig


class PromptMessengerConfig(MethodConfig):
    """Settings shared by FedSP, FedPrompt and FedPrompt-Single (defaults: the paper's and,
    where the paper is silent, the reference scripts').

    Local and server training use ``training.batch_size``; ``training.prefix_tokens``
    is the prompt length (40 in the paper); ``training.peft`` is ignored (always
    prefix tuning).
    """

    client_model: Literal["auxiliary", "llm"] = Field("auxiliary", description=(
        "\"auxiliary\": FedSP's cut model; \"llm\": clients hold the whole LLM (FedPrompt)."))
    aux_layers: Layers = Field(1, description=(
        "N: the auxiliary model's real layers, copied from the LLM (layer_position says which)."))
    layer_position: Literal["bot", "mid", "top"] = Field("bot", description=(
        "Where the auxiliary model's layers come from in the LLM: its bottom, middle or top "
        "layers."))
    cross_layer_sharing: bool = Field(True, description=(
        "N layers run L times (virtual depth L); off: depth N, prefixes of those layers only."))
    distill: bool = Field(True, description=(
        "Eq. 2 before round 1: distil the auxiliary model from the LLM (the paper: 5,000 steps at "
        "lr 5e-4 on the server's data)."))
    kd_steps: StepCount = Field(5000, description=(
        "Optimiser steps of Eq. 2's distillation of the auxiliary model."))
    kd_lr: LearningRate = Field(5e-4, description="Learning rate of Eq. 2's distillation.")
    kd_batch_size: BatchSize | None = Field(None, description=(
        "Batch size of Eq. 2's distillation (None: training.batch_size)."))
    kd_map: Literal["learned", "identity"] = Field("learned", description=(
        "W_S of Eq. 2: learned (paper), or the identity (the reference code's plain MSE, which "
        "makes the auxiliary model's own last hidden states, the ones its head reads, match)."))
    kd_cache: bool = Field(True, description=(
        "Keep the distilled auxiliary model in the fedkt cache, keyed by everything that "
        "determines it (LLM weights, spec, data, settings), so runs that share it skip Eq. 2."))
    alternating: bool = Field(True, description=(
        "Client: (i) align the auxiliary model with frozen prompts, then (ii) train the prompts."))
    align_steps: Steps = Field(10, description=(
        "Client phase (i): steps aligning the auxiliary model with the prompts frozen."))
    prompt_steps: Steps = Field(10, description=(
        "Client phase (ii): steps training the prompts."))
    align_lr: LearningRate | None = Field(5e-4, description=(
        "Learning rate of client phase (i), aligning the auxiliary model (None: training.lr; "
        "FedSP's reference script: 5e-4)."))
    prompt_lr: LearningRate | None = Field(5e-4, description=(
        "Learning rate of client phase (ii), the prompts (None: training.lr); the defaults are "
        "the reference scripts' (FedSP 5e-4, FedPrompt-Single 5e-3, FedPrompt 5e-2)."))
    server_prompt_steps: StepCount = Field(10, description=(
        "Server: further optimisation of the aggregated prompts in the LLM on its own data (Sec. "
        "3.2; the reference's MAKE_GLOBAL_TRAIN). server_prompt_lr None: prompt_lr."))
    server_prompt_lr: LearningRate | None = Field(None, description=(
        "Learning rate of the server's prompt steps (None: prompt_lr)."))
    optimizer: Literal["paper", "training"] = Field("paper", description=(
        'Optimiser of every stage (client align, client prompts, server prompts): "paper" (Sec. '
        "4.3: AdamW, betas (0.9, 0.999), weight decay 0.01, warm-up over 0.1 of the run's steps "
        "then linear decay; one optimiser per client and stage, its state kept across rounds, the "
        "clients' on their disk); \"training\": training.betas / weight_decay / warmup_ratio, a "
        "fresh AdamW for every phase."))
    prompt_transfer: Literal["repeat", "slots"] = Field("repeat", description=(
        "Prompts of a cut without sharing (depth N < L) to and from the LLM's: \"repeat\" (the "
        "reference's merge_param_dict: upload tiled across the L layers, download the mean of the "
        'L/N blocks) or "slots" (only the prefixes of the layers the cut came from).'))
    server_only: bool = Field(False, description=(
        "Control: the server trains the prompts on its own data alone, the clients take no part."))
    trainable: Literal["layers", "all"] = Field("layers", description=(
        "Auxiliary weights that KD and phase (i) update: the N layers + final norm, or also the "
        "embeddings/head (the reference trains everything; costly for a 49k vocabulary)."))
    prompt_init: Literal["random", "text"] = Field("random", description=(
        "Initial prompts: peft's random prefix (paper) or the LLM's keys/values of server text."))
    weighted: bool = Field(True, description=(
        "Eq. 1: weight each client's prompts by its number of examples (else equal weights)."))
    eval_aux: bool = Field(False, description=(
        "Also score the server's auxiliary model with the prompts (``aux_*`` test metrics)."))

    renamed: ClassVar[dict[str, str]] = {"server_lr": "server_prompt_lr"}

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
    align_lr: LearningRate | None = Field(None)
    prompt_lr: LearningRate | None = Field(5e-2)


class FedPromptSingleConfig(PromptMessengerConfig):
    """A 1-layer model (no sharing, no KD, no alternation); its one-layer prompts are
    repeated across the LLM's layers on upload and averaged on download (the reference)."""

    name: Literal["fedprompt_single"] = "fedprompt_single"
    aux_layers: Layers = Field(1)
    cross_layer_sharing: bool = False
    distill: bool = False
    alternating: bool = False
    align_lr: LearningRate | None = Field(None)
    prompt_lr: LearningRate | None = Field(5e-3)


def check_config(cfg: RunConfig) -> None:
    """The server holds the LLM; the clients' model derives from it."""
    name = cfg.method.name
    if cfg.server is None:
        raise ValueError(f"server: {name} needs the server's LLM (server: {{name: ...}})")
    if not cfg.data.public_labels:
        raise ValueError(f"data.public_labels is false, but {name}'s server trains its prompts "
                         "on the public split's labelled pairs (the server's data)")
    if cfg.clients.models:
        raise ValueError(f"clients.models: {name} derives the clients' model from the "
                         "server's LLM; leave clients.models empty")
    if cfg.training.gradient_checkpointing:
        raise ValueError(f"training.gradient_checkpointing: {name} trains prefixes (virtual "
                         "keys/values passed as a cache), which transformers drops under "
                         "gradient checkpointing; turn it off")
