"""The normaliser: source rows of one task mapped (``data.dataset.fields``) and validated
into fedkt's records, with errors that name the file, record and field.

The record of each task is described in :mod:`fedkt.data.records`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fedkt.data.dataset import DataError

__all__ = ["TASK_FIELDS", "Normaliser", "as_int", "as_list"]

# fedkt fields of each task: (required, optional)
TASK_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "multiple_choice": (("prompt", "choices", "label"), ()),
    "classification": (("text", "label"), ()),
    "generation": (("prompt", "target"), ("references",)),
}
# The field a row's chat ``messages`` stand in for, per task.
_CHAT_FIELD = {"multiple_choice": "prompt", "classification": "text", "generation": "prompt"}
_ROLES = ("system", "user", "assistant")
_LIST_FIELDS = ("choices", "references")
_TEXT_FIELDS = ("prompt", "text", "target")


def _unicode(text: str, what: str) -> None:
    """A :class:`DataError` naming ``what`` if ``text`` cannot be written as UTF-8: a lone
    surrogate (JSON's ``"\\ud800"`` without its pair), which tokenizers and files refuse."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X} at "
                        f"character {exc.start}), which is not Unicode text; fix its "
                        "\\u escape") from None


def as_int(value: Any) -> int | None:
    """An integer label from int, integral float or digit string; None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        s = value.strip()
        digits = s.removeprefix("-")
        if digits.isascii() and digits.isdigit():  # not "²" or "٣", which int() refuses
            try:
                return int(s)
            except ValueError:  # more than 4300 digits
                return None
    return None


def as_list(value: Any, what: str) -> list[Any]:
    """A list from a list, tuple or JSON-list string; else a :class:`DataError` naming
    ``what``."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DataError(f"{what} is a string that is not a valid JSON list") from None
    if not isinstance(value, list):
        raise DataError(f"{what} must be a list, got {type(value).__name__} {value!r:.60}")
    return value


