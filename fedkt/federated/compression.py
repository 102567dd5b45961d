"""FedKD dynamic gradient approximation: SVD compression of model updates.

Wu et al., "Communication-efficient federated learning via knowledge distillation",
Nature Communications 13, 2032 (2022), Methods, "Dynamic gradients approximation".

* Eq. 8 keeps the smallest number ``K`` of singular values whose *squared* values
  (the energy) exceed a fraction ``T`` of the total::

      min_K  sum_{i<=K} sigma_i^2 / sum_{i<=Q} sigma_i^2  >  T

  The paper writes a strict ``>``; :func:`energy_rank` follows it by default
  (``strict=True``) and offers ``>=`` (``strict=False``). The two differ only when
  a prefix hits ``T`` exactly.
* Eq. 9 raises ``T`` linearly over training: ``T(t) = T_start + (T_end - T_start) t``
  with ``t`` in ``[0, 1]`` the fraction of training done (see
  :func:`threshold_schedule` for how rounds map to ``t``).

Each parameter is factorised independently. Tensors with more than two dims (conv
weights ``[out, in, kh, kw]``) are reshaped to ``(out, -1)`` and back; 0-D/1-D
tensors (biases, norms) and non-float tensors travel uncompressed.

Reconstruction is ``(U * S) @ Vh`` with ``S`` the 1-D vector of singular values.
The official code (wuch15/FedKD ``run.py``) multiplies ``np.dot(np.dot(u, sigma), v)``
with a 1-D ``sigma``, which is not ``U diag(S) Vh``; it also leaves ``K = 0`` when
no prefix passes the threshold. Neither bug is reproduced here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "CompressedTensor",
    "SVDError",
    "compress_state",
    "compressed_nbytes",
    "decode_update",
    "decompress_state",
    "dense_nbytes",
    "encode_update",
    "energy_rank",
    "from_payload",
    "robust_svd",
    "svd_compress",
    "svd_reconstruct",
    "threshold_schedule",
    "to_payload",
]

_SEP = "::"


class SVDError(RuntimeError):
    """Every SVD backend failed for a matrix."""


def energy_rank(sigma: Tensor, T: float, *, strict: bool = True) -> int:
    """Smallest ``k`` whose leading ``sigma**2`` carry more than ``T`` of the energy (Eq. 8).

    ``strict=True``: ``sum_{i<=k} sigma_i^2 / sum sigma^2 > T`` (the paper);
    ``strict=False``: ``>= T``. ``k`` ranges over ``0..len(sigma)``; the energy of
    ``k = 0`` is 0. All-zero ``sigma`` gives 0, and ``T >= 1`` (or rounding that
    keeps the full sum just under ``T``) gives ``len(sigma)``. Values are sorted
    by magnitude first, so the order of ``sigma`` does not matter.
    """
    if not 0.0 <= T <= 1.0:
        raise ValueError(f"energy threshold T must be in [0, 1], got {T}")
    s = sigma.detach().reshape(-1).to(torch.float64).abs()
    if not torch.isfinite(s).all():
        raise ValueError("singular values contain NaN or Inf")
    n = s.numel()
    energy = s.pow(2).sort(descending=True).values
    total = energy.sum().item()
    if n == 0 or total == 0.0:
        return 0
    ratios = torch.cat([energy.new_zeros(1), energy.cumsum(0) / total])  # index k -> ratio
    hits = (ratios > T) if strict else (ratios >= T)
    idx = torch.nonzero(hits)
    return int(idx[0].item()) if idx.numel() else n


def threshold_schedule(
    t: int,
    total: int,
    T_start: float = 0.95,
    T_end: float = 0.98,
    *,
    convention: Literal["endpoints", "official"] = "endpoints",
) -> float:
    """Energy threshold of round ``t`` (0-based, ``0 <= t < total``) by Eq. 9.

    ``convention="endpoints"`` (default): ``t`` maps to the training fraction
    ``t / (total - 1)``, so round 0 uses ``T_start`` and the last round ``T_end``
    exactly, as Eq. 9's ``t in [0, 1]`` reads; a single round uses ``T_end``.
    ``convention="official"``: fraction ``(t + 1) / total``, as wuch15/FedKD
    ``run.py`` computes it (round 0 already above ``T_start``; last round ``T_end``).
    """
    if total < 1:
        raise ValueError(f"total rounds must be >= 1, got {total}")
    if not 0 <= t < total:
        raise ValueError(f"round index t must be in [0, {total - 1}], got {t}")
    for name, v in (("T_start", T_start), ("T_end", T_end)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v}")
    if convention == "endpoints":
        frac = 1.0 if total == 1 else t / (total - 1)
    elif convention == "official":
        frac = (t + 1) / total
    else:
        raise ValueError(f"unknown convention {convention!r}; use 'endpoints' or 'official'")
    return T_start + (T_end - T_start) * frac  # Eq. 9


@dataclass
class CompressedTensor:
    """A parameter update as ``U[:, :k] diag(S[:k]) Vh[:k, :]``, or raw when not factorised.

    ``shape`` and ``dtype`` are the original tensor's; ``method`` tells which SVD
    backend succeeded (``"float32"``, ``"float64"``, ``"lowrank"``) or ``"raw"``.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    U: Tensor | None = None
    S: Tensor | None = None
    Vh: Tensor | None = None
    raw: Tensor | None = None
    method: str = "raw"

    @property
    def rank(self) -> int | None:
        return None if self.S is None else int(self.S.numel())

    @property
    def is_factored(self) -> bool:
        return self.raw is None

    @property
    def nbytes(self) -> int:
        parts = [self.raw] if self.raw is not None else [self.U, self.S, self.Vh]
        return sum(p.numel() * p.element_size() for p in parts if p is not None)


