"""BERT-style encoders with a classification head (FedKD's teacher and student).

``ModelConfig.name`` may be ``tiny-bert`` (built from ``BertConfig`` with a WordPiece
tokenizer trained on the project's corpus), the offline alias ``all-minilm-l6-v2``,
a local folder, or a hub id.  :func:`truncate_encoder` makes a shallower copy
(embeddings plus the first N layers), FedKD's usual way to start a student.

``pooling`` picks the classification head (:class:`PooledClassifier`): ``attention``,
the attentive pooling plus a dense layer of the FedKD paper (§4.1, SMM4H); ``mean``,
masked mean pooling plus a dense layer; ``cls``, the [CLS] state through the model's own
pooler and classifier (``BertForSequenceClassification``'s head).  A shallow encoder's
[CLS] state barely varies across inputs (all-MiniLM-L6-v2 at layer 2: relative std
0.3%), so its ``cls`` head sees nearly constant features; pooled token states do vary.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from torch import Tensor, nn
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from fedkt.config import ModelConfig
from fedkt.models.causal_lm import _hub_error, _local, torch_dtype
from fedkt.models.layers import keep_first_layers
from fedkt.models.offline import OFFLINE_ALIASES, ModelError, is_offline_alias, resolve_offline
from fedkt.models.tiny import resolve_overrides, seeded
from fedkt.models.tokenizers import ensure_pad_token, load_tiny_tokenizer

__all__ = [
    "ATTENTION_MAPS",
    "POOLINGS",
    "AttentivePooling",
    "PooledClassifier",
    "load_encoder_classifier",
    "truncate_encoder",
]

Pooling = Literal["attention", "mean", "cls"]
POOLINGS: tuple[str, ...] = ("attention", "mean", "cls")
# Attention implementation whose returned maps are taken before attention dropout.
ATTENTION_MAPS = "fedkt_eager_maps"


def _eager_maps_before_dropout(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                               attention_mask: Tensor | None, scaling: float | None = None,
                               dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """Eager attention (as BERT's) that returns the attention maps *before* dropout.

    The output still uses the dropped-out weights; only the maps handed back (FedKD's
    Eq. 5 compares them) are the clean softmax, so they carry no dropout noise.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    weights = nn.functional.softmax(scores, dim=-1)
    dropped = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(dropped, value).transpose(1, 2).contiguous()
    return out, weights


ALL_ATTENTION_FUNCTIONS.register(ATTENTION_MAPS, _eager_maps_before_dropout)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_MAPS, eager_mask)


class AttentivePooling(nn.Module):
    """Additive attention over tokens: ``a = softmax(q^T tanh(W h + b))``, ``sum_i a_i h_i``.

    The attentive pooling of the FedKD authors' text classifiers (official code's
    ``AttentionPooling``), padding masked out.  ``q`` starts at zero, so at
    initialisation it is exactly masked mean pooling and learns from there.
    """

    def __init__(self, hidden_size: int, attention_size: int | None = None) -> None:
        super().__init__()
        size = attention_size or hidden_size // 2 or 1
        self.proj = nn.Linear(hidden_size, size)
        self.query = nn.Linear(size, 1, bias=False)
        nn.init.zeros_(self.query.weight)

    def forward(self, states: Tensor, mask: Tensor) -> Tensor:
        scores = self.query(torch.tanh(self.proj(states))).squeeze(-1).float()
        scores = scores.masked_fill(~mask.bool(), torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).to(states.dtype)
        return torch.einsum("bl,bld->bd", weights, states)


