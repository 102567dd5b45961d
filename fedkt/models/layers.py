"""Keep the first N transformer layers of a model (encoders and decoders alike).

Used for FedKD's students (:func:`fedkt.models.truncate_encoder`) and for
``ModelConfig.num_layers``, which prunes any loaded causal LM to its first N decoder
layers (a cheaper model derived from a pretrained one; pruned, not retrained).
"""

from __future__ import annotations

from torch import nn

from fedkt.models.offline import ModelError

__all__ = ["keep_first_layers", "layer_list"]

_LAYER_LIST_NAMES = ("layer", "layers", "h", "block", "blocks")
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# Per-layer config lists that must stay as long as the layer list.
_PER_LAYER_KEYS = ("layer_types",)


def layer_list(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    """The (parent, attribute, ModuleList) holding the transformer blocks."""
    found: list[tuple[nn.Module, str, nn.ModuleList]] = []
    for _, parent in model.named_modules():
        for attr in _LAYER_LIST_NAMES:
            child = getattr(parent, attr, None)
            if isinstance(child, nn.ModuleList) and len(child) > 0:
                found.append((parent, attr, child))
    if not found:
        raise ModelError(f"cannot find the layer list of {type(model).__name__}")
    deepest = max(len(f[2]) for f in found)
    best = [f for f in found if len(f[2]) == deepest]
    if len({id(f[2]) for f in best}) > 1:
        raise ModelError(f"{type(model).__name__} has several layer lists; cannot truncate")
    return best[0]


def keep_first_layers(model: nn.Module, num_layers: int) -> nn.Module:
    """Drop every transformer layer after the first ``num_layers``, in place; returns ``model``.

    The embeddings, final norm and output head stay; the config reports the new depth
    (``num_hidden_layers`` or its architecture's name, and per-layer lists such as
    ``layer_types`` are cut to match).  Apply it before peft.
    """
    if hasattr(model, "peft_config"):
        raise ModelError("truncate the base model before applying peft")
    parent, attr, layers = layer_list(model)
    if not 1 <= num_layers <= len(layers):
        raise ModelError(
            f"num_layers must be between 1 and the model's {len(layers)} layers, got {num_layers}"
        )
    setattr(parent, attr, nn.ModuleList(list(layers)[:num_layers]))
    config = getattr(model, "config", None)
    if config is None:
        return model
    for key in _LAYER_COUNT_KEYS:
        if hasattr(config, key):
            setattr(config, key, num_layers)
            break
    for key in _PER_LAYER_KEYS:
        values = getattr(config, key, None)
        if isinstance(values, list) and len(values) > num_layers:
            setattr(config, key, values[:num_layers])
    return model