def _as_matrix(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], -1)


def robust_svd(mat: Tensor, name: str = "tensor") -> tuple[Tensor, Tensor, Tensor, str]:
    """Thin SVD that falls back when LAPACK fails.

    Tries ``torch.linalg.svd(full_matrices=False)`` in float32 (float64 inputs start
    in float64), then in float64, then ``torch.svd_lowrank`` in float64. Returns
    ``(U, S, Vh, method)``; raises :class:`SVDError` naming ``name`` if all fail.
    NaN/Inf inputs are rejected before any attempt with a ``ValueError``.
    """
    if not torch.isfinite(mat).all():
        raise ValueError(f"parameter {name!r} contains NaN or Inf; cannot compress it")
    errors: list[str] = []
    attempts = [torch.float64] if mat.dtype == torch.float64 else [torch.float32, torch.float64]
    for dt in attempts:
        try:
            U, S, Vh = torch.linalg.svd(mat.to(dt), full_matrices=False)
            if torch.isfinite(S).all() and torch.isfinite(U).all() and torch.isfinite(Vh).all():
                return U, S, Vh, "float32" if dt == torch.float32 else "float64"
            errors.append(f"{dt}: non-finite result")
        except (RuntimeError, torch.linalg.LinAlgError) as exc:  # LinAlgError: no convergence
            errors.append(f"{dt}: {exc}")
    try:
        q = min(mat.shape)
        U, S, V = torch.svd_lowrank(mat.to(torch.float64), q=q, niter=4)
        order = S.argsort(descending=True)
        return U[:, order], S[order], V[:, order].T, "lowrank"
    except (RuntimeError, torch.linalg.LinAlgError) as exc:
        errors.append(f"svd_lowrank: {exc}")
    raise SVDError(f"SVD failed for parameter {name!r}: " + "; ".join(errors))


