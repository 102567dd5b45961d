"""Parameter-efficient fine-tuning helpers (LoRA, prefix tuning) through ``peft``.

:func:`apply_peft` makes a model trainable the way ``TrainingConfig.peft`` says:

``lora``    LoRA adapters (``TrainingConfig.lora``); ``target_modules: null`` picks the
            architecture's usual attention projections (GPT-2 ``c_attn``, BLOOM
            ``query_key_value``, Llama/OPT/Qwen2 ``q_proj``/``v_proj``, BERT
            ``query``/``value``).
``prefix``  prefix tuning with ``prefix_tokens`` virtual tokens per layer (works with
            grouped-query attention: the prefix has the model's key/value heads);
            ``prefix_init: text`` starts it from :func:`text_prefix` of a given text.
``full``    every parameter trainable.
``none``    nothing trainable (a frozen model, e.g. a teacher).

What a client sends is :func:`adapter_state`: the trainable parameters only, under
names that do not depend on peft's adapter name, as CPU tensors.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch
from peft import LoraConfig, PeftModel, PrefixTuningConfig, TaskType, get_peft_model
from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from safetensors.torch import load_file, save_file
from torch import nn

from fedkt.config import ConfigError, TrainingConfig
from fedkt.models.kv_cache import returned_cache
from fedkt.models.offline import ModelError
from fedkt.models.tiny import seeded

__all__ = [
    "PREFIX_KEY",
    "LoadResult",
    "adapter_state",
    "apply_peft",
    "count_parameters",
    "default_lora_targets",
    "enable_gradient_checkpointing",
    "load_adapter",
    "load_adapter_state",
    "save_adapter",
    "set_prefix",
    "text_prefix",
]

PREFIX_KEY = "prompt_encoder.embedding.weight"  # peft's prefix embedding, adapter name dropped

# Looked for, in this order, when peft has no default for an architecture.
_FALLBACK_TARGETS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "v_proj"),
    ("query", "value"),
    ("c_attn",),
    ("query_key_value",),
    ("qkv_proj",),
    ("Wqkv",),
)


def _task_type(model: nn.Module) -> TaskType | None:
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return TaskType.CAUSAL_LM
    if name.endswith("ForSequenceClassification"):
        return TaskType.SEQ_CLS
    if name.endswith("ForTokenClassification"):
        return TaskType.TOKEN_CLS
    return None


def default_lora_targets(model: nn.Module) -> list[str]:
    """LoRA target module names for ``model``: peft's default for its type, else a search."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    if targets:
        return list(targets)
    leaves = {
        name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)
    }
    for group in _FALLBACK_TARGETS:
        if all(t in leaves for t in group):
            return list(group)
    raise ModelError(
        f"no default LoRA target modules for model type {model_type!r}; set "
        "training.lora.target_modules (e.g. the attention projections' names)"
    )


def apply_peft(model: nn.Module, training_cfg: TrainingConfig, seed: int = 0, *,
               prefix_text: str | None = None, tokenizer: Any = None) -> nn.Module:
    """Make ``model`` trainable as ``training_cfg.peft`` says; returns the model to train.

    ``lora``/``prefix`` wrap ``model`` in a peft model (LoRA layers are injected into
    ``model`` itself); ``full``/``none`` return ``model`` with every parameter
    trainable / frozen.  Adapter weights come from ``seed``: the same seed gives the
    same initial adapter.  With ``peft: prefix`` and ``prefix_init: text`` the prefix
    is :func:`text_prefix` of ``prefix_text`` (tokenised by ``tokenizer``), both then
    required; ``prefix_init`` is ignored for the other kinds.
    """
    kind = training_cfg.peft
    if kind in ("full", "none"):
        for p in model.parameters():
            p.requires_grad_(kind == "full")
        return model
    task = _task_type(model)
    if kind == "lora":
        lora = training_cfg.lora
        targets = (
            lora.target_modules if lora.target_modules is not None else default_lora_targets(model)
        )
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=targets,
            modules_to_save=lora.modules_to_save,
            bias="none",
            task_type=task,
            # GPT-2 keeps its projections in transposed Conv1D layers.
            fan_in_fan_out=getattr(getattr(model, "config", None), "model_type", None) == "gpt2",
        )
    elif kind == "prefix":
        if task is None:
            raise ModelError(
                f"prefix tuning needs a causal LM or a classifier; got {type(model).__name__}"
            )
        config = PrefixTuningConfig(task_type=task, num_virtual_tokens=training_cfg.prefix_tokens)
    else:  # pragma: no cover - the config's Literal already rejects other values
        raise ModelError(f"unknown peft kind {kind!r}; allowed: lora, prefix, full, none")
    with seeded(seed), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as exc:
            raise ModelError(f"cannot apply {kind} to {type(model).__name__}: {exc}") from exc
    if training_cfg.prefix_from_text:
        if prefix_text is None or tokenizer is None:
            raise ConfigError("training.prefix_init: 'text' needs the text to start from; this "
                              "caller gives none (use prefix_init: random)")
        if task != TaskType.CAUSAL_LM:
            raise ConfigError(f"training.prefix_init: 'text' needs a causal LM; got "
                              f"{type(model).__name__}")
        set_prefix(peft_model, text_prefix(peft_model, tokenizer, prefix_text,
                                           training_cfg.prefix_tokens))
    return peft_model


