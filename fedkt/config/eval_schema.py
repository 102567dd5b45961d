"""The ``eval`` section: when and what to evaluate, and what to keep of it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from fedkt.config.base import _Strict
from fedkt.config.bounds import MAX_COUNT, BatchSize, Rounds, Tokens
from fedkt.config.data_schema import ClassSpec, _check_class_spec

__all__ = ["EvalConfig"]


# Group names whose accuracy_<name> is an existing metric (accuracy_norm).
_GROUP_NAMES_TAKEN = ("norm",)


class EvalConfig(_Strict):
    every: Rounds = Field(1, description="Evaluate every N rounds (the last round always).")
    batch_size: BatchSize = Field(8, description=(
        "Rows per forward pass: (context, choice) pairs when choices are scored by "
        "log-likelihood (about batch_size / choices examples a pass), else test examples."))
    scoring: Literal["auto", "shared", "pairs"] = Field("auto", description=(
        "How choice log-likelihoods are computed (multiple choice, classification): shared "
        "runs an item's context once and its choices after the context's key/value cache, "
        "the choices cut into forwards of similar lengths; pairs runs every (context, choice) "
        "as one whole sequence; auto takes, per batch, whichever the scorer's cost model "
        "prices lower. The answers are the same; log-likelihoods differ by float rounding "
        "(stored evaluations are kept apart by this setting). Soft-prompt models, and items "
        "cut to fit data.max_length, always take pairs. docs/evaluation.md."))
    max_new_tokens: Tokens = Field(48, description=(
        "Generation tasks: tokens generated per example."))
    positive_label: int = Field(1, ge=0, le=MAX_COUNT, description=(
        "Classification metrics: the positive class (binary P/R/F1)."))
    clients: bool = Field(True, description=(
        "Evaluate clients' models too (every evaluation round)."))
    predictions: bool = Field(True, description=(
        "Write each evaluation's per-example predictions (predictions/round_NNNN/*.json.gz), "
        "which `fedkt report --baseline` and suites pair for confidence intervals."))
    reuse: bool = Field(True, description=(
        "Compute nothing twice: an evaluation whose model weights and adapter, test items, scorer "
        "settings, precision and fedkt code were all seen before reuses the stored metrics and "
        "predictions (within a run, across a suite's arms and across suites, through "
        "$FEDKT_CACHE/reuse); so does a model's knowledge on a fixed public set (FedMKT's top-K "
        "logits, choice posteriors, KOALA's teacher logits). The rows are the same either way but "
        "for timings: a reuse reports the seconds it spared as eval_saved_seconds / "
        "knowledge_saved_seconds. docs/performance.md says what the key covers."))
    plots: bool = Field(True, description=(
        "Draw the run's curves (plots/*.png: one figure per metric, about 0.1 s each) when it "
        "ends; off for sweeps and tests that only read metrics.jsonl."))
    round0: bool | None = Field(None, description=(
        "Evaluate every participant before any training, as round 0 (the zero-shot row). None: on "
        "for every method but zero_shot (whose round 1 is that evaluation)."))
    harness: list[str] = Field(default_factory=list, description=(
        "lm-evaluation-harness tasks run on the final models after the last round (extra "
        "fedkt[harness]; results in RUN_DIR/harness/), e.g. [fedkt_intent_recognition]."))
    harness_clients: bool = Field(False, description=(
        "Run the eval.harness tasks on every client's model too (else the server's only)."))
    harness_include: str | None = Field(None, description=(
        "A folder of your own lm-eval task YAMLs."))
    harness_limit: int | float | None = Field(None, gt=0, le=MAX_COUNT, description=(
        "The first N documents of each harness task (a fraction if < 1); None: all."))
    compare_round0: bool = Field(False, description=(
        "After the run, print each participant's main metric at round 0 and at the end, with the "
        "paired bootstrap 95% CI of the change (needs round0 and predictions)."))
    class_groups: dict[str, ClassSpec] = Field(default_factory=dict, description=(
        'Groups of classes, name -> classes ("0-2", "3,4", a list): every classification and '
        "multiple-choice evaluation also reports accuracy_<name>, the accuracy over the test "
        "items whose gold class is in the group (suites pair it over those items only)."))

    @field_validator("class_groups")
    @classmethod
    def _group_names(cls, groups: dict[str, ClassSpec]) -> dict[str, ClassSpec]:
        for name, spec in groups.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
                raise ValueError(f"group name {name!r} must be a letter then "
                                 "letters, digits or '_' (it names the metric accuracy_<name>)")
            if name in _GROUP_NAMES_TAKEN:
                raise ValueError(f"group name {name!r} would report "
                                 f"accuracy_{name}, which is already a metric; rename it")
            _check_class_spec(spec, name)
        return groups

    @field_validator("compare_round0")
    @classmethod
    def _compare_needs_round0(cls, value: bool, info: ValidationInfo) -> bool:
        off = [k for k in ("round0", "predictions") if value and info.data.get(k) is False]
        if off:
            raise ValueError(f"compares round 0 with the last round from their per-example "
                             f"predictions; it needs eval.{off[0]}: true")
        return value
