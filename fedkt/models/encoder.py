"""BERT-style encoders with a classification head (FedKD's teacher and student).

``ModelConfig.name`` may be ``tiny-bert`` (built from ``BertConfig`` with a WordPiece
tokenizer trained on the project's corpus), the offline alias ``all-minilm-l6-v2``,
a local folder, or a hub id.  :func:`truncate_encoder` makes a shallower copy
(embeddings plus the first N layers), FedKD's usual way to start a student.
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from fedkt.config import ModelConfig
from fedkt.models.causal_lm import _hub_error, _local, torch_dtype
from fedkt.models.layers import keep_first_layers
from fedkt.models.offline import OFFLINE_ALIASES, ModelError, is_offline_alias, resolve_offline
from fedkt.models.tiny import resolve_overrides, seeded
from fedkt.models.tokenizers import ensure_pad_token, load_tiny_tokenizer

__all__ = ["load_encoder_classifier", "truncate_encoder"]


def _tiny_bert(
    cfg: ModelConfig, num_labels: int, seed: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    sizes, extras = resolve_overrides("tiny-bert", cfg.tiny, BertConfig, gqa=False)
    tokenizer = load_tiny_tokenizer("tiny-bert", cfg.tiny.get("vocab_size"), sizes["max_positions"])
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes["hidden_size"],
        num_hidden_layers=sizes["num_layers"],
        num_attention_heads=sizes["num_heads"],
        intermediate_size=sizes["intermediate_size"],
        max_position_embeddings=sizes["max_positions"],
        pad_token_id=tokenizer.pad_token_id,
        num_labels=num_labels,
        **extras,
    )
    with seeded(seed):
        model = BertForSequenceClassification(config)
    return model, tokenizer


def load_encoder_classifier(
    cfg: ModelConfig, num_labels: int, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """An encoder with a fresh ``num_labels``-way classification head, and its tokenizer.

    ``seed`` sets the head (and, for ``tiny-bert``, every weight).
    """
    if num_labels < 1:
        raise ModelError(f"num_labels must be at least 1, got {num_labels}")
    name = cfg.name
    dtype = torch_dtype(cfg.dtype)
    if name.lower().startswith("tiny-"):
        if name.lower() != "tiny-bert":
            raise ModelError(f"unknown encoder preset {name!r}; the encoder preset is 'tiny-bert'")
        model, tokenizer = _tiny_bert(cfg, num_labels, seed)
        model.to(dtype)
        return model.eval(), tokenizer
    kwargs: dict[str, Any] = {"num_labels": num_labels, "dtype": dtype}
    trust = cfg.trust_remote_code
    if is_offline_alias(name):
        alias = OFFLINE_ALIASES[name.lower()]
        if alias.kind != "encoder":
            raise ModelError(
                f"offline alias {name!r} is not an encoder; encoder aliases: "
                + ", ".join(a.name for a in OFFLINE_ALIASES.values() if a.kind == "encoder")
            )
        source, revision = str(resolve_offline(name).path), None
    else:
        local = _local(name)
        source, revision = (str(local), None) if local is not None else (name, cfg.revision)
    try:
        with seeded(seed):
            model = AutoModelForSequenceClassification.from_pretrained(
                source, revision=revision, trust_remote_code=trust, **kwargs
            )
        tokenizer = AutoTokenizer.from_pretrained(
            source, revision=revision, trust_remote_code=trust
        )
    except (OSError, ValueError) as exc:
        if source != name:
            raise
        raise _hub_error(name, exc) from exc
    ensure_pad_token(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def truncate_encoder(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A copy of ``model`` keeping its embeddings, its first ``num_layers`` layers and its head.

    ``model`` itself is unchanged; the copy's config reports the new depth.
    """
    if hasattr(model, "peft_config"):
        raise ModelError("truncate the base model before applying peft")
    return keep_first_layers(copy.deepcopy(model), num_layers)
