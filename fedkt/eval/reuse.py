"""Compute nothing twice: evaluations and knowledge keyed by what decides them, and reused.

An evaluation (its metrics and per-example predictions) and a model's knowledge on a
fixed public set (FedMKT's top-K logits, choice posteriors, KOALA's teacher logits) are
functions of a few inputs.  Each is stored in fedkt's cache under a key (SHA-256) of all
of them, and a repeated key reads the stored result instead of running the model:

* the model (:func:`model_digest`): its class and module tree (``repr``), its Hugging
  Face and PEFT configs, and every parameter and buffer (name, dtype, shape, device type
  and bytes).  Trainable tensors are hashed on every call; frozen ones (a base model) once
  per process and again whenever torch records an in-place change to them (their version
  counter), so a frozen 135M-parameter base costs its hashing once.  An evaluation's key
  takes a fresh LoRA adapter's A (its B all zeros, as PEFT starts it) by its shape only:
  it decides no output, so round 0 of a fold's training seeds is one computation;
* the tokenizer (:func:`tokenizer_digest`): its vocabulary and merges, special tokens,
  chat template and settings;
* the inputs: test records (ids and every field), or a public set's token ids, or an
  input tensor's bytes;
* the settings: task, labels, template, batch size, maximum length, tokens to generate,
  positive label, class groups, chat format; for knowledge K, the loss reduction, the
  temperature;
* the precision (the autocast dtype in force, if any) and the device;
* how the numbers are computed now (:func:`fedkt.infra.environment.numerics`, read when
  the key is made): torch's intra-op and inter-op thread counts (a bf16 matrix product
  split over another number of threads rounds otherwise), float32 matrix precision,
  oneDNN and TF32 switches, and the variables that pick kernels (``ONEDNN_MAX_CPU_ISA``,
  ``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, ...:
  :data:`fedkt.infra.environment.KERNEL_ENV`);
* the code (:func:`code_digest`): every fedkt source file but those of the packages that
  only read finished runs (:func:`fedkt.infra.environment.source_digest`, without
  :data:`fedkt.infra.environment.READERS`: ``fedkt/evidence``), the versions of torch,
  transformers and peft, and what picks the kernels (torch's CPU capability, the CPU's
  matrix flags such as AMX, ``ONEDNN_MAX_CPU_ISA``, the GPU:
  :func:`fedkt.infra.environment.kernels`).

A result computed under other settings has another key: it is computed, never served.

Entries live under ``$FEDKT_REUSE_CACHE`` (default ``$FEDKT_CACHE/reuse``): ``eval/`` one
gzipped JSON file per evaluation, ``knowledge/`` one safetensors file per knowledge set,
``train/`` one per plain training (:func:`fedkt.train.lm.train_lm`: the trained adapter).
They are written through :func:`fedkt.infra.cache.cached` (one builder per key, the others
wait and read; published by one rename), so ``fedkt suite run --jobs N``, several suites
and a killed run are safe.  Deleting the folder is always safe.  The store never stops or
stalls a run: one that cannot be written (a full disk) is warned about once, naming it,
and results are computed without it; a run that waits for an entry another process
builds says so at WARNING (the entry, the builder's pid) and computes the result itself
once the builder is dead or stopped, or after ``$FEDKT_REUSE_WAIT`` seconds (default
300).

Every entry is checked before it is used: it must parse, hold finite metrics (or
tensors), a finite ``seconds`` and well-formed tables, and carry the SHA-256 of its key
and content (``check``).  An entry that fails is recomputed and replaced, with a warning
naming its file.  The check catches damage and an entry copied or edited by hand, not a
writer that recomputes the hash: whoever may write the store decides results (see
docs/security.md, the reuse store's trust boundary).

A reused result takes the place of the computation: the rows and prediction files are
those the computation gives (``eval.reuse: false`` recomputes, rows then equal but for
timings), and the seconds it took when it was computed are reported as
``eval_saved_seconds`` / ``knowledge_saved_seconds`` (:func:`fedkt.infra.timing.saved`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import gzip
import hashlib
import json
import logging
import math
import os
import threading
import weakref
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedkt.eval import predictions
from fedkt.infra.cache import CACHE_ERRORS, EntryBusy, cache_dir, cached
from fedkt.infra.environment import kernels, libraries, numerics, source_digest
from fedkt.infra.timing import now, phase, saved

__all__ = ["ENV", "code_digest", "digest", "evaluation", "model_digest", "stats", "store",
           "tensor_digest", "tensors", "tokenizer_digest"]

# The folder of reuse entries (default: fedkt's cache folder's reuse/).
ENV = "FEDKT_REUSE_CACHE"
# Seconds a run waits for an entry another process builds before computing it itself.
WAIT_ENV = "FEDKT_REUSE_WAIT"
_VERSION = 6  # of the entries' format and what the keys cover (5: fedkt but READERS; 6: a
#                fresh LoRA A by its shape, _inert)

_log = logging.getLogger(__name__)
_lock = threading.Lock()


def store(kind: str) -> Path:
    """The folder of ``kind``'s entries (``eval``, ``knowledge``, ``train``)."""
    root = os.environ.get(ENV)
    path = Path(root).expanduser() / kind if root else cache_dir("reuse", kind)
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------- counters

