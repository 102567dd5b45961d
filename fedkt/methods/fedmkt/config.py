"""FedMKT's settings, and those of its LLM2SLM baseline."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from fedkt.config import MethodConfig


class FedMKTConfig(MethodConfig):
    """FedMKT hyper-parameters.

    Paper defaults live in ``training`` (LoRA r=8, alpha=16, dropout 0.05; AdamW betas
    (0.9, 0.95), weight decay 0.1, warm-up 0.008, max grad norm 1.0, batch 4, one local
    epoch); the method's own are below.
    """

    name: Literal["fedmkt"] = "fedmkt"
    # lambda of Eqs. 9-10: the weight of the fine-tuning loss L_FT; L_KD gets 1 - lambda.
    ft_weight: float = Field(0.9, ge=0.0, le=1.0)
    # Logits kept per position in S_k and S_0 (FATE-LLM's top_k_logits_keep).
    top_k: int = Field(128, ge=1)
    # Softmax temperature of L_KD (no T**2 factor).
    temperature: float = Field(1.0, gt=0)
    # Passes over D_p per round: the server's step 5 and each client's step 7.
    server_kd_epochs: float = Field(1.0, gt=0)
    client_kd_epochs: float = Field(1.0, gt=0)
    # Learning rate of step 7 only (None: the client model's, clients.models[i].lr, else
    # training.lr).  The LLM's rate is server.lr (D.1), the SLMs' clients.models[i].lr.
    client_kd_lr: float | None = Field(None, gt=0)
    # False: LLM2SLM, the LLM is frozen and only transfers knowledge to the SLMs.
    llm_training: bool = True
    # Per-sample loss DualMinCE compares: mean CE over the target tokens ("mean", as the
    # paper and FATE-LLM) or their sum, the negative log-likelihood of the target text,
    # which does not depend on how finely a tokenizer cuts it ("sum").
    selection_loss: Literal["mean", "sum"] = "mean"
    # Where no other model beats this model's own loss: leave the sample out of L_KD
    # (False: Algorithm 2, S~ holds only samples where the other model's loss is lower) or
    # distil towards the model's own top-K (True: FATE-LLM's choice, an extension).
    fallback_to_own: bool = False
    # A position of a selected sample with no aligned teacher position gets a one-hot
    # target on the ground-truth next token ("one_hot", Appendix B 3(d)), the model's own
    # top-K ("own", an extension) or no distillation ("skip").
    unaligned: Literal["one_hot", "own", "skip"] = "one_hot"
    # Positions L_KD covers: every position that predicts a real token ("all", the paper)
    # or only those predicting target tokens ("target", like L_FT).
    kd_positions: Literal["all", "target"] = "all"
    # Homogeneous setting only: FedAvg of the client adapters after step 7.
    post_fedavg: bool = False

    renamed: ClassVar[dict[str, str]] = {"lam": "ft_weight"}

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, values: Any) -> Any:
        if isinstance(values, dict) and "server_lr" in values:
            raise ValueError("server_lr: the LLM's learning rate is now server.lr (a learning "
                             "rate per model, FedMKT D.1); remove method.server_lr")
        return values


class LLM2SLMConfig(FedMKTConfig):
    """The LLM2SLM baseline: FedMKT with the server LLM frozen (only LLM -> SLM)."""

    name: Literal["llm2slm"] = "llm2slm"  # type: ignore[assignment]
    llm_training: bool = False
