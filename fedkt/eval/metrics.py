"""Metrics as pure functions of predictions and gold labels / references.

Conventions: an empty input scores 0.0; a ratio whose denominator is zero
(e.g. precision when nothing is predicted positive) is 0.0, as scikit-learn's
``zero_division=0``.  ROUGE-L is reported on a 0-100 scale, accuracy and
P/R/F1 on 0-1.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import Any

__all__ = ["accuracy", "macro_f1", "precision_recall_f1", "rouge_l", "rouge_l_scores"]


def _check_lengths(preds: Sequence[Any], golds: Sequence[Any]) -> None:
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions but {len(golds)} gold labels")


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def accuracy(preds: Sequence[Hashable], golds: Sequence[Hashable]) -> float:
    """Fraction of predictions equal to the gold label (0.0 for no examples)."""
    _check_lengths(preds, golds)
    return _ratio(sum(p == g for p, g in zip(preds, golds, strict=True)), len(golds))


def precision_recall_f1(
    preds: Sequence[Hashable], golds: Sequence[Hashable], positive: Hashable = 1
) -> tuple[float, float, float]:
    """Precision, recall and F1 of the ``positive`` class (one-vs-rest).

    Precision is 0 when nothing is predicted positive, recall is 0 when no gold
    label is positive, and F1 is 0 when precision + recall is 0.
    """
    _check_lengths(preds, golds)
    tp = sum(p == positive and g == positive for p, g in zip(preds, golds, strict=True))
    predicted = sum(p == positive for p in preds)
    actual = sum(g == positive for g in golds)
    precision = _ratio(tp, predicted)
    recall = _ratio(tp, actual)
    return precision, recall, _ratio(2 * precision * recall, precision + recall)


def macro_f1(
    preds: Sequence[Hashable],
    golds: Sequence[Hashable],
    labels: Sequence[Hashable] | None = None,
) -> float:
    """Unweighted mean of the per-class F1 over ``labels``.

    ``labels`` defaults to every label seen in ``golds`` or ``preds``.
    """
    _check_lengths(preds, golds)
    classes = list(labels) if labels is not None else sorted(set(golds) | set(preds), key=repr)
    if not classes:
        return 0.0
    return sum(precision_recall_f1(preds, golds, c)[2] for c in classes) / len(classes)


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l_scores(predictions: Sequence[str],
                   references_list: Sequence[str | Sequence[str]]) -> list[float]:
    """Per-example ROUGE-L F-measure x 100, each prediction against its best reference.

    ``references_list[i]`` is one reference string or a list of them; with
    several, the highest F-measure counts.  Uses ``rouge_score`` with Porter
    stemming (its tokenizer lower-cases and keeps only ``[a-z0-9]`` runs).
    """
    _check_lengths(predictions, references_list)
    scorer = _rouge_scorer()
    out = []
    for pred, refs in zip(predictions, references_list, strict=True):
        ref_list = [refs] if isinstance(refs, str) else list(refs)
        if not ref_list:
            raise ValueError("a prediction has an empty list of references")
        out.append(100.0 * max(scorer.score(ref, pred)["rougeL"].fmeasure for ref in ref_list))
    return out


def rouge_l(predictions: Sequence[str], references_list: Sequence[str | Sequence[str]]) -> float:
    """Mean of :func:`rouge_l_scores` (0-100); 0.0 for no predictions."""
    scores = rouge_l_scores(predictions, references_list)
    return sum(scores) / len(scores) if scores else 0.0
