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
"""

from __future__ import annotations

import copy
import csv
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fedkt.config import DatasetConfig
from fedkt.data.dataset import DataError, Dataset
from fedkt.data.formatting import check_template
from fedkt.data.image_records import is_image_source, load_image_records

Task = Literal["multiple_choice", "classification", "generation", "image_classification"]
TASKS: tuple[str, ...] = ("multiple_choice", "classification", "generation",
                          "image_classification")

VENDORED = Path(__file__).resolve().parent / "vendored"

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
# Without label_names, classes are "0".."max label": refuse absurd maxima (a typo, an id).
_MAX_UNNAMED_CLASSES = 10_000


# --------------------------------------------------------------------------- built-ins


@dataclass(frozen=True)
class _Builtin:
    description: str
    task: str
    folder: str
    splits: tuple[str, ...]  # first one is the default
    fields: dict[str, str]
    label_names: tuple[str, ...] | None = None
    label_file: str | None = None  # tab-separated "id<TAB>name" lines
    split_fields: dict[str, dict[str, str]] = field(default_factory=dict)
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    template: str | None = None


_INTENTS = (
    "add_to_playlist",
    "book_restaurant",
    "get_weather",
    "play_music",
    "search_screening_event",
    "search_creative_work",
    "rate_book",
)


def _intent_row(row: dict[str, Any]) -> dict[str, Any]:
    """BIG-bench intent_recognition row -> classification row over the 7 intents."""
    if list(row.get("choices", [])) != list(_INTENTS):
        raise DataError(f"unexpected intent choices {row.get('choices')!r}")
    text = str(row.get("input", ""))
    text = text.removeprefix("Utterance:").strip()
    return {"text": text, "label": row.get("label")}


_BUILTINS: dict[str, _Builtin] = {
    "dialogsum": _Builtin(
        description="DialogSum dialogue summarisation (generation, Rouge-L); "
        "1,500 of 12,460 train and 200 of 500 test dialogues (test has 3 references)",
        task="generation",
        folder="dialogsum",
        splits=("train", "test"),
        fields={"prompt": "dialogue", "target": "summary"},
        split_fields={
            "test": {
                "prompt": "dialogue",
                "target": "summary1",
                "references": "summary1,summary2,summary3",
            }
        },
        template="Dialogue:\n{prompt}\nSummary:",
    ),
    "social_iqa": _Builtin(
        description="Social IQa commonsense multiple choice (BIG-bench), all 1,954 questions",
        task="multiple_choice",
        folder="bigbench/social_iqa",
        splits=("all",),
        fields={"prompt": "input", "choices": "choices", "label": "label"},
    ),
    "intent_recognition": _Builtin(
        description="SNIPS utterance intent (BIG-bench), 7 classes, all 693 utterances",
        task="classification",
        folder="bigbench/intent_recognition",
        splits=("all",),
        fields={"text": "text", "label": "label"},
        label_names=_INTENTS,
        convert=_intent_row,
    ),
    "tweeteval_hate": _Builtin(
        description="TweetEval hate speech (2 classes); 3,000 of 9,000 train, "
        "999 val, 1,500 of 2,970 test tweets",
        task="classification",
        folder="tweeteval/hate",
        splits=("train", "val", "test"),
        fields={"text": "text", "label": "label"},
        label_file="mapping.txt",
    ),
    "tweeteval_offensive": _Builtin(
        description="TweetEval offensive language (2 classes); 3,000 of 11,916 train, "
        "1,324 val, 860 test tweets",
        task="classification",
        folder="tweeteval/offensive",
        splits=("train", "val", "test"),
        fields={"text": "text", "label": "label"},
        label_file="mapping.txt",
    ),
}


def list_builtin() -> dict[str, str]:
    """Built-in dataset names -> one-line descriptions (with their splits)."""
    out = {}
    for name, b in _BUILTINS.items():
        splits = ", ".join(f"{name}:{s}" for s in b.splits[1:])
        more = f" [{b.task}; default split {b.splits[0]!r}" + (
            f"; also {splits}]" if splits else "]"
        )
        out[name] = b.description + more
    return out


def _resolve_builtin(spec: str) -> tuple[str, _Builtin, str]:
    name, _, split = spec.partition(":")
    if name not in _BUILTINS:
        raise DataError(
            f"unknown built-in dataset {name!r}; allowed: {', '.join(sorted(_BUILTINS))} "
            "(or give 'path' for a local file or 'hf_name' for a Hugging Face dataset)"
        )
    b = _BUILTINS[name]
    split = split or b.splits[0]
    if split not in b.splits:
        raise DataError(
            f"built-in dataset {name!r} has no split {split!r}; splits: {', '.join(b.splits)}"
        )
    return name, b, split


def _read_label_file(path: Path) -> list[str]:
    names: list[str] = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            idx, _, name = line.partition("\t")
            if int(idx) != i:
                raise DataError(f"{path} line {i + 1}: expected label id {i}, got {idx!r}")
            names.append(name.strip())
    return names


# --------------------------------------------------------------------------- readers

# Each reader yields (where, row) where ``where`` names the record for error messages.
_Rows = Iterator[tuple[str, dict[str, Any]]]


def _check_row(where: str, row: Any) -> dict[str, Any]:
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


def _read_jsonl(path: Path) -> _Rows:
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
                yield where, _check_row(where, row)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _read_json(path: Path) -> _Rows:
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
        yield where, _check_row(where, row)


def _read_csv(path: Path) -> _Rows:
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
_READERS: dict[str, Callable[[Path], _Rows]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".csv": _read_csv,
}


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

    def read(path: Path) -> _Rows:
        for n, row in enumerate(fn(path), start=1):
            where = f"{path} record {n}"
            yield where, _check_row(where, row)

    _READERS[suffix.lower()] = read
    clear_cache()  # a dataset read before may read differently now
    return fn


def registered_suffixes() -> list[str]:
    """The file suffixes a local data file may have (``.jsonl``, ``.json``, ``.csv``, and
    those :func:`register_reader` added)."""
    return list(_READERS)


def _suffixes(split: str | None = None) -> str:
    names = [f"'{split}{s}'" if split else s for s in _READERS]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def _read_path(path: Path, split: str) -> tuple[_Rows, Any]:
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
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        raise DataError(f"{path}: unsupported file type {suffix!r}; use {_suffixes()} "
                        "(register_reader adds a reader)")
    return _READERS[suffix](path), features


def _hf_rows(ds: Any, label: str) -> tuple[_Rows, Any]:
    def gen() -> _Rows:
        for n, row in enumerate(ds, start=1):
            yield f"{label} record {n}", dict(row)

    return gen(), getattr(ds, "features", None)


def _read_saved(path: Path, split: str) -> tuple[_Rows, Any]:
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


def read_source(cfg: DatasetConfig) -> tuple[_Rows, Any, str]:
    """Raw rows of a ``path`` or ``hf_name`` source, its features (or None) and its name."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        rows, features = _read_path(path, cfg.hf_split)
        return rows, features, path.stem
    rows, features = _read_hf(cfg)
    return rows, features, str(cfg.hf_name)


