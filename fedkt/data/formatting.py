"""Prompt formatting of normalised records for causal language models.

Training uses :func:`lm_pair` (prompt, target); the loss falls on the target only.
Scoring of multiple choice and classification uses :func:`mc_view`: the context and
one continuation per choice (or label name), each compared by log-likelihood.  Both
build the same prompt, so what a model is trained on is what it is scored on.

A ``template`` with ``{field}`` placeholders replaces the default prompt.  Placeholders:
the record's fedkt fields (``prompt``, ``text``, ...), its unmapped source fields
(``extra``), ``options`` (lettered choices, one a line) and ``labels`` (the label names,
comma separated).  Templates are checked first (:mod:`fedkt.infra.templates`): plain field
names only, widths and precisions bounded.

Chat models: with a :class:`ChatFormat` (``data.chat_template``, :func:`chat_format`), the
formatted prompt is the last user turn of a chat, wrapped by the tokenizer's chat template
(``apply_chat_template(..., add_generation_prompt=True)``), and the target or choice is
the assistant's reply (no leading space).  A record's earlier turns (``messages``: the
chat before its last user turn) come first: as chat turns with a chat template, as
``Role: content`` lines without one.
"""

from __future__ import annotations

import string
from typing import Any

from fedkt.data.dataset import DataError
from fedkt.errors import ConfigError
from fedkt.infra.templates import check_template as check_template_syntax

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


class ChatFormat:
    """A tokenizer's chat template (or a given Jinja one) wrapping prompts as a user turn."""

    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template  # None: the tokenizer's own
        # A BOS the template writes and the tokenizer adds again when encoding: keep one.
        bos = getattr(tokenizer, "bos_token", None)
        ids = tokenizer("a")["input_ids"]
        self._strip = bos if bos and ids and ids[0] == tokenizer.bos_token_id else None

    def wrap(self, prompt: str, history: list[dict[str, str]] | None = None) -> str:
        """The chat text up to the assistant's reply: ``history`` + ``prompt`` as a user turn."""
        messages = [*(history or []), {"role": "user", "content": prompt}]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, add_generation_prompt=True,
                tokenize=False)
        except Exception as exc:  # noqa: BLE001 - jinja errors of a user's template
            raise DataError(f"data.chat_template: applying it failed: {exc}") from None
        if not isinstance(text, str):
            raise DataError("data.chat_template: the template did not render to text")
        if self._strip and text.startswith(self._strip):
            text = text[len(self._strip):]
        return text


def chat_format(setting: str, tokenizer: Any) -> ChatFormat | None:
    """``data.chat_template`` for one model: ``none`` -> None (plain prompts); ``auto`` ->
    the tokenizer's own template, None when it has none (a base model); else the setting
    is a Jinja chat template used for every model."""
    if setting == "none":
        return None
    if setting == "auto":
        own = getattr(tokenizer, "chat_template", None)
        return ChatFormat(tokenizer) if isinstance(own, str) and own else None
    return ChatFormat(tokenizer, setting)


def template_text(setting: str, tokenizer: Any) -> str | None:
    """The chat template ``setting`` resolves to for ``tokenizer`` (None: plain prompts);
    two models whose public-set texts must match compare these."""
    chat = chat_format(setting, tokenizer)
    if chat is None:
        return None
    return chat.wrap("{prompt}")


def check_shared_template(setting: str, tokenizers: dict[str, Any], method: str) -> None:
    """Models that align their knowledge of one public sample across tokenizers (FedMKT,
    FedCoLLM) must see it as the same text: refuse chat templates that differ between
    them (``auto`` with different families' templates), naming the models."""
    if setting == "none":
        return
    texts = {name: template_text(setting, tok) for name, tok in tokenizers.items()}
    if len(set(texts.values())) > 1:
        shown = "; ".join(f"{name}: {'plain' if t is None else repr(t[:60])}"
                          for name, t in texts.items())
        raise ConfigError(
            f"data.chat_template: {method} aligns each public sample's tokens across models "
            f"on one text, but {setting if setting == 'auto' else 'the template'} wraps it "
            f"differently per model ({shown}); use chat_template: none, or one Jinja "
            "template for every model (docs/data.md, chat templates)")


def _history(record: dict[str, Any]) -> list[dict[str, str]]:
    return list(record.get("messages") or [])


def _plain(record: dict[str, Any], prompt: str) -> str:
    """Earlier turns as ``Role: content`` lines before the prompt (no chat template)."""
    turns = _history(record)
    if not turns:
        return prompt
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in turns]
    return "\n".join([*lines, prompt])


def _label_name(label: int, label_names: list[str] | None) -> str:
    if label_names is None:
        return str(label)
    return label_names[label]


def lm_pair(
    record: dict[str, Any],
    task: str,
    label_names: list[str] | None = None,
    template: str | None = None,
    chat: ChatFormat | None = None,
) -> tuple[str, str]:
    """(prompt, target) for causal-LM training; the target starts with a space (with
    ``chat``: the prompt is a chat up to the assistant's turn, the target its reply)."""
    prompt = format_prompt(record, task, label_names, template)
    if task == "multiple_choice":
        target = record["choices"][_gold(record, "label")]
    elif task == "classification":
        target = _label_name(_gold(record, "label"), label_names)
    else:
        target = _gold(record, "target")
    if chat is not None:
        return chat.wrap(prompt, _history(record)), target
    return _plain(record, prompt), " " + target


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
    chat: ChatFormat | None = None,
) -> tuple[str, list[str]]:
    """(context, continuations with a leading space) for likelihood scoring; needs no
    label, so it also serves public records whose labels are withheld (with ``chat``: the
    chat up to the assistant's turn, and the replies without a leading space)."""
    if task == "multiple_choice":
        choices = record["choices"]
    elif task == "classification":
        if label_names is None:
            raise DataError("choice_view: a classification task needs label_names")
        choices = label_names
    else:
        raise DataError(f"choice_view: task {task!r} has no choices to score")
    context = format_prompt(record, task, label_names, template)
    if chat is not None:
        return chat.wrap(context, _history(record)), list(choices)
    return _plain(record, context), [" " + c for c in choices]


def mc_view(
    record: dict[str, Any],
    task: str,
    label_names: list[str] | None = None,
    template: str | None = None,
    chat: ChatFormat | None = None,
) -> tuple[str, list[str], int]:
    """(context, continuations with a leading space, gold index) for likelihood scoring
    (:func:`choice_view` and the gold label; with ``chat``: the chat up to the assistant's
    turn, and the replies)."""
    context, continuations = choice_view(record, task, label_names, template, chat)
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