def svd_compress(
    update: Tensor, T: float, *, name: str = "tensor", strict: bool = True
) -> CompressedTensor:
    """Factorise ``update`` keeping the Eq. 8 rank for energy threshold ``T``.

    2-D tensors are factorised as they are; higher-rank ones as ``(shape[0], -1)``.
    0-D/1-D and non-float tensors are returned raw. A zero matrix gives rank 0
    (empty factors, reconstructing to zeros). NaN/Inf raise ``ValueError`` naming
    ``name``. Factors keep the update's dtype (SVD itself runs in float32/64).
    """
    shape = tuple(update.shape)
    if update.dim() < 2 or not update.is_floating_point() or update.numel() == 0:
        if update.is_floating_point() and not torch.isfinite(update).all():
            raise ValueError(f"parameter {name!r} contains NaN or Inf")
        return CompressedTensor(shape, update.dtype, raw=update.detach().clone())
    mat = _as_matrix(update.detach())
    U, S, Vh, method = robust_svd(mat, name)
    k = energy_rank(S, T, strict=strict)
    return CompressedTensor(
        shape,
        update.dtype,
        U=U[:, :k].to(update.dtype).contiguous(),
        S=S[:k].to(update.dtype).contiguous(),
        Vh=Vh[:k, :].to(update.dtype).contiguous(),
        method=method,
    )


def svd_reconstruct(c: CompressedTensor) -> Tensor:
    """``(U * S) @ Vh`` reshaped to the original shape and dtype (raw tensors as they are)."""
    if c.raw is not None:
        return c.raw.reshape(c.shape).to(c.dtype)
    assert c.U is not None and c.S is not None and c.Vh is not None
    work = torch.float64 if c.U.dtype == torch.float64 else torch.float32
    mat = (c.U.to(work) * c.S.to(work)) @ c.Vh.to(work)  # U diag(S) Vh with 1-D S
    return mat.reshape(c.shape).to(c.dtype)


def compress_state(
    state: Mapping[str, Tensor],
    T: float,
    *,
    keep_raw_if_larger: bool = True,
    strict: bool = True,
) -> dict[str, CompressedTensor]:
    """Compress every tensor of an update dict; see :func:`svd_compress`.

    With ``keep_raw_if_larger`` a matrix whose factors ``P k + k + k Q`` would not be
    smaller than ``P Q`` (the paper's condition for a saving) is sent raw instead,
    which is also exact.
    """
    out: dict[str, CompressedTensor] = {}
    for name, t in state.items():
        if _SEP in name:
            raise ValueError(f"parameter name {name!r} may not contain {_SEP!r}")
        c = svd_compress(t, T, name=name, strict=strict)
        if keep_raw_if_larger and c.is_factored and c.nbytes >= t.numel() * t.element_size():
            c = CompressedTensor(tuple(t.shape), t.dtype, raw=t.detach().clone())
        out[name] = c
    return out


def decompress_state(compressed: Mapping[str, CompressedTensor]) -> dict[str, Tensor]:
    """Inverse of :func:`compress_state` (exact for raw entries, rank-k otherwise)."""
    return {name: svd_reconstruct(c) for name, c in compressed.items()}


def compressed_nbytes(compressed: CompressedTensor | Mapping[str, CompressedTensor]) -> int:
    """Bytes of the tensors that travel (factors or raw values; shape metadata excluded)."""
    if isinstance(compressed, CompressedTensor):
        return compressed.nbytes
    return sum(c.nbytes for c in compressed.values())


def dense_nbytes(state: Mapping[str, Tensor]) -> int:
    """Bytes of an uncompressed update dict."""
    return sum(t.numel() * t.element_size() for t in state.values())


def to_payload(compressed: Mapping[str, CompressedTensor]) -> dict[str, Tensor]:
    """Flatten to a plain ``str -> Tensor`` dict (safetensors-friendly).

    Keys: ``name::U``, ``name::S``, ``name::Vh`` or ``name::raw``, plus
    ``name::shape`` (int64) so the original shape survives.
    """
    out: dict[str, Tensor] = {}
    for name, c in compressed.items():
        out[f"{name}{_SEP}shape"] = torch.tensor(c.shape, dtype=torch.int64)
        if c.raw is not None:
            out[f"{name}{_SEP}raw"] = c.raw
        else:
            assert c.U is not None and c.S is not None and c.Vh is not None
            out[f"{name}{_SEP}U"] = c.U
            out[f"{name}{_SEP}S"] = c.S
            out[f"{name}{_SEP}Vh"] = c.Vh
    return out


