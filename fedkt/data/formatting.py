"""Prompt formatting of normalised records for causal language models.

Training uses :func:`lm_pair` (prompt, target); the loss falls on the target only.
Scoring of multiple choice and classification uses :func:`mc_view`: the context and
one continuation per choice (or label name), each compared by log-likelihood.  Both
build the same prompt, so what a model is trained on is what it is scored on.

A ``template`` with ``{field}`` placeholders replaces the default prompt.  Placeholders:
the record's fedkt fields (``prompt``, ``text``, ...), its unmapped source fields
(``extra``), ``options`` (lettered choices, one a line) and ``labels`` (the label names,
comma separated).  Templates are checked first (:mod:`fedkt.templates`): plain field
names only, widths and precisions bounded.
"""

from __future__ import annotations

import string
from typing import Any

from fedkt.data.dataset import DataError
from fedkt.templates import check_template as check_template_syntax

_LETTERS = string.ascii_uppercase

DEFAULT_TEMPLATES: dict[str, str] = {
    "multiple_choice": "Question: {prompt}\n{options}\nAnswer:",
    "classification": "Text: {text}\nLabel:",
    "generation": "Input:\n{prompt}\nOutput:",
}


def _options(choices: list[str]) -> str:
    if len(choices) <= len(_LETTERS):
        return "\n".join(f"{_LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return "\n".join(f"{i + 1}. {c}" for i, c in enumerate(choices))


def _values(record: dict[str, Any], task: str, label_names: list[str] | None) -> dict[str, Any]:
    values: dict[str, Any] = dict(record.get("extra", {}))
    values.update({k: v for k, v in record.items() if k != "extra"})
    if task == "multiple_choice":
        values["options"] = _options(record["choices"])
    if label_names is not None:
        values["labels"] = ", ".join(label_names)
    return values


def format_prompt(
    record: dict[str, Any],
    task: str,
    label_names: list[str] | None = None,
    template: str | None = None,
) -> str:
    """The prompt (context) for a record, from ``template`` or the task's default."""
    if task not in DEFAULT_TEMPLATES:
        raise DataError(f"unknown task {task!r}; one of {', '.join(DEFAULT_TEMPLATES)}")
    if template is not None:
        try:  # also a client's check of a template in the server's config
            check_template_syntax(template)
        except ValueError as exc:
            raise DataError(str(exc)) from None
    values = _values(record, task, label_names)
    try:
        return (template or DEFAULT_TEMPLATES[task]).format_map(values)
    except KeyError as exc:
        raise DataError(
            f"template placeholder {{{exc.args[0]}}} is not a field of record "
            f"{record.get('id', '?')}; available: {sorted(values)}"
        ) from None
    except (ValueError, IndexError, AttributeError, TypeError) as exc:  # {x.y}, {label[0]}
        raise DataError(f"template {template!r} is malformed: {exc}") from None


def _label_name(label: int, label_names: list[str] | None) -> str:
    if label_names is None:
        return str(label)
    return label_names[label]


def lm_pair(
    record: dict[str, Any],
    task: str,
    label_names: list[str] | None = None,
    template: str | None = None,
) -> tuple[str, str]:
    """(prompt, target) for causal-LM training; the target starts with a space."""
    prompt = format_prompt(record, task, label_names, template)
    if task == "multiple_choice":
        target = record["choices"][_gold(record, "label")]
    elif task == "classification":
        target = _label_name(_gold(record, "label"), label_names)
    else:
        target = _gold(record, "target")
    return prompt, " " + target


def _gold(record: dict[str, Any], field: str) -> Any:
    """The record's gold ``field``; a :class:`DataError` if it has none (a public record
    whose labels are withheld, ``data.public_labels: false``)."""
    if field not in record:
        raise DataError(f"record {record.get('id', '?')} has no gold {field!r} (public labels "
                        "are withheld with data.public_labels: false, or it comes from "
                        "data.public_dataset); this step needs labelled records")
    return record[field]


def choice_view(
    record: dict[str, Any],
    task: str,
    label_names: list[str] | None = None,
    template: str | None = None,
) -> tuple[str, list[str]]:
    """(context, continuations with a leading space) for likelihood scoring; needs no
    label, so it also serves public records whose labels are withheld."""
    if task == "multiple_choice":
        choices = record["choices"]
    elif task == "classification":
        if label_names is None:
            raise DataError("choice_view: a classification task needs label_names")
        choices = label_names
    else:
        raise DataError(f"choice_view: task {task!r} has no choices to score")
    context = format_prompt(record, task, label_names, template)
    return context, [" " + c for c in choices]


def mc_view(
    record: dict[str, Any],
    task: str,
    label_names: list[str] | None = None,
    template: str | None = None,
) -> tuple[str, list[str], int]:
    """(context, continuations with a leading space, gold index) for likelihood scoring
    (:func:`choice_view` and the gold label)."""
    context, continuations = choice_view(record, task, label_names, template)
    return context, continuations, int(_gold(record, "label"))


def check_template(
    template: str,
    records: list[dict[str, Any]],
    task: str,
    label_names: list[str] | None,
    source: str = "dataset",
) -> None:
    """Raise :class:`DataError` unless ``template`` formats every record."""
    for rec in records:
        try:
            format_prompt(rec, task, label_names, template)
        except DataError as exc:
            raise DataError(f"{source}: {exc}") from None
