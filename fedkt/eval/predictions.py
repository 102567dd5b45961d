"""Per-example predictions: what every evaluation writes beside its metrics.

An evaluation function (``evaluate_causal_lm``, the encoder and image classifiers'
evaluations) builds a :class:`Predictions` table, one row per test example, and
hands it to :func:`emit`.  Nothing happens unless someone is listening: the run
loop (server side) and the client dispatch (client side) open a :func:`capture`
around evaluations, so methods never deal with predictions at all.  A method
that evaluates two models for one participant (FedSP's LLM and auxiliary model)
names the second with :func:`scope`, the same prefix its metric keys carry
(``aux_accuracy``); a server that reports a second participant (FedCoLLM's
``global_slm``) scopes it with that participant's name.

Columns (lists of equal length):

=============  =============================================================
``id``         the test record's id (stable across runs of the same data)
``gold``       gold label index; for generation the first reference text
``pred``       predicted label index (argmax of ``scores``); generated text
``pred_norm``  multiple choice / classification: argmax of the length-normalised scores
``scores``     multiple choice / classification: per-choice log-likelihoods
``rougeL``     generation: the example's Rouge-L (0-100) against its references
=============  =============================================================

``meta`` says how to turn the columns into the run's metrics: ``task`` and, for
classification, ``labels`` (the classes macro-F1 averages over) and
``positive_label``.  On disk a table is gzipped, column-oriented JSON
(``predictions/round_0003/client_0.json.gz``): a 1,000-item, 7-choice
multiple-choice test takes about 40 kB.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedkt.infra.progress import current_scope, scope  # re-exported
from fedkt.tracking.folder import PREDICTIONS_DIR, atomic_write

__all__ = [
    "PREDICTIONS_DIR",
    "Predictions",
    "capture",
    "current_scope",
    "emit",
    "pack",
    "prediction_files",
    "file_name_part",
    "read_predictions",
    "scope",
    "unpack",
    "write_predictions",
]

_DIGITS = 4  # decimals kept of log-likelihoods and Rouge-L
# A participant or scope name as part of a file name: no '/', '.', '..', control character
# or overlong name, whoever sent it.
_FILE_NAME_PART = re.compile(r"[A-Za-z0-9_-]{1,64}")
# What a predictions file read back from a run folder may inflate to (a 1,000-item,
# 7-choice table is about 0.2 MB): a planted gzip bomb costs at most this much memory.
READ_MAX_BYTES = 64 << 20


@dataclass
class Predictions:
    """One evaluation's per-example table (see the module docstring)."""

    columns: dict[str, list[Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "id" not in self.columns:
            raise ValueError("predictions need an 'id' column")
        lengths = {k: len(v) for k, v in self.columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"prediction columns differ in length: {lengths}")
        self.columns["id"] = [str(i) for i in self.columns["id"]]

    def __len__(self) -> int:
        return len(self.columns["id"])

    @property
    def ids(self) -> list[str]:
        return self.columns["id"]

    def to_json(self) -> dict[str, Any]:
        cols = {}
        for key, values in self.columns.items():
            cols[key] = [_rounded(v) for v in values]
        return {"meta": self.meta, "columns": cols}

    def to_bytes(self) -> bytes:
        """Gzipped JSON (the same table always gives the same bytes)."""
        return _gzip_json(self.to_json())

    @classmethod
    def from_json(cls, data: Any, source: str = "predictions") -> Predictions:
        if not isinstance(data, dict) or not isinstance(data.get("columns"), dict):
            raise ValueError(f"{source}: not a predictions table (no 'columns' mapping)")
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"{source}: 'meta' must be a mapping")
        try:
            return cls({str(k): list(v) for k, v in data["columns"].items()}, dict(meta))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def from_bytes(cls, blob: bytes, source: str = "predictions",
                   max_bytes: int | None = None) -> Predictions:
        return cls.from_json(_gunzip_json(blob, source, max_bytes, "the bound for files read "
                                          "back"), source)


def _gzip_json(data: Any) -> bytes:
    """Compact JSON, gzipped with ``mtime=0`` so equal data gives equal bytes."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)


def _gunzip_json(blob: bytes, source: str, max_bytes: int | None = None,
                 bound: str = "runtime.limits.predictions_bytes") -> Any:
    """Gzipped JSON; with ``max_bytes``, decompressing stops there (a gzip bomb) with a
    ``ValueError`` naming ``source`` (and ``bound``, what set the limit)."""
    try:
        if max_bytes is None:
            text = gzip.decompress(blob)
        else:
            inflate = zlib.decompressobj(wbits=31)  # gzip framing
            text = inflate.decompress(blob, max_bytes + 1)
            if len(text) > max_bytes:
                raise ValueError(f"{source}: predictions decompress to more than {max_bytes} "
                                 f"bytes ({bound})")
            if not inflate.eof:
                raise EOFError("the gzip stream is truncated")
        return json.loads(text.decode())
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{source}: predictions are not gzipped JSON ({exc})") from None


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, _DIGITS)
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


# --------------------------------------------------------------------------- capture

_SINK: ContextVar[dict[str, Predictions] | None] = ContextVar("fedkt_predictions", default=None)


@contextmanager
def capture() -> Iterator[dict[str, Predictions]]:
    """Collect every table emitted inside the block, keyed by scope (``""``: unscoped)."""
    sink: dict[str, Predictions] = {}
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def emit(columns: dict[str, Sequence[Any]], **meta: Any) -> None:
    """Hand a table to the innermost :func:`capture` (nothing happens outside one)."""
    sink = _SINK.get()
    if sink is None:
        return
    sink[current_scope()] = Predictions({k: list(v) for k, v in columns.items()}, meta)


# --------------------------------------------------------------------------- files


def file_name_part(name: str, what: str) -> str:
    """``name`` (a participant or scope name) if it is safe as part of a file name (1 to 64
    letters, digits, ``_`` and ``-``), else ``ValueError`` naming ``what``."""
    if not (isinstance(name, str) and _FILE_NAME_PART.fullmatch(name)):
        shown = repr(name[:40] + ("..." if len(name) > 40 else "")) if isinstance(name, str) \
            else type(name).__name__
        raise ValueError(f"{what} {shown} is not a file name (1 to 64 letters, digits, _ "
                         "and -)")
    return name


def pack(tables: dict[str, Predictions]) -> bytes:
    """Several scopes' tables as one gzipped blob (how a client sends them back)."""
    return _gzip_json({k: t.to_json() for k, t in tables.items()})


def unpack(blob: bytes, source: str = "predictions", max_bytes: int | None = None
           ) -> dict[str, Predictions]:
    """Inverse of :func:`pack`; a malformed blob (or one that decompresses to more than
    ``max_bytes``), or a scope name that is no file name (:func:`file_name_part`), raises
    ``ValueError`` naming ``source``."""
    data = _gunzip_json(blob, source, max_bytes)
    if not isinstance(data, dict):
        raise ValueError(f"{source}: predictions must map scopes to tables")
    for key in data:
        if key:
            file_name_part(key, f"{source}: scope")
    return {str(k): Predictions.from_json(v, f"{source}, scope {k!r}") for k, v in data.items()}


def _file_name(participant: str, scope_name: str) -> str:
    file_name_part(participant, "predictions: participant")
    if scope_name:
        file_name_part(scope_name, f"predictions of {participant}: scope")
    return f"{participant}.{scope_name}.json.gz" if scope_name else f"{participant}.json.gz"


def round_dir(run_dir: Path | str, rnd: int) -> Path:
    return Path(run_dir) / PREDICTIONS_DIR / f"round_{rnd:04d}"


def write_predictions(run_dir: Path | str, rnd: int, participant: str,
                      tables: dict[str, Predictions | bytes]) -> list[Path]:
    """Write one participant's tables of round ``rnd`` (atomically); returns the files."""
    folder = round_dir(run_dir, rnd)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for scope_name, table in tables.items():
        blob = table if isinstance(table, bytes) else table.to_bytes()
        path = folder / _file_name(participant, scope_name)
        atomic_write(path, blob, durable=False)
        written.append(path)
    return written


def write_client_predictions(run_dir: Path | str, rnd: int,
                             by_client: dict[int, dict[str, Predictions]],
                             test_ids: set[str]) -> list[int]:
    """Write each client's per-example tables of round ``rnd``; returns the clients written.

    A client's tables whose ids are not all ``test_ids`` of the run (forged ids, or
    another split's) are not written, with a warning naming the client: paired
    comparisons pair on those ids, and one reply must not make the whole run unpairable."""
    import logging

    log = logging.getLogger("fedkt")
    written = []
    for cid, tables in sorted(by_client.items()):
        if not tables:
            continue
        seen = {i for t in tables.values() for i in t.ids}
        foreign = sorted(seen - test_ids)
        if foreign:
            log.warning("round %d: not writing client %d's predictions: %d of %d ids are not "
                        "test ids of this run (e.g. %r)", rnd, cid, len(foreign), len(seen),
                        foreign[0][:40])
            continue
        write_predictions(run_dir, rnd, f"client_{cid}", tables)
        written.append(cid)
    return written


def read_predictions(path: Path | str, max_bytes: int = READ_MAX_BYTES) -> Predictions:
    """A predictions file of a run folder; one larger than ``max_bytes``, or inflating
    beyond it (a gzip bomb), is a ``ValueError`` naming the file, read no further."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path}: predictions file of {size} bytes, more than {max_bytes} "
                         "(the bound for files read back)")
    return Predictions.from_bytes(path.read_bytes(), str(path), max_bytes)


def prediction_files(run_dir: Path | str) -> dict[tuple[int, str, str], Path]:
    """``{(round, participant, scope): path}`` of every table in a run folder."""
    out: dict[tuple[int, str, str], Path] = {}
    root = Path(run_dir) / PREDICTIONS_DIR
    if not root.is_dir():
        return out
    for folder in sorted(root.glob("round_*")):
        try:
            rnd = int(folder.name.split("_", 1)[1])
        except ValueError:
            continue
        for path in sorted(folder.glob("*.json.gz")):
            stem = path.name[: -len(".json.gz")]
            participant, _, scope_name = stem.partition(".")
            out[(rnd, participant, scope_name)] = path
    return out
