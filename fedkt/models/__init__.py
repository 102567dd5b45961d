"""Models: tiny presets, offline aliases, hub/local/GGUF loading, PEFT helpers, encoders.

See ``docs/models.md``.  The usual entry points::

    from fedkt.models import load_causal_lm, apply_peft, adapter_state

    model, tokenizer = load_causal_lm(ModelConfig(name="tiny-llama"), seed=0)
    model = apply_peft(model, TrainingConfig(peft="lora"), seed=0)
    state = adapter_state(model)        # what a client sends
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

from fedkt.infra.lazy import lazy_exports

# Names are imported on first use, so that ``import fedkt.models.tokenizers`` (say)
# does not pay for importing peft and every model class.
_EXPORTS: dict[str, str] = {
    "LoadResult": "adapters",
    "adapter_state": "adapters",
    "apply_peft": "adapters",
    "count_parameters": "adapters",
    "default_lora_targets": "adapters",
    "load_adapter": "adapters",
    "load_adapter_state": "adapters",
    "save_adapter": "adapters",
    "gguf_float_dir": "causal_lm",
    "load_causal_lm": "causal_lm",
    "load_tokenizer": "causal_lm",
    "torch_dtype": "causal_lm",
    "load_encoder_classifier": "encoder",
    "truncate_encoder": "encoder",
    "OFFLINE_ALIASES": "offline",
    "ModelError": "offline",
    "cache_dir": "offline",
    "is_offline_alias": "offline",
    "resolve_offline": "offline",
    "TINY_PRESETS": "tiny",
    "build_tiny_causal_lm": "tiny",
    "is_tiny_preset": "tiny",
    "seeded": "tiny",
    "TINY_TOKENIZERS": "tokenizers",
    "corpus_texts": "tokenizers",
    "ensure_pad_token": "tokenizers",
    "load_tiny_tokenizer": "tokenizers",
}

if TYPE_CHECKING:
    from fedkt.models.adapters import (
        LoadResult,
        adapter_state,
        apply_peft,
        count_parameters,
        default_lora_targets,
        load_adapter,
        load_adapter_state,
        save_adapter,
    )
    from fedkt.models.causal_lm import gguf_float_dir, load_causal_lm, load_tokenizer, torch_dtype
    from fedkt.models.encoder import load_encoder_classifier, truncate_encoder
    from fedkt.models.offline import (
        OFFLINE_ALIASES,
        ModelError,
        cache_dir,
        is_offline_alias,
        resolve_offline,
    )
    from fedkt.models.tiny import TINY_PRESETS, build_tiny_causal_lm, is_tiny_preset, seeded
    from fedkt.models.tokenizers import (
        TINY_TOKENIZERS,
        corpus_texts,
        ensure_pad_token,
        load_tiny_tokenizer,
    )


def tiny_preset_names() -> list[str]:
    """The tiny presets' names (the keys of ``TINY_PRESETS``), read from the
    ``TinyPreset("name", ...)`` calls of tiny.py without importing it (it imports torch)."""
    tree = ast.parse((Path(__file__).parent / "tiny.py").read_text(encoding="utf-8"))
    return sorted(node.args[0].value for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "TinyPreset" and node.args
                  and isinstance(node.args[0], ast.Constant))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "OFFLINE_ALIASES",
    "TINY_PRESETS",
    "TINY_TOKENIZERS",
    "LoadResult",
    "ModelError",
    "adapter_state",
    "apply_peft",
    "build_tiny_causal_lm",
    "cache_dir",
    "corpus_texts",
    "count_parameters",
    "default_lora_targets",
    "ensure_pad_token",
    "gguf_float_dir",
    "is_offline_alias",
    "is_tiny_preset",
    "load_adapter",
    "load_adapter_state",
    "load_causal_lm",
    "load_encoder_classifier",
    "load_tiny_tokenizer",
    "load_tokenizer",
    "resolve_offline",
    "save_adapter",
    "seeded",
    "tiny_preset_names",
    "torch_dtype",
    "truncate_encoder",
]
