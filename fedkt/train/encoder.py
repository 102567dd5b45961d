"""Text classifiers (encoders): FedKD and its baselines.

The encoder counterpart of :mod:`fedkt.train.lm` (causal LMs with PEFT adapters):

* :func:`build_encoder` gives a fresh trainable copy of a (cached, never trained)
  pretrained encoder with a seeded classification head, optionally truncated to its
  first N layers (FedKD's student, :func:`fedkt.models.truncate_encoder`) and with the
  embeddings frozen (as the official FedKD code does: they neither train nor travel);
* :func:`trainable_state` / :func:`load_trainable` are what a client keeps or sends;
* :func:`text_batches` turns ``{"text", "label"}`` records into padded batches, the
  encoders read raw text (no LM prompt);
* :func:`train_encoder` is plain cross-entropy fine-tuning (the baselines' local step)
  and :func:`evaluate_encoder` scores a model on records (accuracy, P/R/F1).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn

from fedkt.config import ModelConfig, RunConfig, TrainingConfig
from fedkt.config.method_settings import EncoderHead as EncoderHead  # re-exported
from fedkt.errors import ConfigError
from fedkt.infra.placement import pick_device
from fedkt.infra.precision import autocast, autocast_dtype, grad_scaler, upcast
from fedkt.train.loop import run_steps
from fedkt.train.optim import make_optimizer, step, trainable

__all__ = [
    "EncoderHead",
    "build_encoder",
    "check_text_classification",
    "clear_cache",
    "encoder_config",
    "evaluate_encoder",
    "feature_spread",
    "load_trainable",
    "local_steps",
    "model_inputs",
    "num_layers",
    "text_batches",
    "train_encoder",
    "trainable_state",
]

_PRISTINE: dict[str, tuple[nn.Module, Any]] = {}


def encoder_config(cfg: RunConfig) -> ModelConfig:
    """The one encoder of ``clients.models`` (FedKD's teacher, the baselines' model)."""
    if len({m.model_dump_json() for m in cfg.clients.models}) != 1:
        raise ConfigError(f"clients.models: {cfg.method.name} needs one encoder shared by "
                          "all clients (the teacher; the student is cut from it)")
    return cfg.clients.model_for(0)


def check_text_classification(fd: Any, method: str) -> int:
    """Number of classes of a text classification task; a ConfigError otherwise."""
    if fd.task != "classification" or not fd.label_names:
        raise ConfigError(
            f"data.dataset: method {method!r} trains text classifiers and needs a "
            f"classification task with label_names (e.g. tweeteval_hate), got {fd.task!r}"
        )
    return len(fd.label_names)


def _pristine(model_cfg: ModelConfig, labels: int, seed: int, pooling: str
              ) -> tuple[nn.Module, Any]:
    """The pretrained encoder with its seeded head, loaded once per process and never trained."""
    from fedkt.models.encoder import load_encoder_classifier

    key = "|".join([model_cfg.model_dump_json(), str(labels), str(seed), pooling])
    if key not in _PRISTINE:
        model, tokenizer = load_encoder_classifier(model_cfg, labels, seed=seed,
                                                   pooling=pooling)  # type: ignore[arg-type]
        for p in model.parameters():
            p.requires_grad_(False)
        _PRISTINE[key] = (model.eval(), tokenizer)
    return _PRISTINE[key]


def clear_cache() -> None:
    _PRISTINE.clear()


def build_encoder(
    model_cfg: ModelConfig,
    labels: int,
    seed: int,
    *,
    layers: int | None = None,
    freeze_embeddings: bool = True,
    eager_attention: bool = False,
    pooling: str = "attention",
    device: str = "auto",
) -> tuple[nn.Module, Any]:
    """A trainable copy of the pretrained encoder ``model_cfg`` names, and its tokenizer.

    ``seed`` sets the classification head, so every process builds the same model.
    ``layers``: keep the embeddings and the first ``layers`` layers (FedKD's student);
    ``None`` keeps them all. ``pooling``: the head (:class:`fedkt.models.encoder.
    PooledClassifier`: ``attention``, ``mean`` or ``cls``); its weights train and travel
    with the model. ``eager_attention``: an eager attention that returns the attention
    maps before dropout (FedKD's Eq. 5 compares them).
    """
    from fedkt.models.encoder import ATTENTION_MAPS, truncate_encoder

    base, tokenizer = _pristine(model_cfg, labels, seed, pooling)
    model = truncate_encoder(base, layers) if layers is not None else copy.deepcopy(base)
    for name, p in model.named_parameters():
        p.requires_grad_(not (freeze_embeddings and "embeddings" in name))
    if eager_attention:
        model.set_attn_implementation(ATTENTION_MAPS)
    return model.to(pick_device(device)).eval(), tokenizer


def num_layers(model: nn.Module) -> int:
    """Number of transformer layers of an encoder."""
    from fedkt.models.layers import layer_list

    return len(layer_list(model)[2])


def trainable_state(model: nn.Module) -> dict[str, Tensor]:
    """CPU copies of the parameters that train (what a party keeps on disk or sends, on
    the device of what it receives)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()
            if p.requires_grad}


def load_trainable(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Write ``state`` into the trainable parameters (the key sets must be equal)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise ValueError(f"trainable state does not fit the model: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name].to(p.device, p.dtype))


def text_batches(tokenizer: Any, records: list[dict], batch_size: int, max_length: int,
                 seed: int | None) -> list[dict[str, Tensor]]:
    """Padded batches of ``records`` (shuffled with ``seed``; in order for ``None``).

    Each batch holds the tokenizer's inputs (``input_ids``, ``attention_mask`` and, for
    BERT-style tokenizers, ``token_type_ids``) and ``labels``.
    """
    order = list(range(len(records)))
    if seed is not None:
        order = torch.randperm(len(records), generator=torch.Generator().manual_seed(seed)).tolist()
    out = []
    for start in range(0, len(order), batch_size):
        chunk = [records[i] for i in order[start : start + batch_size]]
        enc = tokenizer([str(r["text"]) for r in chunk], truncation=True, max_length=max_length,
                        padding=True, return_tensors="pt")
        batch = {k: v for k, v in enc.items()
                 if k in ("input_ids", "attention_mask", "token_type_ids")}
        batch["labels"] = torch.tensor([int(r["label"]) for r in chunk], dtype=torch.long)
        out.append(batch)
    return out


def local_steps(tcfg: TrainingConfig, tokenizer: Any, records: list[dict], max_length: int,
                seed: int) -> list[dict[str, Tensor]]:
    """The batches of one client's local training: ``local_epochs`` (or ``max_steps``)."""
    epochs = max(1, math.ceil(tcfg.local_epochs))
    batches: list[dict[str, Tensor]] = []
    for epoch in range(epochs):
        batches += text_batches(tokenizer, records, tcfg.batch_size, max_length, seed + epoch)
    per_epoch = len(batches) // epochs
    total = tcfg.max_steps or max(1, math.ceil(tcfg.local_epochs * per_epoch))
    return batches[: min(total, len(batches))]


def model_inputs(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """A batch without its labels, on ``device``."""
    return {k: v.to(device) for k, v in batch.items() if k != "labels"}


def train_encoder(cfg: RunConfig, model: nn.Module, tokenizer: Any, records: list[dict],
                  *, seed: int) -> dict[str, float]:
    """Cross-entropy fine-tuning of ``model``'s trainable parameters on ``records``.

    Returns the mean loss, the number of steps and of examples, and the mean seconds
    per step.
    """
    batches = local_steps(cfg.training, tokenizer, records, cfg.data.max_length, seed)
    if not batches:
        return {"loss": float("nan"), "steps": 0, "num_examples": 0, "step_seconds": 0.0}
    params = trainable(model)
    opt, sched = make_optimizer(params, cfg.training, len(batches))
    device = next(model.parameters()).device
    scaler = grad_scaler(cfg, device)

    def batch_loss(i: int, batch: dict[str, Tensor]) -> Tensor:
        with autocast(cfg, device):
            logits = upcast(model(**model_inputs(batch, device)).logits)
            return nn.functional.cross_entropy(logits, batch["labels"].to(device))

    stats = run_steps(batches, batch_loss,
                      lambda loss: step(loss, [opt], clip=[params], schedules=[sched],
                                        max_grad_norm=cfg.training.max_grad_norm,
                                        scaler=scaler),
                      modules=[model], seed=seed, total=len(batches), desc="encoder train",
                      cast=autocast_dtype(cfg, device))
    return {"loss": stats.loss, "steps": len(batches), "num_examples": len(records),
            "step_seconds": stats.seconds / len(batches)}


def evaluate_encoder(cfg: RunConfig, model: nn.Module, tokenizer: Any, records: list[dict]
                     ) -> dict[str, float]:
    """Accuracy, P/R/F1 of ``eval.positive_label``, macro-F1 and loss on ``records``."""
    from fedkt.data.splits import drawn_groups, run_data
    from fedkt.eval import reuse
    from fedkt.eval.evaluate import evaluate_text_classifier

    order = (run_data(cfg.data, cfg.clients.num_clients, cfg.seed).class_order
             if cfg.data.classes.draw and cfg.eval.class_groups else None)
    settings = {"batch_size": cfg.eval.batch_size, "max_length": cfg.data.max_length,
                "positive_label": cfg.eval.positive_label,
                "class_groups": drawn_groups(cfg.eval.class_groups, order)}
    with autocast(cfg, model):
        return reuse.evaluation(
            cfg.eval.reuse, model, tokenizer, {"records": records, **settings},
            lambda: evaluate_text_classifier(model, tokenizer, records, **settings))


def feature_spread(model: nn.Module, tokenizer: Any, texts: list[str], max_length: int) -> float:
    """How much a classifier's pooled features vary across ``texts``: ``||std|| / ||mean||``.

    The features are what the dense layer reads (:meth:`fedkt.models.encoder.
    PooledClassifier.features`), over the texts as one batch, in eval mode. A head whose
    features barely move across inputs (a shallow encoder's [CLS] state: about 0.003 for
    all-MiniLM-L6-v2 at layer 2) cannot tell its inputs apart.
    """
    batch = text_batches(tokenizer, [{"text": t, "label": 0} for t in texts], len(texts),
                         max_length, None)[0]
    device = next(model.parameters()).device
    inputs = model_inputs(batch, device)
    model.eval()
    with torch.no_grad():
        feats = model.features(**inputs).float()
    return float(feats.std(dim=0).norm() / feats.mean(dim=0).norm().clamp_min(1e-12))