_STATS = {"computed": 0, "reused": 0}


def stats() -> dict[str, int]:
    """How many results this process computed and reused (a copy; for tests and logs)."""
    with _lock:
        return dict(_STATS)


def _count(name: str) -> None:
    with _lock:
        _STATS[name] += 1


# --------------------------------------------------------------------------- digests

# id(tensor) -> (weak reference, version, data pointer, digest) of frozen tensors
_MEMO: dict[int, tuple[weakref.ref, int, int, str]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    with _lock:
        if key in _MEMO and _MEMO[key][0] is ref:
            del _MEMO[key]


def _bytes_digest(t: torch.Tensor) -> str:
    flat = t.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    h = hashlib.sha256()
    if flat.numel():
        if flat.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        elif flat.is_quantized:
            flat = flat.int_repr()
        h.update(memoryview(flat.resolve_conj().resolve_neg().view(torch.uint8).numpy()))
    return h.hexdigest()


def tensor_digest(t: torch.Tensor, memo: bool = False) -> str:
    """SHA-256 of a tensor's bytes, with its dtype and shape.  ``memo``: remember it while
    the tensor lives and torch records no in-place change to it (its version counter)."""
    head = f"{t.dtype}|{tuple(t.shape)}|"
    if not memo:
        return hashlib.sha256((head + _bytes_digest(t)).encode()).hexdigest()
    try:
        key, version, ptr = id(t), t._version, t.data_ptr()
    except RuntimeError:  # an inference tensor keeps no version counter: hash it every time
        return tensor_digest(t, memo=False)
    with _lock:
        found = _MEMO.get(key)
    if found is not None and found[0]() is t and found[1:3] == (version, ptr):
        return found[3]
    value = hashlib.sha256((head + _bytes_digest(t)).encode()).hexdigest()
    ref = weakref.ref(t, lambda r, key=key: _forget(key, r))
    with _lock:
        _MEMO[key] = (ref, version, ptr, value)
    return value


def _canonical(value: Any) -> Any:
    """``value`` as JSON-able data whose text does not depend on set or dict order."""
    if isinstance(value, torch.Tensor):
        return {"tensor": tensor_digest(value, memo=not value.requires_grad)}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, set | frozenset):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, default=str))
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    if hasattr(value, "model_dump"):  # pydantic
        return _canonical(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__qualname__,
                **_canonical({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})}
    if isinstance(value, Path | torch.dtype | torch.device):
        return str(value)
    if hasattr(value, "tolist"):  # numpy
        return _canonical(value.tolist())
    raise TypeError(f"fedkt.eval.reuse: cannot key a {type(value).__qualname__} (pass the "
                    "settings that decide it instead)")


