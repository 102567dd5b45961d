"""Mixed precision and CPU threads: the hardware-dependent speed settings.

``training.precision`` (``auto | fp32 | bf16 | fp16``) runs training, scoring and
generation under :func:`torch.autocast`: matrix products run in the low-precision
type while master weights, adapters and optimiser state stay fp32 (models are
never cast; during a training loop a frozen linear layer's weight is held in the
low-precision type it is computed in, :func:`frozen_linears_as`).  ``auto`` is bf16
where the hardware does it natively (a CPU with AVX512-BF16 or AMX, a CUDA GPU with bf16
support), else fp32; a CPU whose oneDNN is capped below AVX512-BF16
(``ONEDNN_MAX_CPU_ISA=AVX2``, to emulate a lower machine kind) counts as one without.
fp16 needs CUDA and trains with loss scaling (:func:`grad_scaler`).

``runtime.torch_threads: null`` means one torch thread per physical core
(:func:`default_threads`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch

from fedkt.errors import ConfigError
from fedkt.infra.environment import BF16_ISAS

__all__ = [
    "PRECISIONS",
    "autocast",
    "autocast_dtype",
    "cpu_supports_bf16",
    "default_threads",
    "frozen_cast",
    "frozen_linears_as",
    "grad_scaler",
    "physical_cores",
    "precision_name",
    "resolve_precision",
    "resolved_precision",
    "set_threads",
    "upcast",
]

log = logging.getLogger("fedkt.precision")

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _isa_cap_allows_bf16() -> bool:
    """False when ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``) caps oneDNN below
    AVX512-BF16, as the emulation of a lower machine kind does."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        cap = os.environ.get(var, "").strip().upper()
        if cap:
            return cap in BF16_ISAS
    return True


def cpu_supports_bf16() -> bool:
    """True when this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16)
    and no ``ONEDNN_MAX_CPU_ISA`` cap keeps oneDNN from them."""
    return _isa_cap_allows_bf16() and _cpu_has_bf16()


@functools.cache
def _cpu_has_bf16() -> bool:
    """The CPU's own flags: AVX512-BF16 or AMX-BF16."""
    try:
        caps = torch.cpu.get_capabilities()
        if caps.get("avx512_bf16") or caps.get("amx_bf16"):
            return True
    except (AttributeError, RuntimeError):  # older torch: fall back to the kernel's flags
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def _device_type(device: torch.device | str | torch.nn.Module | None) -> str:
    """``"cpu"`` / ``"cuda"`` / ... of a device, a device name or a model's parameters."""
    if isinstance(device, torch.nn.Module):
        param = next(device.parameters(), None)
        return param.device.type if param is not None else "cpu"
    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def precision_name(cfg_or_name: Any) -> str:
    """The precision setting of a RunConfig, a TrainingConfig or a name."""
    if isinstance(cfg_or_name, str):
        return cfg_or_name
    training = getattr(cfg_or_name, "training", cfg_or_name)
    name = getattr(training, "precision", None)
    if not isinstance(name, str):
        raise TypeError(f"expected a precision name or a config with training.precision, "
                        f"got {type(cfg_or_name).__name__}")
    return name


def resolve_precision(name: str, device: torch.device | str | torch.nn.Module | None
                      ) -> torch.dtype | None:
    """The autocast dtype of ``training.precision`` ``name`` on ``device`` (None: fp32).

    ``auto``: bf16 on a CPU with native bf16 or a CUDA GPU that supports it, else fp32.
    ``fp16`` needs CUDA; elsewhere it is a :class:`~fedkt.config.ConfigError`.
    """
    if name not in PRECISIONS:
        raise ConfigError(f"training.precision: {name!r} is not one of {', '.join(PRECISIONS)}")
    kind = _device_type(device)
    if name == "auto":
        if kind == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        return torch.bfloat16 if kind == "cpu" and cpu_supports_bf16() else None
    if name == "fp16" and kind != "cuda":
        raise ConfigError(f"training.precision: fp16 needs a CUDA GPU (device is {kind!r}); "
                          "use bf16, fp32 or auto")
    if name == "bf16" and kind == "cpu" and not cpu_supports_bf16():
        _warn_emulated_bf16()
    return _DTYPES[name]


def resolved_precision(name: str, device: torch.device | str | torch.nn.Module | None
                       ) -> str:
    """What ``training.precision`` ``name`` computes in on ``device``, as a name
    (:func:`resolve_precision`'s dtype): ``auto`` becomes ``bf16`` or ``fp32``."""
    dtype = resolve_precision(name, device)
    return next(key for key, value in _DTYPES.items() if value == dtype)


@functools.cache
def _warn_emulated_bf16() -> None:
    """Once per process: bf16 asked for on a CPU that only emulates it."""
    log.warning("training.precision: bf16 on a CPU without native bf16 (no AVX512-BF16 or "
                "AMX) is emulated and several times slower than fp32 (measured 6.7x on an "
                "AVX2 CPU); 'auto' picks fp32 here and bf16 where it is native")


def autocast_dtype(cfg_or_name: Any, device: torch.device | str | torch.nn.Module | None
                   ) -> torch.dtype | None:
    """The type :func:`autocast` computes in on ``device`` (None: fp32, no autocast);
    arguments as :func:`autocast`."""
    return resolve_precision(precision_name(cfg_or_name), device)