def from_payload(payload: Mapping[str, Tensor]) -> dict[str, CompressedTensor]:
    """Inverse of :func:`to_payload`; errors name the parameter with missing parts."""
    groups: dict[str, dict[str, Tensor]] = {}
    for key, t in payload.items():
        name, sep, part = key.rpartition(_SEP)
        if not sep or part not in {"shape", "raw", "U", "S", "Vh"}:
            raise ValueError(f"payload key {key!r} is not of the form 'name::part'")
        groups.setdefault(name, {})[part] = t
    out: dict[str, CompressedTensor] = {}
    for name, parts in groups.items():
        if "shape" not in parts:
            raise ValueError(f"payload has no shape for parameter {name!r}")
        shape = tuple(int(x) for x in parts["shape"].tolist())
        if "raw" in parts:
            raw = parts["raw"]
            out[name] = CompressedTensor(shape, raw.dtype, raw=raw)
            continue
        missing = [p for p in ("U", "S", "Vh") if p not in parts]
        if missing:
            raise ValueError(f"payload for parameter {name!r} lacks {missing}")
        U, S, Vh = parts["U"], parts["S"], parts["Vh"]
        rows, cols = shape[0], math.prod(shape[1:])
        if U.shape != (rows, S.numel()) or Vh.shape != (S.numel(), cols):
            raise ValueError(
                f"payload factors for {name!r} do not fit shape {shape}: U {tuple(U.shape)}, "
                f"S {tuple(S.shape)}, Vh {tuple(Vh.shape)}"
            )
        out[name] = CompressedTensor(shape, U.dtype, U=U, S=S, Vh=Vh, method="payload")
    return out


# --------------------------------------------------------------------------- an update on the wire


def encode_update(update: Mapping[str, Tensor], T: float | None) -> dict[str, Tensor]:
    """Eq. 8: the tensors that carry ``update`` (SVD factors with threshold ``T``; raw if None)."""
    if T is None:
        comp = {k: CompressedTensor(tuple(v.shape), v.dtype, raw=v.detach().clone())
                for k, v in update.items()}
    else:
        comp = compress_state(update, T)
    return to_payload(comp)


def decode_update(tensors: Mapping[str, Tensor], like: Mapping[str, Tensor], what: str
                  ) -> dict[str, CompressedTensor]:
    """A received update, validated against the model it applies to (names, shapes, ranks).

    Raises ``ValueError`` naming ``what`` (e.g. ``"client 3: field 'update'"``) and the
    parameter at fault.
    """
    try:
        comp = from_payload(tensors)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    if set(comp) != set(like):
        missing, extra = sorted(set(like) - set(comp)), sorted(set(comp) - set(like))
        raise ValueError(f"{what}: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, c in comp.items():
        ref = like[name]
        if c.shape != tuple(ref.shape) or c.dtype != ref.dtype:
            raise ValueError(f"{what}[{name!r}]: shape {c.shape} {c.dtype}, "
                             f"expected {tuple(ref.shape)} {ref.dtype}")
        if c.rank is not None and c.rank > min(ref.shape[0], ref[0].numel()):
            raise ValueError(f"{what}[{name!r}]: rank {c.rank} exceeds the matrix "
                             f"{tuple(ref.shape)}")
        if c.raw is not None and tuple(c.raw.shape) != c.shape:
            raise ValueError(f"{what}[{name!r}]: raw part has shape {tuple(c.raw.shape)}, "
                             f"expected {c.shape}")
        if c.S is not None and (c.S.dim() != 1 or {c.S.dtype, c.Vh.dtype} != {c.dtype}):
            raise ValueError(f"{what}[{name!r}]: factors U, S, Vh must share the dtype "
                             f"{c.dtype} and S be a vector, got S {tuple(c.S.shape)} "
                             f"{c.S.dtype}, Vh {c.Vh.dtype}")
    return comp
