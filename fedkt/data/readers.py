"""Readers of local and Hugging Face data sources: raw rows, each named for errors.

A reader yields ``(where, row)``: ``where`` names the record (file, record number,
line) for error messages; ``row`` is a dict of the source's fields.  ``.jsonl``,
``.json`` and ``.csv`` are built in; :func:`register_reader` adds a suffix.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from fedkt.config import DatasetConfig
from fedkt.data.dataset import DataError

__all__ = ["Reader", "Rows", "check_row", "generation", "read_path", "read_source",
           "register_reader", "registered_suffixes"]

# Each reader yields (where, row) where ``where`` names the record for error messages.
Rows = Iterator[tuple[str, dict[str, Any]]]


def check_row(where: str, row: Any) -> dict[str, Any]:
    """``row`` if it is a dict, else a :class:`DataError` naming the record."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with named fields, got {type(row).__name__}")
    return row


def _not_utf8(path: Path) -> DataError:
    """The error for a file that is not UTF-8, naming the first bad line."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return DataError(f"{path} line {line}: not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start}); save the file as UTF-8")
    return DataError(f"{path}: not UTF-8 text; save the file as UTF-8")


def _read_jsonl(path: Path) -> Rows:
    try:
        with path.open(encoding="utf-8-sig") as fh:
            n = 0
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                n += 1
                where = f"{path} record {n} (line {lineno})"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
                    ) from None
                except ValueError as exc:  # e.g. an integer of more than 4300 digits
                    raise DataError(f"{where}: not valid JSON ({exc})") from None
                yield where, check_row(where, row)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _read_json(path: Path) -> Rows:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(
                f"{path}: expected a list of records, or an object holding exactly one list "
                f"of records; found list keys {lists}"
            )
        data = data[lists[0]]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of records, got {type(data).__name__}")
    for n, row in enumerate(data, start=1):
        where = f"{path} record {n}"
        yield where, check_row(where, row)


def _read_csv(path: Path) -> Rows:
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            if not reader.fieldnames:
                raise DataError(f"{path}: empty CSV file (expected a header row)")
            for n, row in enumerate(reader, start=1):
                where = f"{path} record {n} (line {reader.line_num})"
                if None in row:
                    raise DataError(
                        f"{where}: more values than header columns {reader.fieldnames}")
                yield where, dict(row)
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except csv.Error as exc:  # e.g. a field over csv's size limit
            raise DataError(f"{path} line {reader.line_num + 1}: not valid CSV ({exc})") from None


# suffix (".jsonl") -> reader; built-ins below, more with register_reader.
_READERS: dict[str, Callable[[Path], Rows]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".csv": _read_csv,
}
_GENERATION = [0]  # bumped by register_reader: datasets loaded before may read differently


def generation() -> int:
    """How many times :func:`register_reader` ran (part of the loaded-dataset cache key)."""
    return _GENERATION[0]



Reader = Callable[[Path], Iterable[dict[str, Any]]]


def register_reader(suffix: str, fn: Reader) -> Reader:
    """Make ``fn`` read local data files ending in ``suffix`` (``".parquet"``).

    ``fn(path)`` returns or yields the file's rows, each a dict of its fields (mapped to
    fedkt's with ``data.dataset.fields`` as any source's); a folder given as
    ``data.dataset.path`` finds ``<split><suffix>`` too.  A row that is not a dict fails
    the load, naming the file and the record.  Registering a suffix again replaces its
    reader.  A Flower client loads its data itself: import the module that registers the
    reader there too (``FEDKT_PLUGINS``).
    """
    if not (isinstance(suffix, str) and re.fullmatch(r"\.[A-Za-z0-9_-]+", suffix)):
        raise ValueError(f"register_reader: suffix {suffix!r} must be a file suffix such as "
                         "'.parquet' (a dot, then letters, digits, '_' or '-')")
    if not callable(fn):
        raise TypeError(f"register_reader({suffix!r}): fn must be a function of the file's "
                        f"path, got {type(fn).__name__}")

    def read(path: Path) -> Rows:
        for n, row in enumerate(fn(path), start=1):
            where = f"{path} record {n}"
            yield where, check_row(where, row)

    _READERS[suffix.lower()] = read
    _GENERATION[0] += 1  # a dataset read before may read differently now
    return fn


def registered_suffixes() -> list[str]:
    """The file suffixes a local data file may have (``.jsonl``, ``.json``, ``.csv``, and
    those :func:`register_reader` added)."""
    return list(_READERS)


def _suffixes(split: str | None = None) -> str:
    names = [f"'{split}{s}'" if split else s for s in _READERS]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def read_path(path: Path, split: str) -> tuple[Rows, Any]:
    """Rows from a file, a folder of split files, or a ``save_to_disk`` folder."""
    if not path.exists():
        raise DataError(f"data file not found: {path}")
    features = None
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return _read_saved(path, split)
        for suffix in _READERS:
            candidate = path / f"{split}{suffix}"
            if candidate.is_file():
                path = candidate
                break
        else:
            raise DataError(
                f"{path} is a folder without a {_suffixes(split)} file and is not a "
                "`datasets` save_to_disk folder"
            )
    if not path.is_file():  # reading a FIFO or a device would block or never end
        raise DataError(f"{path}: not a regular file (a FIFO, socket or device); give a data "
                        "file or a folder of them")
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        raise DataError(f"{path}: unsupported file type {suffix!r}; use {_suffixes()} "
                        "(register_reader adds a reader)")
    return _READERS[suffix](path), features


def _hf_rows(ds: Any, label: str) -> tuple[Rows, Any]:
    def gen() -> Rows:
        for n, row in enumerate(ds, start=1):
            yield f"{label} record {n}", dict(row)

    return gen(), getattr(ds, "features", None)


def _read_saved(path: Path, split: str) -> tuple[Rows, Any]:
    import datasets  # local: slow import, only needed here

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # any loader failure is a data error
        raise DataError(f"could not load saved dataset {path}: {exc}") from exc
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: no split {split!r}; splits: {', '.join(ds)}")
        ds = ds[split]
    return _hf_rows(ds, f"{path}[{split}]")


def read_source(cfg: DatasetConfig) -> tuple[Rows, Any, str]:
    """Raw rows of a ``path`` or ``hf_name`` source, its features (or None) and its name."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        rows, features = read_path(path, cfg.hf_split)
        return rows, features, path.stem
    rows, features = _read_hf(cfg)
    return rows, features, str(cfg.hf_name)


def _read_hf(cfg: DatasetConfig) -> tuple[Rows, Any]:
    import datasets  # local: slow import, only needed here

    label = (
        f"hf:{cfg.hf_name}" + (f"/{cfg.hf_subset}" if cfg.hf_subset else "") + f"[{cfg.hf_split}]"
    )
    try:
        ds = datasets.load_dataset(cfg.hf_name, cfg.hf_subset, split=cfg.hf_split)
    except Exception as exc:  # any loader failure is a data error
        raise DataError(f"could not load Hugging Face dataset {label}: {exc}") from exc
    return _hf_rows(ds, label)