class Normaliser:
    """Map and validate source rows into normalised records of one task."""

    def __init__(
        self,
        task: str,
        fields: dict[str, str],
        label_names: list[str] | None,
        id_prefix: str,
    ) -> None:
        required, optional = TASK_FIELDS[task]
        unknown = sorted(set(fields) - set(required) - set(optional) - {"messages"})
        if unknown:
            raise DataError(
                f"fields: unknown fedkt field(s) {unknown} for task {task!r}; "
                f"allowed: {[*required, *optional, 'messages']}"
            )
        self.task = task
        self.fields = fields
        self.required = required
        self.optional = optional
        self.label_names = label_names
        self.id_prefix = id_prefix

    def _get(self, where: str, row: dict[str, Any], name: str) -> Any:
        src = self.fields.get(name, name)
        names = (
            [s.strip() for s in src.split(",")] if name in _LIST_FIELDS and "," in src else [src]
        )
        for s in names:
            if s not in row:
                mapped = f" (mapped from '{name}')" if s != name else ""
                hint = "" if mapped else f"; map it with fields: {{{name}: <your field>}}"
                raise DataError(
                    f"{where}: missing field '{s}'{mapped}; fields present: {sorted(row)}{hint}"
                )
        if len(names) > 1:
            return [row[s] for s in names]
        return row[src]

    def _name(self, name: str) -> str:
        src = self.fields.get(name, name)
        return f"'{src}' (mapped from '{name}')" if src != name else f"'{name}'"

    def _text(self, where: str, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise DataError(
                f"{where}: field {self._name(name)} must be a string, "
                f"got {type(value).__name__} {value!r:.60}"
            )
        value = value.strip()
        if not value:
            raise DataError(f"{where}: field {self._name(name)} is empty")
        _unicode(value, f"{where}: field {self._name(name)}")
        return value

    def _chat(self, where: str, row: dict[str, Any]) -> tuple[dict[str, Any],
                                                             list[dict[str, str]], str | None]:
        """A row whose prompt is given as chat ``messages``: the row with its prompt (and,
        generation, its target) filled from the turns, the earlier turns, and the
        messages' source field (None: the row has a plain prompt)."""
        src = self.fields.get("messages", "messages")
        main = _CHAT_FIELD[self.task]
        if src not in row or self.fields.get(main, main) in row:
            return row, [], None
        what = f"{where}: field {self._name('messages')}"
        turns = as_list(row[src], what)
        checked = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or set(turn) - {"role", "content"} or \
                    turn.get("role") not in _ROLES:
                raise DataError(f"{what} turn {i}: expected {{role, content}} with role one "
                                f"of {list(_ROLES)}, got {turn!r:.80}")
            checked.append({"role": turn["role"],
                            "content": self._text(f"{what} turn {i}", "messages",
                                                  turn.get("content"))})
        row = dict(row)
        target = self.fields.get("target", "target")
        if self.task == "generation" and target not in row and checked and \
                checked[-1]["role"] == "assistant":
            row[target] = checked.pop()["content"]
        if not checked or checked[-1]["role"] != "user":
            raise DataError(f"{what}: the last turn must be the user's (the prompt)"
                            + ("" if self.task != "generation" else
                               ", or the assistant's reply after it (the target)"))
        row[self.fields.get(main, main)] = checked.pop()["content"]
        return row, checked, src

    def __call__(self, where: str, index: int, row: dict[str, Any]) -> dict[str, Any]:
        rec: dict[str, Any] = {"id": f"{self.id_prefix}{index}"}
        used: set[str] = set()
        row, history, chat_src = self._chat(where, row)
        if chat_src is not None:
            used.add(chat_src)
            if history:
                rec["messages"] = history
        for name in self.required + self.optional:
            if name not in self.required and name not in self.fields and name not in row:
                continue
            src = self.fields.get(name, name)
            used.update(s.strip() for s in src.split(","))
            value = self._get(where, row, name)
            if name in _TEXT_FIELDS:
                rec[name] = self._text(where, name, value)
            elif name in _LIST_FIELDS:
                items = as_list(value, f"{where}: field {self._name(name)}")
                if not items:
                    raise DataError(f"{where}: field {self._name(name)} is an empty list")
                rec[name] = [self._text(f"{where} item {i}", name, v) for i, v in enumerate(items)]
            elif name == "label":
                rec["label"] = self._label(where, value, rec)
        extra = {k: v for k, v in row.items() if k not in used and isinstance(v, str | int | float)}
        for key, value in extra.items():
            if isinstance(value, str):
                _unicode(value, f"{where}: field {key!r}")
        if extra:
            rec["extra"] = extra
        return rec

    def _label(self, where: str, value: Any, rec: dict[str, Any]) -> int:
        what = f"{where}: label {self._name('label')}"
        label = as_int(value)
        if label is None and isinstance(value, str):
            options = rec.get("choices") if self.task == "multiple_choice" else self.label_names
            if options and value.strip() in options:
                label = options.index(value.strip())
            else:
                hint = (
                    "; give label_names to map label names to indices"
                    if self.task == "classification" and not self.label_names
                    else f"; allowed names: {options}"
                    if options
                    else ""
                )
                raise DataError(f"{what} is not an integer: {value!r:.60}{hint}")
        if label is None:
            raise DataError(f"{what} is not an integer: {type(value).__name__} {value!r:.60}")
        if self.task == "multiple_choice":
            n = len(rec["choices"])
            if not 0 <= label < n:
                raise DataError(f"{what} = {label} is out of range for {n} choices (0..{n - 1})")
        elif label < 0 or (self.label_names is not None and label >= len(self.label_names)):
            n = len(self.label_names or [])
            raise DataError(
                f"{what} = {label} is out of range for {n} label_names (0..{n - 1}): "
                f"{self.label_names}"
                if self.label_names is not None
                else f"{what} = {label} is negative"
            )
        return label