def _masked_mean(states: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(states.dtype).unsqueeze(-1)
    return (states * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


class PooledClassifier(nn.Module):
    """An encoder, a pooling of its last token states and a dense layer to the classes.

    ``pooling``: ``attention`` (:class:`AttentivePooling`), ``mean`` (masked mean) or
    ``cls`` (the [CLS] state through the model's pooler, when it has one).  The encoder
    keeps its Hugging Face attribute name (``bert``, ...), so parameter names stay those
    of ``*ForSequenceClassification``; the pooling weights live under ``pooling.`` and the
    dense layer is ``classifier``.  Calls return ``logits`` (and hidden states and
    attention maps when asked), as a sequence classifier does.
    """

    def __init__(self, hf_model: PreTrainedModel, pooling: Pooling, seed: int) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ModelError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")
        base = hf_model.base_model
        self.prefix = hf_model.base_model_prefix
        self.pooling_kind = pooling
        self.config = base.config
        hidden = int(self.config.hidden_size)
        keep_pooler = pooling == "cls" and getattr(base, "pooler", None) is not None
        if hasattr(base, "pooler") and not keep_pooler:
            base.pooler = None  # unused: it would train nothing and travel for nothing
        setattr(self, self.prefix, base)
        p = getattr(self.config, "classifier_dropout", None)
        if p is None:
            p = getattr(self.config, "hidden_dropout_prob", 0.1)
        self.dropout = nn.Dropout(float(p))
        std = float(getattr(self.config, "initializer_range", 0.02))
        with seeded(seed):
            self.pooling = AttentivePooling(hidden) if pooling == "attention" else None
            old = getattr(hf_model, "classifier", None)
            if keep_pooler and isinstance(old, nn.Linear):
                self.classifier = old  # BertForSequenceClassification's own head
            else:
                self.classifier = nn.Linear(hidden, int(self.config.num_labels))
                nn.init.normal_(self.classifier.weight, std=std)
                nn.init.zeros_(self.classifier.bias)
            if self.pooling is not None:
                nn.init.normal_(self.pooling.proj.weight, std=std)
                nn.init.zeros_(self.pooling.proj.bias)
        dtype = next(base.parameters()).dtype
        self.to(dtype)

    @property
    def encoder_model(self) -> PreTrainedModel:
        return getattr(self, self.prefix)

    def set_attn_implementation(self, name: str) -> None:
        self.encoder_model.set_attn_implementation(name)

    def pool(self, states: Tensor, mask: Tensor | None) -> Tensor:
        """The pooled features of last-layer ``states`` [B, L, d] (before dropout)."""
        if mask is None:
            mask = torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
        if self.pooling_kind == "attention":
            return self.pooling(states, mask)
        if self.pooling_kind == "mean":
            return _masked_mean(states, mask)
        pooler = getattr(self.encoder_model, "pooler", None)
        return pooler(states) if pooler is not None else states[:, 0]

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                 **kwargs: Any) -> Tensor:
        """Pooled features of a batch: what the dense layer reads."""
        out = self.encoder_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return self.pool(out.last_hidden_state, attention_mask)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                **kwargs: Any) -> SequenceClassifierOutput:
        extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        out = self.encoder_model(input_ids=input_ids, attention_mask=attention_mask,
                                 output_hidden_states=output_hidden_states,
                                 output_attentions=output_attentions, **extra, **kwargs)
        logits = self.classifier(self.dropout(self.pool(out.last_hidden_state,
                                                        attention_mask)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss=loss, logits=logits,
                                        hidden_states=out.hidden_states,
                                        attentions=out.attentions)


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
    cfg: ModelConfig, num_labels: int, seed: int = 0, pooling: Pooling | None = None
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """An encoder with a fresh ``num_labels``-way classification head, and its tokenizer.

    ``seed`` sets the head (and, for ``tiny-bert``, every weight).  ``pooling``: the
    head of :class:`PooledClassifier`; ``None`` keeps the architecture's own
    ``*ForSequenceClassification`` head.
    """
    given = [k for k in ("quantization", "device_map") if getattr(cfg, k, None) is not None]
    if given:
        raise ModelError(f"model {cfg.name!r}: {given[0]} applies to causal LMs only; encoder "
                         "classifiers load in full on their device (remove it)")
    from fedkt.infra.progress import quiet_libraries, status

    if not cfg.name.lower().startswith("tiny-"):
        status(f"loading {cfg.name}")
    with quiet_libraries():
        model, tokenizer = _load_hf_classifier(cfg, num_labels, seed)
    if pooling is None:
        return model, tokenizer
    return PooledClassifier(model, pooling, seed).eval(), tokenizer


def _load_hf_classifier(
    cfg: ModelConfig, num_labels: int, seed: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
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


def truncate_encoder(model: nn.Module, num_layers: int) -> nn.Module:
    """A copy of ``model`` keeping its embeddings, its first ``num_layers`` layers and its head.

    ``model`` itself is unchanged; the copy's config reports the new depth.
    """
    if hasattr(model, "peft_config"):
        raise ModelError("truncate the base model before applying peft")
    return keep_first_layers(copy.deepcopy(model), num_layers)
