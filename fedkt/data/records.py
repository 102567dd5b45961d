"""Load records from built-in, local or Hugging Face sources into one normalised form.

A normalised record is a plain dict whose keys depend on the task:

* ``"multiple_choice"``: ``{"prompt": str, "choices": list[str], "label": int}``
* ``"classification"``: ``{"text": str, "label": int}`` (names in ``Dataset.label_names``)
* ``"generation"``: ``{"prompt": str, "target": str}`` and optionally ``"references"``
* a chat prompt: a source row with ``messages`` (``[{"role", "content"}, ...]``, roles
  system/user/assistant) instead of the prompt (``text`` for classification): its last
  user turn is the prompt, the turns before it are kept as ``"messages"`` (see
  :mod:`fedkt.data.formatting`), and for generation a final assistant turn is the
  target when the row has none
* ``"image_classification"``: ``{"image": Tensor [C, H, W] in [0, 1], "label": int}``
  (built-in ``digits`` and image files; see :mod:`fedkt.data.image_records`)

Every record also has ``"id"`` (a stable string naming its source row) and, when the
source row had fields that were not mapped, ``"extra"`` (those fields, usable as
template placeholders).  Every record is validated when loaded, so that a bad file
fails before any training starts, with a message naming the file, record and field.

One job per module: :mod:`~fedkt.data.builtin` (the built-in datasets),
:mod:`~fedkt.data.readers` (files, folders, Hugging Face; :func:`register_reader`),
:mod:`~fedkt.data.normalise` (mapping and validating rows); this module loads a
:class:`DatasetConfig` through them and caches the result.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Literal

from fedkt.config import DatasetConfig
from fedkt.data import readers
from fedkt.data.builtin import VENDORED, read_label_file, resolve_builtin
from fedkt.data.dataset import DataError, Dataset
from fedkt.data.formatting import check_template
from fedkt.data.image_records import is_image_source, load_image_records
from fedkt.data.normalise import Normaliser

__all__ = ["TASKS", "Task", "clear_cache", "load_dataset_records"]

Task = Literal["multiple_choice", "classification", "generation", "image_classification"]
TASKS: tuple[str, ...] = ("multiple_choice", "classification", "generation",
                          "image_classification")

# Without label_names, classes are "0".."max label": refuse absurd maxima (a typo, an id).
_MAX_UNNAMED_CLASSES = 10_000


def _source_stamp(cfg: DatasetConfig) -> tuple[Any, ...]:
    """Changes when a local file changes, so the cache does not serve stale data."""
    if cfg.path is None:
        return ()
    p = Path(cfg.path).expanduser()
    try:
        files = [p, *sorted(p.iterdir())] if p.is_dir() else [p]
        return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    except OSError:
        return ("missing",)


def load_dataset_records(cfg: DatasetConfig) -> Dataset:
    """Load, normalise and validate the records a :class:`DatasetConfig` describes.

    Results are cached in-process (keyed on the config's JSON, the file's mtime and the
    readers registered);
    each call returns its own copy of the records.
    """
    ds = _load_cached(cfg.model_dump_json(), _source_stamp(cfg), readers.generation())
    # Image records hold tensor views of one cached array: copy the dicts, share the
    # (never modified) pixels instead of copying every image on every call.
    records = ([dict(r) for r in ds.records] if ds.task == "image_classification"
               else copy.deepcopy(ds.records))
    return Dataset(
        name=ds.name,
        task=ds.task,
        records=records,
        label_names=list(ds.label_names) if ds.label_names is not None else None,
        template=ds.template,
    )


def clear_cache() -> None:
    """Forget datasets loaded so far."""
    _load_cached.cache_clear()


@functools.lru_cache(maxsize=32)
def _load_cached(cfg_json: str, stamp: tuple[Any, ...], readers_generation: int) -> Dataset:
    del stamp, readers_generation  # parts of the cache key only
    return _load(DatasetConfig.model_validate_json(cfg_json))


def _load(cfg: DatasetConfig) -> Dataset:
    if is_image_source(cfg):
        return load_image_records(cfg)
    label_names = list(cfg.label_names) if cfg.label_names is not None else None
    template = cfg.template
    convert = None
    if cfg.name:
        name, b, split = resolve_builtin(cfg.name)
        if cfg.task and cfg.task != b.task:
            raise DataError(
                f"built-in dataset {name!r} is a {b.task} task; task {cfg.task!r} was given"
            )
        if cfg.fields:
            raise DataError(
                f"built-in dataset {name!r} has fixed fields; 'fields' is only for 'path' "
                "or 'hf_name' sources"
            )
        task = b.task
        fields = b.split_fields.get(split, b.fields)
        folder = VENDORED / b.folder
        builtin_names = list(b.label_names) if b.label_names else None
        if b.label_file:
            builtin_names = read_label_file(folder / b.label_file)
        if label_names is not None and builtin_names is not None:
            if len(label_names) != len(builtin_names):
                raise DataError(
                    f"label_names: {name!r} has {len(builtin_names)} classes "
                    f"{builtin_names}; got {len(label_names)} names"
                )
        else:
            label_names = builtin_names
        template = template or b.template
        convert = b.convert
        rows, features = readers.read_path(folder / f"{split}.jsonl", split)
        ds_name = cfg.name if ":" in cfg.name else name
        id_prefix = f"{name}:{split}:"
    else:
        if cfg.task is None:
            raise DataError(
                f"task is required for a 'path' or 'hf_name' dataset; one of {', '.join(TASKS)}"
            )
        task = cfg.task
        fields = dict(cfg.fields)
        rows, features, ds_name = readers.read_source(cfg)
        id_prefix = f"{ds_name}:"
        if label_names is None and task == "classification":
            label_names = _class_label_names(features, fields.get("label", "label"))

    norm = Normaliser(task, fields, label_names, id_prefix)
    records: list[dict[str, Any]] = []
    for index, (where, row) in enumerate(rows):
        if cfg.max_records is not None and index >= cfg.max_records:
            break
        if convert is not None:
            row = convert(row)
        records.append(norm(where, index, row))
    if not records:
        raise DataError(f"dataset {ds_name!r}: no records found"
                        + (f" in {cfg.path}" if cfg.path else ""))
    if task == "classification" and label_names is None:
        top = max(range(len(records)), key=lambda i: records[i]["label"])
        if records[top]["label"] >= _MAX_UNNAMED_CLASSES:
            raise DataError(
                f"{cfg.path or ds_name} record {top + 1}: label {records[top]['label']} without "
                f"label_names would make {records[top]['label'] + 1} classes; give label_names "
                f"(labels are class indices 0..N-1)")
        label_names = [str(i) for i in range(max(r["label"] for r in records) + 1)]
    if cfg.classes is not None:
        records, label_names = _keep_classes(records, task, label_names, cfg.classes,
                                             cfg.path or ds_name)
    if template:
        check_template(template, records, task, label_names, cfg.path or ds_name)
    return Dataset(
        name=ds_name, task=task, records=records, label_names=label_names, template=template
    )


def _keep_classes(records: list[dict[str, Any]], task: str, label_names: list[str] | None,
                  spec: Any, where: str) -> tuple[list[dict[str, Any]], list[str] | None]:
    """``dataset.classes``: the records of those classes, relabelled 0..k-1 in the spec's
    order, and their names; a :class:`DataError` naming the key otherwise."""
    from fedkt.data.classes import parse_class_spec

    if task != "classification":
        raise DataError(f"dataset.classes: keeps classes of a classification task; {where} is "
                        f"a {task} task")
    n = len(label_names) if label_names is not None else None
    keep = parse_class_spec(spec, n, "dataset.classes")
    new = {c: i for i, c in enumerate(keep)}
    out = [{**r, "label": new[r["label"]]} for r in records if r["label"] in new]
    missing = sorted(set(keep) - {r["label"] for r in records})
    if missing:
        raise DataError(f"dataset.classes: {where} has no record of classes {missing}")
    names = [label_names[c] for c in keep] if label_names is not None else None
    return out, names


def _class_label_names(features: Any, label_field: str) -> list[str] | None:
    """Names of a ``datasets.ClassLabel`` label column, if it is one."""
    if features is None:
        return None
    feat = features.get(label_field) if hasattr(features, "get") else None
    names = getattr(feat, "names", None)
    return list(names) if names else None