def digest(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON (mappings sorted; tensors by their bytes)."""
    text = json.dumps(_canonical(value), sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _configs(model: torch.nn.Module) -> dict[str, Any]:
    out: dict[str, Any] = {}
    config = getattr(model, "config", None)
    if hasattr(config, "to_dict"):
        out["config"] = config.to_dict()
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, Mapping):
        out["peft"] = {name: c.to_dict() if hasattr(c, "to_dict") else c
                       for name, c in peft.items()}
        out["active"] = getattr(model, "active_adapters", None) or getattr(
            model, "active_adapter", None)
    return out


def _is_zero(t: torch.Tensor | None) -> bool:
    return t is None or not bool(t.detach().any())


# PEFT's LoRA weights: (A, B) attribute pairs of a LoRA layer, each a dict by adapter.
_LORA_PAIRS = (("lora_A", "lora_B"), ("lora_embedding_A", "lora_embedding_B"))


def _inert(model: torch.nn.Module) -> set[str]:
    """The LoRA A matrices that cannot change the model's outputs: plain LoRA (no variant
    such as DoRA) whose B is all zeros, as PEFT initialises it.  The adapter then adds
    ``B(A(x)) * scaling = 0`` to its base layer whatever A holds (A finite), so an
    evaluation of a fresh adapter is the same under every seed: round 0 of each training
    seed is one computation, not one per seed."""
    inert: set[str] = set()
    for prefix, module in model.named_modules():
        variants = getattr(module, "lora_variant", {}) or {}
        for a_name, b_name in _LORA_PAIRS:
            a_dict, b_dict = getattr(module, a_name, None), getattr(module, b_name, None)
            if not isinstance(a_dict, Mapping | torch.nn.ModuleDict | torch.nn.ParameterDict):
                continue
            for adapter, a in a_dict.items():
                b = b_dict[adapter] if b_dict is not None and adapter in b_dict else None
                if adapter in variants or b is None:
                    continue
                a_w = a if isinstance(a, torch.Tensor) else getattr(a, "weight", None)
                b_w = b if isinstance(b, torch.Tensor) else getattr(b, "weight", None)
                if (a_w is None or b_w is None or not _is_zero(b_w)
                        or not _is_zero(getattr(b, "bias", None))
                        or not bool(torch.isfinite(a_w.detach()).all())):
                    continue
                suffix = "" if isinstance(a, torch.Tensor) else ".weight"
                inert.add(f"{prefix}.{a_name}.{adapter}{suffix}".lstrip("."))
    return inert


def model_digest(model: torch.nn.Module, outputs: bool = False) -> str:
    """What decides a model's outputs: class, module tree, configs, parameters, buffers.

    ``outputs``: the key of what the model computes now (an evaluation), where a LoRA A
    whose B is all zeros (:func:`_inert`) is keyed by its dtype and shape, not its values:
    it decides no output until B moves, and then it is hashed again.  Without it (training
    keys) every value counts: training moves B along A."""
    h = hashlib.sha256()
    h.update(f"{type(model).__module__}.{type(model).__qualname__}\n".encode())
    h.update(repr(model).encode())
    h.update(digest(_configs(model)).encode())
    inert = _inert(model) if outputs else set()
    for kind, named in (("p", model.named_parameters()), ("b", model.named_buffers())):
        for name, t in named:
            if t is None:
                continue
            if kind == "p" and name in inert:
                h.update(f"p|{name}|{t.device.type}|inert|{t.dtype}|{tuple(t.shape)}\n".encode())
                continue
            memo = not t.requires_grad
            h.update(f"{kind}|{name}|{t.device.type}|{tensor_digest(t, memo)}\n".encode())
    return h.hexdigest()


_TOKENIZERS: dict[int, tuple[weakref.ref, int, str]] = {}


def tokenizer_digest(tokenizer: Any) -> str:
    """What decides a tokenizer's ids: its vocabulary and merges (hashed once per process),
    special and added tokens, chat template and settings."""
    if tokenizer is None:
        return ""
    size = len(tokenizer)
    found = _TOKENIZERS.get(id(tokenizer))
    if found is not None and found[0]() is tokenizer and found[1] == size:
        vocab = found[2]
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        text = backend.to_str() if backend is not None else json.dumps(
            tokenizer.get_vocab(), sort_keys=True)
        vocab = hashlib.sha256(text.encode()).hexdigest()
        with contextlib.suppress(TypeError):  # not weak-referenceable: no memo
            _TOKENIZERS[id(tokenizer)] = (weakref.ref(tokenizer), size, vocab)
    return digest({"type": type(tokenizer).__qualname__, "vocab": vocab, "size": size,
                   "repr": repr(tokenizer),
                   "chat_template": getattr(tokenizer, "chat_template", None),
                   "padding_side": getattr(tokenizer, "padding_side", None),
                   "truncation_side": getattr(tokenizer, "truncation_side", None)})


@functools.cache
def code_digest() -> str:
    """fedkt's source files (:func:`fedkt.infra.environment.source_digest`), the versions
    of torch, transformers and peft, and what picks the kernels
    (:func:`fedkt.infra.environment.kernels`: the CPU's capability and matrix flags such as
    AMX, oneDNN's ISA cap, the GPU): a result computed by other code or kernels is never
    reused."""
    return digest({"sources": source_digest(), **libraries(), **kernels()})


def _device(model: torch.nn.Module | None) -> torch.device:
    param = next(model.parameters(), None) if model is not None else None
    return param.device if param is not None else torch.device("cpu")


def _precision(device: torch.device) -> dict[str, Any]:
    """The device and the autocast dtype in force on it (None: none)."""
    kind = device.type
    on = torch.is_autocast_enabled(kind)
    name = str(torch.cuda.get_device_name(device)) if kind == "cuda" else kind
    return {"device": name, "autocast": str(torch.get_autocast_dtype(kind)) if on else None}


def _key(kind: str, model: torch.nn.Module | None, tokenizer: Any, parts: Mapping[str, Any]
         ) -> str:
    outputs = kind == "eval"  # an evaluation is of outputs only; stored tensors may train
    return digest({"format": _VERSION, "kind": kind, "code": code_digest(),
                   "numerics": numerics(),
                   "model": model_digest(model, outputs) if model is not None else None,
                   "tokenizer": tokenizer_digest(tokenizer),
                   **_precision(_device(model)), "parts": parts})


def _wait() -> float:
    """Seconds to wait for an entry another process builds (``$FEDKT_REUSE_WAIT``)."""
    try:
        value = float(os.environ.get(WAIT_ENV, "") or 300.0)
    except ValueError:
        value = 300.0
    return max(0.0, value) if math.isfinite(value) else 300.0


# Stores (folders) already warned about, and unusable entries (path, mtime, size): each
# is warned about once per process.
_WARNED: set[Any] = set()


def _once(what: Any) -> bool:
    """True the first time ``what`` is seen in this process."""
    with _lock:
        if what in _WARNED:
            return False
        _WARNED.add(what)
        return True


def _store_failed(kind: str, exc: OSError) -> None:
    """Warn, once per store folder, that it cannot be used (results are computed instead);
    an entry whose builder did not finish was warned about when it was waited for."""
    if isinstance(exc, EntryBusy):
        return
    root = os.environ.get(ENV)
    folder = Path(root).expanduser() / kind if root else cache_dir("reuse") / kind
    if _once(("store", str(folder))):
        _log.warning("eval.reuse: the reuse store %s cannot be used (%s: %s); computing "
                     "without it (warned once)", folder, type(exc).__name__, exc)
    else:
        _log.debug("eval.reuse: the reuse store %s failed again (%s)", folder, exc)


# --------------------------------------------------------------------------- evaluations


def _plain(value: Any) -> Any:
    """numpy and torch scalars and arrays as Python numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__qualname__} is not JSON serialisable")


