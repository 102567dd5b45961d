"""Public sets without labels: withholding gold fields, and off-distribution public text.

``data.public_labels: false`` strips every record of the public set of its gold fields
(:data:`GOLD_FIELDS`).  ``data.public_dataset`` takes the public set from another
dataset: its text is mapped onto the task's input fields (:data:`INPUT_FIELDS`), with
``fields`` naming, for each input field, the public source's field (default: the same
name).  For a built-in source the fields are those of its records (DialogSum:
``prompt``, ``target``; TweetEval: ``text``, ``label``; plus any ``extra`` source
fields); for a file or Hugging Face source, the raw fields of its rows.
"""

from __future__ import annotations

from typing import Any

from fedkt.config import DatasetConfig
from fedkt.data.dataset import DataError
from fedkt.data.formatting import check_template
from fedkt.data.readers import read_source
from fedkt.data.records import load_dataset_records

__all__ = ["GOLD_FIELDS", "INPUT_FIELDS", "load_public_texts", "without_labels"]

# The fields that carry a record's gold answer, removed when public labels are withheld.
GOLD_FIELDS = ("label", "target", "references")
# The fields a task's model reads (what an off-distribution public set must supply).
INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "classification": ("text",),
    "generation": ("prompt",),
    "multiple_choice": ("prompt", "choices"),
}
KEY = "data.public_dataset"


def without_labels(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New records without their gold fields (:data:`GOLD_FIELDS`); all else kept."""
    return [{k: v for k, v in r.items() if k not in GOLD_FIELDS} for r in records]


def _source_rows(cfg: DatasetConfig) -> tuple[list[tuple[str, str, dict[str, Any]]], str]:
    """``[(where, id, row)]`` of the public source, and its name."""
    if cfg.name:
        ds = load_dataset_records(cfg.model_copy(update={"fields": {}}))
        rows = [(f"{KEY} {ds.name!r} record {i} (id {r['id']!r})", str(r["id"]),
                 {**r.get("extra", {}), **{k: v for k, v in r.items() if k != "extra"}})
                for i, r in enumerate(ds.records)]
        return rows, ds.name
    raw, _, name = read_source(cfg)
    rows = []
    for index, (where, row) in enumerate(raw):
        if cfg.max_records is not None and index >= cfg.max_records:
            break
        rows.append((f"{KEY}: {where}", f"{name}:{index}", row))
    return rows, name


def _text(where: str, field: str, src: str, value: Any) -> str:
    named = f"'{src}' (mapped from '{field}')" if src != field else f"'{field}'"
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field {named} must be a non-empty string, got "
                        f"{type(value).__name__} {value!r:.60}")
    return value.strip()


def load_public_texts(cfg: DatasetConfig, task: str, label_names: list[str] | None = None,
                      template: str | None = None) -> list[dict[str, Any]]:
    """The public source's records as unlabelled records of ``task`` (``id`` and the task's
    input fields only), in source order; errors name ``data.public_dataset``, the record
    and the field.  ``template`` (the task's) is checked on every record."""
    if task not in INPUT_FIELDS:
        raise DataError(f"{KEY}: an off-distribution public set is for text tasks "
                        f"({', '.join(INPUT_FIELDS)}); the task is {task}")
    inputs = INPUT_FIELDS[task]
    unknown = sorted(set(cfg.fields) - set(inputs))
    if unknown:
        raise DataError(f"{KEY}.fields: {unknown} are not input fields of a {task} task; "
                        f"map {list(inputs)} (task field -> the public source's field)")
    rows, name = _source_rows(cfg)
    out: list[dict[str, Any]] = []
    for where, rid, row in rows:
        rec: dict[str, Any] = {"id": rid}
        for field in inputs:
            src = cfg.fields.get(field, field)
            if src not in row:
                raise DataError(f"{where}: no field '{src}'" + (
                    f" (mapped from '{field}')" if src != field else
                    f"; map it with {KEY}.fields: {{{field}: <field>}}")
                    + f"; fields present: {sorted(row)}")
            value = row[src]
            if field == "choices":
                if not isinstance(value, list | tuple) or not value:
                    raise DataError(f"{where}: field '{src}' (choices) must be a non-empty list")
                rec[field] = [_text(f"{where} choice {i}", field, src, v)
                              for i, v in enumerate(value)]
            else:
                rec[field] = _text(where, field, src, value)
        out.append(rec)
    if not out:
        raise DataError(f"{KEY}: {name!r} has no records")
    if template:
        check_template(template, out, task, label_names, KEY)
    return out
