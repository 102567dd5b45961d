"""FedCoLLM's settings."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedkt.methods.fedavg import AdapterAveragingConfig


class FedCoLLMConfig(AdapterAveragingConfig):
    """FedCoLLM hyper-parameters.

    The paper fixes the update rule (Eq. 6, Algorithm 1) and the 1/K mean (line 13) but
    gives no lambda, temperature or R: those defaults are fedkt's (docs/methods/fedcollm.md,
    "Differences from the paper").  Local client training uses ``training.*`` as in FedAvg.
    """

    name: Literal["fedcollm"] = "fedcollm"
    # Step 3: the paper's plain 1/K mean (true: weight each adapter by its example count).
    weighted: bool = False
    # lambda of Eqs. 4-5's L^f and L^g: the weight of each KD term (the fine-tuning loss has
    # weight 1).  The KL is a mean over the KD positions (FATE-LLM sums it over tokens).
    kd_weight: float = Field(1.0, ge=0)
    # Softmax temperature of both KL terms (no T**2 factor).
    temperature: float = Field(1.0, gt=0)
    # "own": each adapter descends its own loss, the other model's output a detached target
    # (the paper); "joint": one backward of L^f + L^g with nothing detached.
    cotune_gradients: Literal["own", "joint"] = "own"
    # Co-tuning on D_a per round: epochs over the public split, optionally capped at
    # ``cotune_max_steps`` optimiser steps (R).
    cotune_epochs: float = Field(1.0, gt=0)
    cotune_max_steps: int | None = Field(None, ge=1)
    # Learning rates of the LLM adapter omega and of the global SLM adapter theta on the
    # server (None: ``training.lr``).
    llm_lr: float | None = Field(None, gt=0)
    slm_lr: float | None = Field(None, gt=0)
    # Positions the KL terms average over: the response tokens only ("target", like the
    # task loss) or every non-padding position ("all").
    kd_positions: Literal["target", "all"] = "target"
    # Different tokenizers only: logits kept per position for the aligned KL.
    top_k: int = Field(128, ge=1)

    renamed: ClassVar[dict[str, str]] = {"kd_lambda": "kd_weight", "lr_llm": "llm_lr",
                                         "lr_slm": "slm_lr"}
