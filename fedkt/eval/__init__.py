"""Evaluation: metrics (pure functions) and model scoring (``fedkt.eval.scorer``,
``fedkt.eval.generation``, ``fedkt.eval.evaluate``, each name imported from its module);
per-example predictions (``fedkt.eval.predictions``) and the reuse of evaluations and
knowledge sets already computed (``fedkt.eval.reuse``, ``eval.reuse``)."""

from fedkt.eval.evaluate import eval_classifier, evaluate_causal_lm, evaluate_text_classifier
from fedkt.eval.generation import generate
from fedkt.eval.metrics import accuracy, macro_f1, precision_recall_f1, rouge_l
from fedkt.eval.scorer import mc_accuracy, mc_predictions, score_choices, target_loss

__all__ = [
    "accuracy",
    "eval_classifier",
    "evaluate_text_classifier",
    "evaluate_causal_lm",
    "generate",
    "macro_f1",
    "mc_accuracy",
    "mc_predictions",
    "precision_recall_f1",
    "rouge_l",
    "score_choices",
    "target_loss",
]