@contextlib.contextmanager
def autocast(cfg_or_name: Any, device: torch.device | str | torch.nn.Module | None
             ) -> Iterator[torch.dtype | None]:
    """``torch.autocast`` at the configured precision on ``device`` (a no-op for fp32).

    ``cfg_or_name``: a RunConfig, a TrainingConfig or a precision name; ``device``: a
    device, its name or a model (its parameters' device).  Yields the dtype (or None).
    """
    dtype = autocast_dtype(cfg_or_name, device)
    if dtype is None:
        yield None
        return
    with torch.autocast(_device_type(device), dtype=dtype):
        yield dtype


FROZEN_CAST_ENV = "FEDKT_FROZEN_CAST"  # "0": keep frozen weights fp32 in training loops


@contextlib.contextmanager
def frozen_linears_as(modules: Any, dtype: torch.dtype | None) -> Iterator[int]:
    """Inside: the weight of every frozen ``nn.Linear`` of ``modules`` (a module or a list)
    held as ``dtype``, the autocast type the steps run under; its fp32 tensor is kept aside
    and put back on exit. Yields how many weights it holds so.

    Autocast casts a weight that needs no gradient afresh in every forward, and autograd
    keeps each cast for the backward: a forward of a frozen 135M-parameter model keeps
    another 270 MB of bf16 weights until its backward. Cast once, the forwards share one
    copy. The matrix products see the same bf16 values (the cast is the same), so no number
    changes. A linear weight shared with another parameter (an output layer tied to the
    embedding) is not changed in place: the layer holds its own cast copy inside, and the
    other user (the embedding's lookup) keeps the fp32 tensor. A weight that trains and
    any other layer are left as they are. ``dtype`` None (fp32), or ``FEDKT_FROZEN_CAST=0``:
    nothing changes.
    """
    if dtype is None or os.environ.get(FROZEN_CAST_ENV, "1") == "0":
        yield 0
        return
    mods = [modules] if isinstance(modules, torch.nn.Module) else list(modules)
    owners: dict[int, int] = {}
    for m in mods:  # every module's use of a parameter: a tied weight counts twice
        for _, p in m.named_parameters(remove_duplicate=False):
            owners[p.data_ptr()] = owners.get(p.data_ptr(), 0) + 1
    kept: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    untied: list[tuple[torch.nn.Linear, torch.nn.Parameter]] = []
    try:
        for m in mods:
            for layer in m.modules():  # a layer reached twice has its weight counted twice
                if not isinstance(layer, torch.nn.Linear):
                    continue
                w = layer.weight
                if w.requires_grad or w.dtype != torch.float32:
                    continue
                if owners[w.data_ptr()] > 1:  # tied: this layer's own copy, for inside
                    untied.append((layer, w))
                    layer.weight = torch.nn.Parameter(w.data.to(dtype), requires_grad=False)
                    continue
                kept.append((w, w.data))
                w.data = w.data.to(dtype)
        yield len(kept) + len(untied)
    finally:
        for w, original in kept:
            w.data = original
        for layer, w in untied:
            layer.weight = w


@contextlib.contextmanager
def frozen_cast(cfg_or_name: Any, model: torch.nn.Module) -> Iterator[int]:
    """:func:`frozen_linears_as` at the type :func:`autocast` computes ``model`` in (the
    arguments as :func:`autocast`'s): for an evaluation's or a knowledge pass's forwards,
    which then share one cast copy of each frozen weight instead of each casting it afresh
    (the same numbers; an eval of a LoRA-wrapped SmolLM2-135M in bf16 took about a fifth
    less CPU time: docs/records/performance.md). Enter it inside what digests the model
    (the reuse store's keys), whose weights it changes the type of."""
    with frozen_linears_as(model, autocast_dtype(cfg_or_name, model)) as held:
        yield held


def grad_scaler(cfg_or_name: Any, device: torch.device | str | torch.nn.Module | None
                ) -> torch.amp.GradScaler:
    """A loss scaler for fp16 training (disabled, i.e. a pass-through, otherwise)."""
    dtype = autocast_dtype(cfg_or_name, device)
    kind = _device_type(device)
    return torch.amp.GradScaler(kind, enabled=dtype == torch.float16)


def upcast(t: torch.Tensor) -> torch.Tensor:
    """``t`` as fp32 when it is a 16-bit float (e.g. autocast's output), else unchanged."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


# --------------------------------------------------------------------------- threads


def physical_cores() -> int:
    """Physical cores this process may run on (never more than ``os.cpu_count()``)."""
    total = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    physical = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        pass
    if not physical:
        try:
            physical = int(torch.cpu.get_capabilities().get("num_physical_cores") or 0)
        except (AttributeError, RuntimeError, TypeError, ValueError):
            physical = 0
    per_core = max(1, total // physical) if physical else 1  # SMT threads per core
    return max(1, min(usable // per_core, usable, total))


def default_threads() -> int:
    """Threads for ``runtime.torch_threads: null``: ``$OMP_NUM_THREADS`` when set (e.g. by
    Ray for simulated clients), else one per physical core."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return min(int(env), os.cpu_count() or 1)
    return physical_cores()


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to ``threads`` (None: :func:`default_threads`)."""
    n = threads or default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