class Unstorable(OSError):
    """A result that cannot be stored (it is then used, not stored)."""


def _content_text(data: Any) -> str:
    """An entry's content as canonical JSON text (what its ``check`` hashes)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, sort_keys=True,
                      default=_plain)


def _check(key: str, text: str) -> str:
    return hashlib.sha256(f"{_VERSION}|{key}|{text}".encode()).hexdigest()


def _entry_key(path: Path) -> str:
    """The key an entry's file name carries (``KEY.json.gz``, ``KIND-KEY.safetensors``)."""
    return path.name.split(".", 1)[0].rpartition("-")[2]


def _write_json(path: Path, data: Any, key: str) -> None:
    """The entry ``data`` of ``key`` with its ``check``; tables keep their column order
    (a reused table gives the same bytes as the computed one)."""
    try:
        plain = json.loads(json.dumps(data, ensure_ascii=False, default=_plain))
    except (TypeError, ValueError) as exc:
        raise Unstorable(f"not storable as JSON: {exc}") from None
    text = json.dumps({**plain, "check": _check(key, _content_text(plain))},
                      separators=(",", ":"), ensure_ascii=False)
    path.write_bytes(gzip.compress(text.encode(), compresslevel=6, mtime=0))


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _unusable(path: Path, why: str) -> ValueError:
    """Warn that the entry at ``path`` is recomputed (once per file version: it is read
    before and again after taking its lock), and the error that makes it so."""
    try:
        info = path.stat()
        version: Any = (info.st_mtime_ns, info.st_size, info.st_ino)
    except OSError:
        version = None
    if _once(("entry", str(path), version, why)):
        _log.warning("eval.reuse: %s: %s; recomputing it", path, why)
    return ValueError(f"{path}: {why}")