def enable_gradient_checkpointing(model: nn.Module) -> nn.Module:
    """Turn on transformers' (non-reentrant) gradient checkpointing of ``model``'s layers,
    peft-wrapped or not; returns ``model``.

    Non-reentrant checkpointing needs no input that requires grad, so a LoRA or prefix on
    frozen embeddings trains as without it; only training forwards recompute (evaluation
    runs under ``no_grad``).  A model without support is a :class:`ModelError`.
    """
    if getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False):
        raise ModelError("training.gradient_checkpointing: prefix/prompt tuning passes its "
                         "virtual tokens as a cache, which gradient checkpointing drops")
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ModelError(f"training.gradient_checkpointing: {type(base).__name__} does not "
                         "support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    enable = getattr(base, "activation_checkpointing_enable", None)  # transformers >= 5.x
    if callable(enable):
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


# --------------------------------------------------------------------------- prefix


def prefix_param(model: nn.Module) -> nn.Parameter:
    """The prefix embedding ``[num_virtual_tokens, depth * 2 * kv_dim]`` of a peft model."""
    try:
        return model.prompt_encoder[model.active_adapter].embedding.weight
    except (AttributeError, KeyError, TypeError):
        raise ModelError(f"{type(model).__name__} has no peft prefix-tuning prefix") from None


def set_prefix(model: nn.Module, prefix: torch.Tensor) -> None:
    """Copy ``prefix`` (``[num_virtual_tokens, depth * 2 * kv_dim]``) into a peft prefix model."""
    param = prefix_param(model)
    if tuple(prefix.shape) != tuple(param.shape):
        raise ValueError(f"prefix of shape {tuple(prefix.shape)}, the model's is "
                         f"{tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(prefix.to(device=param.device, dtype=param.dtype))


def text_prefix(model: nn.Module, tokenizer: Any, text: str, tokens: int) -> torch.Tensor:
    """A prefix equal to the model's keys/values of the first ``tokens`` tokens of ``text``.

    With it, the model's output on any input is what it would be with that text in
    front (positions continue after the prefix); a text shorter than ``tokens`` tokens
    is repeated.  ``model``: a causal LM, peft-wrapped or not (the base model computes
    the keys/values).  Layout: peft's ``[T, L, 2 (key, value), kv_heads, head_dim]``
    flattened to ``[T, L * 2 * kv_dim]``, on the CPU.
    """
    ids = list(tokenizer(text[: 32 * tokens])["input_ids"])  # plenty: T tokens are needed
    if not ids:
        raise ValueError("prefix from text: the text gives no tokens")
    ids = (ids * math.ceil(tokens / len(ids)))[:tokens]
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    device = next(base.parameters()).device
    with torch.no_grad():
        cache = returned_cache(base(input_ids=torch.tensor([ids], device=device), use_cache=True))
    layers = [torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers]
    kv = torch.stack(layers)  # [L, 2, kv_heads, T, head_dim]
    return kv.permute(3, 0, 1, 2, 4).reshape(tokens, -1).to("cpu").clone()


# --------------------------------------------------------------------------- state


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters under names without peft's adapter name."""
    adapters = (
        set(getattr(model, "peft_config", None) or {}) if isinstance(model, PeftModel) else set()
    )
    out: dict[str, nn.Parameter] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        key = ".".join(part for part in name.split(".") if part not in adapters)
        if key in out:
            raise ModelError(f"two trainable parameters map to the adapter key {key!r}")
        out[key] = param
    return out


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters of ``model`` as CPU contiguous copies, stable key names."""
    return {k: p.detach().to("cpu").clone().contiguous() for k, p in _trainable(model).items()}


class LoadResult(NamedTuple):
    """Keys of a non-strict :func:`load_adapter_state` that did not match."""

    missing: list[str]
    unexpected: list[str]


def _listing(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


def load_adapter_state(
    model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True
) -> LoadResult:
    """Copy ``state`` (from :func:`adapter_state`) into ``model``'s trainable parameters.

    ``strict``: every trainable parameter must be given and nothing else.  A shape
    mismatch is always an error.  Nothing is copied when an error is raised.
    """
    params = _trainable(model)
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing keys: {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_listing(unexpected)}")
        raise ModelError("adapter state does not match the model; " + "; ".join(parts))
    for key in sorted(set(params) & set(state)):
        if tuple(state[key].shape) != tuple(params[key].shape):
            raise ModelError(
                f"adapter key {key!r}: shape {tuple(state[key].shape)} does not match the "
                f"model's {tuple(params[key].shape)}"
            )
    with torch.no_grad():
        for key in set(params) & set(state):
            params[key].copy_(state[key].to(device=params[key].device, dtype=params[key].dtype))
    return LoadResult(missing, unexpected)


def save_adapter(
    path: str | Path, state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> Path:
    """Write an adapter state to a safetensors file (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt", "fedkt": "adapter", **(metadata or {})})
    return path


def load_adapter(path: str | Path) -> dict[str, torch.Tensor]:
    """Read an adapter state written by :func:`save_adapter`."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"adapter file not found: {path}")
    return load_file(str(path))


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; shared (tied) parameters count once."""
    trainable = total = 0
    for param in model.parameters():
        total += param.numel()
        if param.requires_grad:
            trainable += param.numel()
    return trainable, total
