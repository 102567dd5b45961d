"""Evaluating language models and classifiers: the names of the modules that do it.

Each job lives in its own module of :mod:`fedkt.eval`; every name is also importable from
here:

* :mod:`fedkt.eval.inputs`: token ids and padded tensors (``encode_scored``,
  ``takes_logits_to_keep``, the encoding and padding functions, ``_inference``);
* :mod:`fedkt.eval.scorer`: multiple-choice scoring by log-likelihood and target losses
  (``score_choices``, ``mc_predictions``, ``mc_accuracy``, ``target_loss``);
* :mod:`fedkt.eval.layout`: the scorer's cost planner (``LAYOUTS``, ``CALL_COST``,
  ``ATTENTION_COST``, ``LayoutPlan``, ``plan_layout``, ``model_plan``);
* :mod:`fedkt.eval.generation`: greedy generation (``generate``);
* :mod:`fedkt.eval.evaluate`: whole-model evaluations (``evaluate_causal_lm``,
  ``eval_classifier``, ``evaluate_text_classifier``, ``TASKS``).

Code that replaces one of these names (a test's or a benchmark's patch) patches the module
that uses it, not this one.
"""

from __future__ import annotations

from fedkt.eval.evaluate import TASKS as TASKS
from fedkt.eval.evaluate import _ids as _ids
from fedkt.eval.evaluate import eval_classifier as eval_classifier
from fedkt.eval.evaluate import evaluate_causal_lm as evaluate_causal_lm
from fedkt.eval.evaluate import evaluate_text_classifier as evaluate_text_classifier
from fedkt.eval.generation import _cut as _cut
from fedkt.eval.generation import _eos_ids as _eos_ids
from fedkt.eval.generation import generate as generate
from fedkt.eval.inputs import _device as _device
from fedkt.eval.inputs import _encode as _encode
from fedkt.eval.inputs import _encode_example as _encode_example
from fedkt.eval.inputs import _encode_pair as _encode_pair
from fedkt.eval.inputs import _inference as _inference
from fedkt.eval.inputs import _pad as _pad
from fedkt.eval.inputs import _pad_id as _pad_id
from fedkt.eval.inputs import _pair_batches as _pair_batches
from fedkt.eval.inputs import _scored_seq as _scored_seq
from fedkt.eval.inputs import _special_prefix as _special_prefix
from fedkt.eval.inputs import _start_token as _start_token
from fedkt.eval.inputs import encode_scored as encode_scored
from fedkt.eval.inputs import takes_logits_to_keep as takes_logits_to_keep
from fedkt.eval.layout import ATTENTION_COST as ATTENTION_COST
from fedkt.eval.layout import CALL_COST as CALL_COST
from fedkt.eval.layout import LAYOUTS as LAYOUTS
from fedkt.eval.layout import LayoutPlan as LayoutPlan
from fedkt.eval.layout import _head_share as _head_share
from fedkt.eval.layout import _shares_context as _shares_context
from fedkt.eval.layout import model_plan as model_plan
from fedkt.eval.layout import plan_layout as plan_layout
from fedkt.eval.scorer import _argmax as _argmax
from fedkt.eval.scorer import _score_chunk as _score_chunk
from fedkt.eval.scorer import _score_grouped as _score_grouped
from fedkt.eval.scorer import _score_pairs as _score_pairs
from fedkt.eval.scorer import _score_sequences as _score_sequences
from fedkt.eval.scorer import mc_accuracy as mc_accuracy
from fedkt.eval.scorer import mc_predictions as mc_predictions
from fedkt.eval.scorer import score_choices as score_choices
from fedkt.eval.scorer import target_loss as target_loss

__all__ = [
    "eval_classifier",
    "evaluate_text_classifier",
    "encode_scored",
    "evaluate_causal_lm",
    "generate",
    "mc_accuracy",
    "mc_predictions",
    "score_choices",
    "takes_logits_to_keep",
    "target_loss",
]