def _read_json(path: Path) -> Any:
    """A stored evaluation, checked (see the module docstring); else ``ValueError`` naming
    the file, after a warning."""
    try:
        data = json.loads(gzip.decompress(path.read_bytes()).decode())
    except (EOFError, OSError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _unusable(path, f"not a reuse entry ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise _unusable(path, "not a reuse entry (not a JSON object)")
    check = data.pop("check", None)
    metrics, seconds, tables = data.get("metrics"), data.get("seconds"), data.get("tables")
    if not isinstance(metrics, dict) or not all(
            isinstance(k, str) and _finite_number(v) for k, v in metrics.items()):
        raise _unusable(path, "'metrics' is not a mapping of names to finite numbers")
    if not _finite_number(seconds) or seconds < 0:
        raise _unusable(path, f"'seconds' is not a finite number >= 0 ({str(seconds)[:40]!r})")
    if not isinstance(tables, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("columns"), dict)
            and isinstance(t.get("meta"), dict) for t in tables.values()):
        raise _unusable(path, "'tables' is not a mapping of scopes to tables")
    if check != _check(_entry_key(path), _content_text(data)):
        raise _unusable(path, "its content or key does not match its recorded hash "
                              "(changed, copied or planted)")
    return data


def evaluation(enabled: bool, model: torch.nn.Module | None, tokenizer: Any,
               parts: Mapping[str, Any], compute: Callable[[], dict[str, float]]
               ) -> dict[str, float]:
    """``compute()`` (an evaluation: metrics, and per-example tables it emits), or the
    stored result of the same key: ``model`` and ``tokenizer`` (digested), ``parts`` (the
    test items and the scorer's settings), precision and code (the module docstring).
    Either way the tables are emitted to the caller's :func:`~fedkt.eval.predictions.
    capture` as the computation emits them.  ``enabled`` False: just ``compute()``."""
    if not enabled:
        return compute()
    here = predictions.current_scope()
    computed: dict[str, Any] | None = None
    failed = False  # compute() itself raised: its error is the caller's, not the store's

    def build(tmp: Path) -> dict[str, Any]:
        nonlocal computed, failed
        start = now()
        with predictions.capture() as tables:
            try:
                metrics = compute()
            except BaseException:
                failed = True
                raise
        computed = {"metrics": metrics, "seconds": (now() - start).wall,
                    "tables": {("" if name == here else name):
                               {"columns": t.columns, "meta": t.meta}
                               for name, t in tables.items()}}
        _write_json(tmp, computed, key)
        return computed

    with phase("eval"):  # hashing and reading count as evaluation
        try:
            key = _key("eval", model, tokenizer, parts)
            path = store("eval") / f"{key}.json.gz"
            data = cached(path, build, _read_json, wait=_wait())
        except OSError as exc:  # an unwritable or stalled store never stops an evaluation
            if failed:
                raise
            _store_failed("eval", exc)
            if computed is None:
                return compute()
            data = computed
        if data is computed:
            _count("computed")
        else:
            saved("eval", float(data.get("seconds", 0.0)))
            _count("reused")
        for name, table in data["tables"].items():
            with predictions.scope(name or here):
                predictions.emit(table["columns"], **table["meta"])
        return dict(data["metrics"])


# --------------------------------------------------------------------------- knowledge


def tensors(enabled: bool, kind: str, model: torch.nn.Module | None, tokenizer: Any,
            parts: Mapping[str, Any], compute: Callable[[], dict[str, torch.Tensor]],
            *, phase_name: str = "knowledge") -> dict[str, torch.Tensor]:
    """``compute()`` (named CPU tensors: a model's knowledge on a fixed set, or its trained
    weights), or the stored tensors of the same key (``kind``, ``model``, ``tokenizer``,
    ``parts``, precision and code).  Reused, its original seconds count as
    ``<phase_name>_saved_seconds``; hashing and reading count as ``phase_name``."""
    if not enabled:
        return compute()
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file, save_file

    computed: dict[str, torch.Tensor] | None = None
    failed = False  # compute() itself raised: its error is the caller's, not the store's

    def load(p: Path) -> tuple[dict[str, torch.Tensor], float]:
        try:
            with safe_open(str(p), "pt") as fh:
                meta = fh.metadata() or {}
            values = load_file(str(p))
        except (OSError, SafetensorError) as exc:
            raise _unusable(p, f"not a reuse entry ({type(exc).__name__}: {exc})") from None
        try:
            seconds = float(meta.get("seconds", ""))
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise _unusable(p, f"'seconds' is not a finite number >= 0 "
                               f"({str(meta.get('seconds'))[:40]!r})")
        bad = [k for k, v in values.items() if v.is_floating_point() and not v.isfinite().all()]
        if bad:
            raise _unusable(p, f"tensor {bad[0]!r} holds NaN or infinity")
        if meta.get("check") != _check(_entry_key(p), digest(values)):
            raise _unusable(p, "its content or key does not match its recorded hash "
                               "(changed, copied or planted)")
        return values, seconds

    def build(tmp: Path) -> tuple[dict[str, torch.Tensor], float]:
        nonlocal computed, failed
        start = now()
        try:
            computed = compute()
        except BaseException:
            failed = True
            raise
        seconds = (now() - start).wall
        values = {k: v.detach().cpu().contiguous() for k, v in computed.items()}
        try:
            save_file(values, str(tmp), metadata={"seconds": repr(seconds),
                                                  "check": _check(key, digest(values))})
        except SafetensorError as exc:  # safetensors' own I/O errors (a full disk)
            raise Unstorable(f"writing {tmp}: {exc}") from None
        return computed, seconds

    with phase(phase_name):
        try:
            key = _key(kind, model, tokenizer, parts)
            path = store(phase_name) / f"{kind}-{key}.safetensors"
            values, seconds = cached(path, build, load, (*CACHE_ERRORS, SafetensorError),
                                     wait=_wait())
        except OSError as exc:  # an unwritable or stalled store never stops the computation
            if failed:
                raise
            _store_failed(phase_name, exc)
            if computed is None:
                return compute()
            values = computed
    if values is computed:
        _count("computed")
        return values
    saved(phase_name, seconds)
    _count("reused")
    return values

