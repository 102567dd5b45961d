"""Typed payloads: what a server and its clients send each other.

A :class:`Payload` is a flat mapping from names to tensors, tensor dicts (state
dicts, adapters, top-K logits) or JSON-able values (numbers, strings, metric
dicts).  Every transport moves payloads as the bytes :func:`dumps` makes, so
byte counts are measured on exactly what travels and every runtime delivers
bit-identical tensors.

Wire format: ``b"FKT1"`` + 8-byte little-endian header length + JSON header +
a safetensors blob holding every tensor.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

MAGIC = b"FKT1"
_SEP = "\x1f"  # joins a state-dict name and its keys inside the safetensors blob


class PayloadError(ValueError):
    """A payload is malformed; the message names the sender and the field."""


class Payload(dict[str, Any]):
    """A message body.  Values: Tensor, dict[str, Tensor], or JSON-able data."""

    def tensor(
        self,
        key: str,
        *,
        source: str = "peer",
        shape: Iterable[int | None] | None = None,
        dtype: torch.dtype | Iterable[torch.dtype] | None = None,
        finite: bool = True,
        low: float | None = None,
        high: float | None = None,
    ) -> torch.Tensor:
        """Return ``self[key]`` after checking it; ``None`` in ``shape`` matches any size."""
        if key not in self:
            raise PayloadError(f"{source}: payload has no field {key!r} (fields: {sorted(self)})")
        value = self[key]
        if not isinstance(value, torch.Tensor):
            raise PayloadError(f"{source}: field {key!r} should be a tensor, got {type(value).__name__}")
        check_tensor(value, f"{source}: field {key!r}", shape=shape, dtype=dtype, finite=finite,
                     low=low, high=high)
        return value

    def state(self, key: str, *, source: str = "peer", like: dict[str, torch.Tensor] | None = None,
              finite: bool = True) -> dict[str, torch.Tensor]:
        """Return a tensor dict; with ``like``, keys, shapes and dtypes must match it."""
        if key not in self:
            raise PayloadError(f"{source}: payload has no field {key!r} (fields: {sorted(self)})")
        state = self[key]
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise PayloadError(f"{source}: field {key!r} should be a dict of tensors")
        if like is not None:
            check_state_like(state, like, f"{source}: field {key!r}")
        if finite:
            for name, t in state.items():
                check_tensor(t, f"{source}: field {key!r}[{name!r}]", finite=True)
        return state

    def number(self, key: str, *, source: str = "peer", low: float | None = None) -> float:
        value = self.get(key)
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or (isinstance(value, int) and abs(value) >= 2**1024)  # float() overflows
                or not math.isfinite(value)):
            try:
                shown = repr(value)[:80]
            except ValueError:  # an int too long to print, or a container holding one
                shown = f"a {type(value).__name__} too large to show"
            raise PayloadError(f"{source}: field {key!r} should be a finite number, got {shown}")
        if low is not None and value < low:
            raise PayloadError(f"{source}: field {key!r} = {value} is below {low}")
        return float(value)


def check_tensor(
    t: torch.Tensor,
    what: str,
    *,
    shape: Iterable[int | None] | None = None,
    dtype: torch.dtype | Iterable[torch.dtype] | None = None,
    finite: bool = True,
    low: float | None = None,
    high: float | None = None,
) -> None:
    """Raise :class:`PayloadError` naming ``what`` unless ``t`` has the expected form."""
    if shape is not None:
        want = list(shape)
        if t.dim() != len(want) or any(w is not None and w != s for w, s in zip(want, t.shape, strict=False)):
            shown = tuple("*" if w is None else w for w in want)
            raise PayloadError(f"{what}: shape {tuple(t.shape)}, expected {shown}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            raise PayloadError(f"{what}: dtype {t.dtype}, expected one of {allowed}")
    if finite and t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise PayloadError(f"{what}: {bad} non-finite values (NaN/Inf)")
    if t.numel() and (low is not None or high is not None):
        lo, hi = t.min().item(), t.max().item()
        if (low is not None and lo < low) or (high is not None and hi > high):
            raise PayloadError(f"{what}: values in [{lo}, {hi}], allowed [{low}, {high}]")


def check_state_like(state: dict[str, torch.Tensor], like: dict[str, torch.Tensor], what: str) -> None:
    """Keys, shapes and dtypes of ``state`` must equal those of ``like``."""
    missing, extra = sorted(set(like) - set(state)), sorted(set(state) - set(like))
    if missing or extra:
        raise PayloadError(f"{what}: missing keys {missing[:5]}, unexpected keys {extra[:5]}")
    for k, ref in like.items():
        check_tensor(state[k], f"{what}[{k!r}]", shape=ref.shape, dtype=ref.dtype, finite=False)


# ------------------------------------------------------------------------- wire format


def dumps(payload: dict[str, Any]) -> bytes:
    """Serialise a payload to bytes (tensors in safetensors, the rest in JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    for key, value in payload.items():
        if _SEP in key:
            raise PayloadError(f"payload key {key!r} contains a reserved character")
        if isinstance(value, torch.Tensor):
            tensors[key] = value.detach().cpu().contiguous()
            kinds[key] = "tensor"
        elif isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            for sub, t in value.items():
                tensors[f"{key}{_SEP}{sub}"] = t.detach().cpu().contiguous()
            kinds[key] = "state"
        else:
            meta[key] = value
    try:
        header = json.dumps({"meta": meta, "kinds": kinds}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload has a value that is not JSON-able or not finite: {exc}") from None
    blob = st_save(tensors) if tensors else b""
    return MAGIC + struct.pack("<Q", len(header)) + header + blob


def loads(data: bytes, source: str = "peer") -> Payload:
    """Parse bytes made by :func:`dumps`; raise :class:`PayloadError` if malformed."""
    if len(data) < 12 or data[:4] != MAGIC:
        raise PayloadError(f"{source}: not a fedkt payload (bad magic bytes)")
    (n,) = struct.unpack("<Q", data[4:12])
    try:
        header = json.loads(data[12 : 12 + n])
        # In name order: safetensors hands tensors back in an order that changes from call
        # to call, and sums over a state's tensors must not depend on it.
        tensors = dict(sorted(st_load(bytes(data[12 + n :])).items())) \
            if len(data) > 12 + n else {}
    except Exception as exc:  # noqa: BLE001 - any parse failure is a malformed payload
        raise PayloadError(f"{source}: malformed payload: {exc}") from None
    if not (isinstance(header, dict) and isinstance(header.get("meta"), dict)
            and isinstance(header.get("kinds"), dict)):
        raise PayloadError(f"{source}: malformed payload: the header must hold 'meta' and "
                           "'kinds' objects")
    out = Payload(header["meta"])
    for key, kind in header["kinds"].items():
        if kind not in ("tensor", "state"):
            raise PayloadError(f"{source}: malformed payload: field {key!r} has unknown kind "
                               f"{str(kind)[:40]!r} (expected 'tensor' or 'state')")
        if kind == "tensor":
            if key not in tensors:
                raise PayloadError(f"{source}: malformed payload: tensor field {key!r} is "
                                   "missing from the data")
            out[key] = tensors[key]
        else:
            prefix = key + _SEP
            out[key] = {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}
    return out


def nbytes(payload: dict[str, Any]) -> int:
    """Size in bytes of the serialised payload."""
    return len(dumps(payload))
