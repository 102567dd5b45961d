"""Whole-model evaluations: a causal LM on a task's records, and a sequence classifier.

:func:`evaluate_causal_lm` scores multiple-choice and classification records by choice
log-likelihood (:mod:`fedkt.eval.scorer`) and generation records by ROUGE-L of greedy
outputs (:mod:`fedkt.eval.generation`); :func:`eval_classifier` scores a classifier by
its logits.  Each hands its per-example table to :func:`fedkt.eval.predictions.emit`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from fedkt.eval import predictions
from fedkt.eval.generation import generate
from fedkt.eval.groups import group_accuracies, resolve_groups
from fedkt.eval.inputs import _device, _inference, _pad, _pad_id
from fedkt.eval.metrics import accuracy, macro_f1, precision_recall_f1, rouge_l_scores
from fedkt.eval.scorer import _score_grouped, mc_predictions, target_loss
from fedkt.infra import progress
from fedkt.infra.timing import timed_evaluation

__all__ = ["TASKS", "eval_classifier", "evaluate_causal_lm", "evaluate_text_classifier"]


TASKS = ("multiple_choice", "classification", "generation")


@timed_evaluation
def eval_classifier(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    labels: Sequence[int],
    *,
    batch_size: int = 8,
    max_length: int = 256,
    positive_label: int = 1,
    ids: Sequence[str] | None = None,
    class_groups: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Metrics of a sequence classifier (``model(...).logits`` of shape [batch, classes]).

    Returns accuracy, precision/recall/F1 of ``positive_label``, macro-F1 and
    the mean cross-entropy loss per example, and ``accuracy_<name>`` of each of
    ``class_groups`` (``eval.class_groups``; :mod:`fedkt.eval.groups`).
    """
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    example_ids = list(ids) if ids is not None else list(range(len(texts)))
    if not texts:
        return {"accuracy": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0,
                "macro_f1": 0.0, "loss": 0.0}
    device = _device(model)
    pad_id = _pad_id(tokenizer, model)
    side = getattr(tokenizer, "padding_side", "right")
    encoded = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    # Longest first, so each batch pads to similar lengths; predictions go back in order.
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
    preds: list[int] = [0] * len(texts)
    losses: list[float] = [0.0] * len(texts)
    with _inference(model), progress.bar(len(order), "eval") as shown:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            shown.update(len(idx))
            gold = torch.tensor([int(labels[i]) for i in idx], dtype=torch.long)
            ids, mask = _pad([encoded[i] for i in idx], pad_id, side)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            logits = logits.float().cpu()
            per_example = F.cross_entropy(logits, gold, reduction="none").tolist()
            for row, i in enumerate(idx):
                preds[i] = int(logits[row].argmax())
                losses[i] = per_example[row]
    loss_sum = sum(losses)
    golds = [int(y) for y in labels]
    p, r, f1 = precision_recall_f1(preds, golds, positive_label)
    groups = resolve_groups(class_groups, int(logits.shape[-1]))
    predictions.emit({"id": example_ids, "gold": golds, "pred": preds}, task="classifier",
                     positive_label=positive_label,
                     **({"class_groups": groups} if groups else {}))
    return {"accuracy": accuracy(preds, golds), "precision": p, "recall": r, "f1": f1,
            "macro_f1": macro_f1(preds, golds), "loss": loss_sum / len(texts),
            **group_accuracies(preds, golds, groups)}


