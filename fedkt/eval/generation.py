"""Greedy generation (batched, left padding), cut at EOS and at stop strings.

Generation tasks are scored on these outputs with ROUGE-L
(:func:`fedkt.eval.evaluate.evaluate_causal_lm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedkt.eval.inputs import (
    _device,
    _encode,
    _inference,
    _pad,
    _pad_id,
    _special_prefix,
    _start_token,
)
from fedkt.infra import progress

__all__ = ["generate"]


def _cut(text: str, stop: Sequence[str]) -> str:
    """Drop leading whitespace, cut at the first stop string, strip."""
    text = text.lstrip()
    for s in stop:
        at = text.find(s)
        if at >= 0:
            text = text[:at]
    return text.strip()


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    ids: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for tok in (config_eos, tokenizer.eos_token_id):
        if isinstance(tok, int):
            ids.add(tok)
        elif isinstance(tok, list | tuple):
            ids.update(int(t) for t in tok)
    return sorted(ids)


def generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 48,
    batch_size: int = 8,
    *,
    max_length: int | None = None,
    stop: Sequence[str] = ("\n",),
) -> list[str]:
    """Greedy continuations of ``prompts`` (batched, left padding).

    Each continuation is cut at the first EOS token, then (after leading
    whitespace is dropped) at the first ``stop`` string, and stripped.  With
    ``max_length``, prompts keep their last ``max_length - max_new_tokens``
    tokens.
    """
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    prefix = _special_prefix(tokenizer)
    encoded = [(prefix + _encode(tokenizer, p)) or _start_token(tokenizer) for p in prompts]
    if max_length is not None:
        keep = max(1, max_length - max_new_tokens)
        encoded = [seq[-keep:] for seq in encoded]
    eos = _eos_ids(model, tokenizer)
    pad_id = _pad_id(tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
        pad_token_id=pad_id, eos_token_id=eos or None,
    )

    class _StopStrings(StoppingCriteria):
        def __init__(self, width: int) -> None:
            self.width = width

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            done = [any(s in tokenizer.decode(row[self.width :], skip_special_tokens=True)
                        .lstrip() for s in stop) for row in input_ids.tolist()]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    outputs: list[str] = [""] * len(encoded)
    device = _device(model)
    with _inference(model), progress.bar(len(order), "generate") as shown:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            shown.update(len(idx))
            ids, mask = _pad([encoded[i] for i in idx], pad_id, "left")
            width = ids.shape[1]
            criteria = StoppingCriteriaList([_StopStrings(width)] if stop else [])
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 generation_config=config, stopping_criteria=criteria)
            for row, i in enumerate(idx):
                new = out[row, width:].tolist()
                cut = next((k for k, tok in enumerate(new) if tok in eos), len(new))
                text = tokenizer.decode(new[:cut], skip_special_tokens=True)
                outputs[i] = _cut(text, stop)
    return outputs
