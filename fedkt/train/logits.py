"""A causal LM's output layer, run only at the positions a loss reads.

A training batch of short SNIPS-style samples scores a handful of answer tokens out of
some thirty positions, and the output layer (SmolLM2: 49,152 x 576) costs as much per
position as eight decoder layers, forward and backward. ``forward_kept`` asks the model
for the logits of the batch's *kept* positions only, through the ``logits_to_keep``
argument of Hugging Face causal LMs (the model's own output processing, e.g. Gemma-3's
logit soft-capping, is kept), and computes the task loss from them: the same cross-
entropy, mean over the target tokens, that the model computes from ``labels`` over every
position. The values agree to float rounding (the output layer's matrix product runs on
fewer rows); :func:`keeps_positions` says where it applies.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedkt.data.lm_batches import IGNORE_INDEX


def keeps_positions(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` and its logits line up with its
    input positions (no virtual tokens put before them: a LoRA adapter, full training or
    none; a prefix or prompt adapter is left to the model's own forward)."""
    peft_config = getattr(model, "peft_config", None)
    if peft_config and any(getattr(c, "is_prompt_learning", False)
                           for c in peft_config.values()):
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def kept_positions(mask: Tensor) -> Tensor:
    """Positions ``t`` (1-d, ascending) where any row of the ``[B, L]`` bool ``mask`` is set."""
    return mask.any(dim=0).nonzero().squeeze(1)


def target_mask(labels: Tensor) -> Tensor:
    """``[B, L]`` bool: the logits at ``t`` predict a target token (``labels[:, t + 1]``)."""
    mask = torch.zeros_like(labels, dtype=torch.bool)
    mask[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    return mask


def forward_kept(model: torch.nn.Module, batch: dict[str, Tensor], keep: Tensor
                 ) -> tuple[Any, Tensor]:
    """Run ``model`` on ``batch`` with logits at positions ``keep`` only: (the output, its
    ``[B, len(keep), V]`` logits) and, as ``output.loss``, the task cross-entropy (mean
    over the target tokens that fall at kept positions) when ``batch`` has labels."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    out = model(**inputs, logits_to_keep=keep)
    labels = batch.get("labels")
    if labels is not None:
        shifted = torch.full_like(labels, IGNORE_INDEX)
        shifted[:, :-1] = labels[:, 1:]
        logits = out.logits.float()
        out.loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   shifted[:, keep].reshape(-1), ignore_index=IGNORE_INDEX)
    return out, out.logits