def evaluate_text_classifier(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    *,
    batch_size: int = 8,
    max_length: int = 256,
    positive_label: int = 1,
    class_groups: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """:func:`eval_classifier` on classification records ``{"text", "label"}``."""
    return eval_classifier(model, tokenizer, [r["text"] for r in records],
                           [int(r["label"]) for r in records], batch_size=batch_size,
                           max_length=max_length, positive_label=positive_label,
                           ids=_ids(records), class_groups=class_groups)


@timed_evaluation
def evaluate_causal_lm(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    task: str,
    label_names: Sequence[str] | None = None,
    *,
    batch_size: int = 8,
    max_length: int = 256,
    max_new_tokens: int = 48,
    positive_label: int = 1,
    template: str | None = None,
    class_groups: Mapping[str, Any] | None = None,
    chat: Any = None,
    layout: str = "auto",
) -> dict[str, float]:
    """Evaluate a causal LM on normalised records of ``task``.

    ``chat`` (a :class:`fedkt.data.formatting.ChatFormat`) wraps each prompt in the
    model's chat template; the target and choices are the assistant's reply.  ``layout``:
    how choices are scored (``eval.scoring``; :data:`fedkt.eval.layout.LAYOUTS`).

    multiple_choice / classification: ``accuracy`` and ``accuracy_norm`` by
    choice log-likelihood, and ``accuracy_<name>`` of each of ``class_groups``
    (``eval.class_groups``, over the gold label or choice index; :mod:`fedkt.eval.groups`).
    Classification scores the label names as the
    choices and adds ``macro_f1``, and for binary tasks ``precision``/``recall``/
    ``f1`` of ``positive_label``.  generation: ``rougeL`` of greedy outputs against
    ``references`` (or the target).
    Every task: ``loss``, the mean cross-entropy per target token of the
    records' (prompt, target) pairs.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    if not records:
        raise ValueError("no records to evaluate")
    from fedkt.data.formatting import lm_pair, mc_view

    groups = resolve_groups(class_groups, len(label_names) if task == "classification"
                            and label_names is not None else None) if task != "generation" else {}

    names = list(label_names) if label_names is not None else None
    pairs = [lm_pair(r, task, names, template, chat) for r in records]
    prompts = [p for p, _ in pairs]
    if task == "generation":
        out = {"loss": target_loss(model, tokenizer, prompts, [t for _, t in pairs],
                                   batch_size=batch_size, max_length=max_length)}
        preds = generate(model, tokenizer, prompts, max_new_tokens, batch_size,
                         max_length=max_length)
        refs = [list(r.get("references") or []) or [t] for r, (_, t) in zip(records, pairs,
                                                                             strict=True)]
        per_item = rouge_l_scores(preds, refs)
        out["rougeL"] = sum(per_item) / len(per_item)
        predictions.emit({"id": _ids(records), "gold": [r[0] for r in refs], "pred": preds,
                          "rougeL": per_item}, task=task)
        return out
    views = [mc_view(r, task, names, template, chat) for r in records]
    contexts = [v[0] for v in views]
    choices = [list(v[1]) for v in views]
    golds = [int(v[2]) for v in views]
    scored = _score_grouped(model, tokenizer, contexts, choices, batch_size=batch_size,
                            max_length=max_length, layout=layout)
    if all(pair == (ctx, conts[g]) for pair, ctx, conts, g
           in zip(pairs, contexts, choices, golds, strict=True)):
        # The (prompt, target) pairs are the gold choices already scored: reuse them.
        tokens = sum(row[g][1] for row, g in zip(scored, golds, strict=True))
        total = sum(row[g][0] for row, g in zip(scored, golds, strict=True))
        loss = -total / tokens if tokens else 0.0
    else:
        loss = target_loss(model, tokenizer, prompts, [t for _, t in pairs],
                           batch_size=batch_size, max_length=max_length)
    out = {"loss": loss}
    scores = [[lp for lp, _ in row] for row in scored]
    preds, preds_norm = mc_predictions(scores, choices)
    out["accuracy"] = accuracy(preds, golds)
    out["accuracy_norm"] = accuracy(preds_norm, golds)
    meta: dict[str, Any] = {"task": task}
    if task == "classification":
        num_labels = len(choices[0])
        if num_labels == 2:  # P/R/F1 of one positive class only mean something when binary
            p, r, f1 = precision_recall_f1(preds, golds, positive_label)
            out.update(precision=p, recall=r, f1=f1)
            meta["positive_label"] = positive_label
        out["macro_f1"] = macro_f1(preds, golds, range(num_labels))
        meta["labels"] = list(range(num_labels))
    if groups:
        out.update(group_accuracies(preds, golds, groups))
        meta["class_groups"] = groups
    predictions.emit({"id": _ids(records), "gold": golds, "pred": preds, "pred_norm": preds_norm,
                      "scores": scores}, **meta)
    return out


def _ids(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each record's ``id`` (its position when it has none)."""
    return [str(r.get("id", i)) for i, r in enumerate(records)]
