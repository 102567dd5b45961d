"""FedCoLLM's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from fedkt.config.bounds import Epochs, LearningRate, Steps, Temperature, TopK, Weight
from fedkt.config.method_settings import AdapterAveragingConfig, ReceivingOptions, check_rehearsal

if TYPE_CHECKING:
    from fedkt.config import RunConfig


class FedCoLLMConfig(AdapterAveragingConfig):
    """FedCoLLM hyper-parameters.

    The paper fixes the update rule (Eq. 6, Algorithm 1) and the 1/K mean (line 13) but
    gives no lambda, temperature or R: those defaults are fedkt's (docs/methods/fedcollm.md,
    "Differences from the paper").  Local client training uses ``training.*`` as in FedAvg.
    """

    name: Literal["fedcollm"] = "fedcollm"
    weighted: bool = Field(False, description=(
        "Step 3: the paper's plain 1/K mean (true: weight each adapter by its example count)."))
    kd_weight: Weight = Field(1.0, description=(
        "lambda of Eqs. 4-5's L^f and L^g: the weight of each KD term (the fine-tuning loss has "
        "weight 1). The KL is a mean over the KD positions (FATE-LLM sums it over tokens)."))
    temperature: Temperature = Field(1.0, description=(
        "Softmax temperature of both KL terms, on both models' logits or choice posteriors (no "
        "T**2 factor; receiving.t_squared adds it)."))
    cotune_gradients: Literal["own", "joint"] = Field("own", description=(
        "\"own\": each adapter descends its own loss, the other model's output a detached target "
        '(the paper); "joint": one backward of L^f + L^g with nothing detached.'))
    cotune_epochs: Epochs = Field(1.0, description=(
        "Co-tuning on D_a per round: epochs over the public split, optionally capped at "
        "``cotune_max_steps`` optimiser steps (R)."))
    cotune_max_steps: Steps | None = Field(None, description=(
        "Cap on co-tuning's optimiser steps per round (R; None: cotune_epochs decides)."))
    llm_lr: LearningRate | None = Field(None, description=(
        "Learning rate of the LLM adapter omega in the server's co-tuning (None: training.lr)."))
    slm_lr: LearningRate | None = Field(None, description=(
        "Learning rate of the global SLM adapter theta in the server's co-tuning (None: "
        "training.lr)."))
    kd_positions: Literal["target", "all"] = Field("target", description=(
        'Positions the KL terms average over: the response tokens only ("target", like the task '
        'loss) or every non-padding position ("all"). The paper does not say (Eqs. 4-5 write '
        "E_x KL(f(x), g(x)) over D_a next to L_FT on the same samples, and nothing travels that "
        'would fix positions); "target" is FATE-LLM\'s FedCoLLM, which masks the KL to the '
        "labelled (response) tokens, and keeps L_FT and L_KD over the same tokens."))
    top_k: TopK = Field(128, description=(
        "Different tokenizers only: logits kept per position for the aligned KL."))
    ft_weight: Weight = Field(1.0, description=(
        "The weight of each fine-tuning loss L_FT^f, L_FT^g on D_a in L^f and L^g (the paper: 1). "
        "0 makes co-tuning KD only, in both directions (what an unlabelled D_a needs)."))
    knowledge: Literal["logits", "choices"] = Field("logits", description=(
        'What the two models compare on D_a: "logits", their next-token distributions along the '
        "prompt and its gold answer (the paper); \"choices\", their posteriors over the task's "
        "choices (fedkt.alignment.choices: an extension for classification and multiple-choice "
        "tasks that reads no label of D_a). With \"choices\" each model's posteriors are computed "
        "once per round, before co-tuning, and are the other's target."))
    teacher: Literal["real", "shuffled", "marginal", "self", "none"] = Field("real", description=(
        'The controls for transfer (extensions): "real" (the paper); "shuffled", each model\'s '
        "posteriors permuted across D_a's samples, afresh each round, before they are the "
        'other\'s target; "marginal", each model\'s mean posterior over D_a is the other\'s '
        'target on every sample; "self", each model distils towards its own posteriors (the '
        'same steps; nothing comes from the other model); "none", no exchange: step 4 '
        "(co-tuning) is skipped, the LLM's own-data epochs, FedAvg and evaluation as in every "
        "arm. shuffled, marginal and self need knowledge: choices."))
    llm_kd: bool = Field(True, description=(
        "False (an extension, for a control of LLM -> SLM whose LLM no claim reads; needs "
        "knowledge: choices): the LLM's side of co-tuning (L^f) is skipped, so the LLM is "
        "evaluated as after its own-data epochs, as under teacher: none. The SLM's steps are "
        "those of the same arm with it: its target is the LLM's posteriors from before "
        "co-tuning, and each side's distillation seeds its own randomness."))
    receiving: ReceivingOptions = Field(default_factory=ReceivingOptions, description=(
        "How each model takes in the other's posteriors while keeping its own (rehearsal, the "
        "LLM's only: the server holds no client data; anchoring, T**2, selective taking): "
        "extensions beyond the paper, each off by default (docs/methods/fedcollm.md, "
        "receiving-side options)."))

    renamed: ClassVar[dict[str, str]] = {"kd_lambda": "kd_weight", "lr_llm": "llm_lr",
                                         "lr_slm": "slm_lr"}

    @model_validator(mode="after")
    def _teacher_needs_choices(self) -> FedCoLLMConfig:
        if self.teacher not in ("real", "none") and self.knowledge != "choices":
            raise ValueError(f"teacher: {self.teacher!r} permutes or replaces each sample's "
                             "knowledge, which needs knowledge: choices")
        if not self.llm_kd and self.knowledge != "choices":
            raise ValueError("llm_kd: false skips the LLM's side of co-tuning, which needs "
                             "knowledge: choices (with logits both sides descend one loss, "
                             "Eq. 6)")
        self.receiving.check(self.knowledge, self.teacher)
        return self


def check_config(cfg: RunConfig) -> None:
    """Refuse every path that would read a gold label of D_a when ``data.public_labels``
    is false (the label-free setting, an extension)."""
    m = cfg.method
    check_rehearsal(cfg, llm_receives=True)
    if cfg.data.public_labels:
        return
    reasons = []
    if m.ft_weight > 0:
        reasons.append(f"method.ft_weight is {m.ft_weight}: L_FT on D_a (Eqs. 4-5) reads its "
                       "labels; set ft_weight: 0 (co-tuning is then KD only, both ways)")
    if m.knowledge == "logits":
        reasons.append("method.knowledge is 'logits': the KL terms compare distributions "
                       "teacher-forced on the gold answer; set knowledge: choices")
    if reasons:
        raise ValueError("data.public_labels is false, so no gold label of D_a may be read: "
                         + "; ".join(reasons))