def _read_hf(cfg: DatasetConfig) -> tuple[_Rows, Any]:
    import datasets  # local: slow import, only needed here

    label = (
        f"hf:{cfg.hf_name}" + (f"/{cfg.hf_subset}" if cfg.hf_subset else "") + f"[{cfg.hf_split}]"
    )
    try:
        ds = datasets.load_dataset(cfg.hf_name, cfg.hf_subset, split=cfg.hf_split)
    except Exception as exc:  # any loader failure is a data error
        raise DataError(f"could not load Hugging Face dataset {label}: {exc}") from exc
    return _hf_rows(ds, label)


# --------------------------------------------------------------------------- validation


def _as_int(value: Any) -> int | None:
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


def _as_list(value: Any, what: str) -> list[Any]:
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


class _Normaliser:
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
        turns = _as_list(row[src], what)
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
                items = _as_list(value, f"{where}: field {self._name(name)}")
                if not items:
                    raise DataError(f"{where}: field {self._name(name)} is an empty list")
                rec[name] = [self._text(f"{where} item {i}", name, v) for i, v in enumerate(items)]
            elif name == "label":
                rec["label"] = self._label(where, value, rec)
        extra = {k: v for k, v in row.items() if k not in used and isinstance(v, str | int | float)}
        if extra:
            rec["extra"] = extra
        return rec

    def _label(self, where: str, value: Any, rec: dict[str, Any]) -> int:
        what = f"{where}: label {self._name('label')}"
        label = _as_int(value)
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


# --------------------------------------------------------------------------- loading


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

    Results are cached in-process (keyed on the config's JSON and the file's mtime);
    each call returns its own copy of the records.
    """
    ds = _load_cached(cfg.model_dump_json(), _source_stamp(cfg))
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
def _load_cached(cfg_json: str, stamp: tuple[Any, ...]) -> Dataset:
    del stamp  # part of the cache key only
    return _load(DatasetConfig.model_validate_json(cfg_json))


def _load(cfg: DatasetConfig) -> Dataset:
    if is_image_source(cfg):
        return load_image_records(cfg)
    label_names = list(cfg.label_names) if cfg.label_names is not None else None
    template = cfg.template
    convert = None
    if cfg.name:
        name, b, split = _resolve_builtin(cfg.name)
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
            builtin_names = _read_label_file(folder / b.label_file)
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
        rows, features = _read_path(folder / f"{split}.jsonl", split)
        ds_name = cfg.name if ":" in cfg.name else name
        id_prefix = f"{name}:{split}:"
    else:
        if cfg.task is None:
            raise DataError(
                f"task is required for a 'path' or 'hf_name' dataset; one of {', '.join(TASKS)}"
            )
        task = cfg.task
        fields = dict(cfg.fields)
        rows, features, ds_name = read_source(cfg)
        id_prefix = f"{ds_name}:"
        if label_names is None and task == "classification":
            label_names = _class_label_names(features, fields.get("label", "label"))

    norm = _Normaliser(task, fields, label_names, id_prefix)
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
    if template:
        check_template(template, records, task, label_names, cfg.path or ds_name)
    return Dataset(
        name=ds_name, task=task, records=records, label_names=label_names, template=template
    )


def _class_label_names(features: Any, label_field: str) -> list[str] | None:
    """Names of a ``datasets.ClassLabel`` label column, if it is one."""
    if features is None:
        return None
    feat = features.get(label_field) if hasattr(features, "get") else None
    names = getattr(feat, "names", None)
    return list(names) if names else None
