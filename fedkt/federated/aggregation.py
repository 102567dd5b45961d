"""Aggregation of client updates: FedAvg, and the coordinate-wise median.

``fedavg`` / ``weighted_sum`` accumulate in float64 and return each tensor in its
input dtype (integer tensors, e.g. BatchNorm's ``num_batches_tracked``, are rounded
to the nearest integer).  ``coordinate_median`` (``runtime.aggregation: median``) is the
robust alternative: per value, the median over the clients (the mean of the two middle
values for an even count), unweighted.

Secure aggregation (Flower's SecAgg+) lives in :mod:`fedkt.runtime.secagg`: the
runtime, not the method, decides how a mean is computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["AggregationError", "coordinate_median", "far_beyond", "fedavg", "is_finite",
           "state_norm", "weighted_sum"]

State = Mapping[str, Tensor]


class AggregationError(ValueError):
    """Client updates cannot be combined; the message names the client and the key."""


# ---------------------------------------------------------------------------
# FedAvg
# ---------------------------------------------------------------------------


def _check_states(states: Sequence[State]) -> None:
    if len(states) == 0:
        raise AggregationError("no client states to aggregate")
    ref = states[0]
    ref_keys = set(ref)
    for idx, st in enumerate(states):
        keys = set(st)
        if keys != ref_keys:
            missing = sorted(ref_keys - keys)
            extra = sorted(keys - ref_keys)
            raise AggregationError(
                f"client {idx} keys differ from client 0: missing {missing}, extra {extra}"
            )
        for key in ref:
            t, r = st[key], ref[key]
            if not isinstance(t, Tensor):
                raise AggregationError(f"client {idx} key {key!r} is not a tensor")
            if t.shape != r.shape:
                raise AggregationError(
                    f"client {idx} key {key!r} has shape {tuple(t.shape)}, "
                    f"client 0 has {tuple(r.shape)}"
                )
            if t.dtype != r.dtype:
                raise AggregationError(
                    f"client {idx} key {key!r} has dtype {t.dtype}, client 0 has {r.dtype}"
                )
            if (t.is_floating_point() or t.is_complex()) and not torch.isfinite(t).all():
                raise AggregationError(f"client {idx} key {key!r} has non-finite values")


def _check_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise AggregationError(f"{len(w)} weights for {n} client states")
    for idx, x in enumerate(w):
        if not math.isfinite(x) or x < 0:
            raise AggregationError(f"client {idx} weight {x} must be finite and >= 0")
    return w


def _cast_back(acc: Tensor, like: Tensor) -> Tensor:
    if like.is_floating_point() or like.is_complex():
        return acc.to(like.dtype)
    if like.dtype == torch.bool:
        return acc.round() != 0
    return acc.round().to(like.dtype)


def weighted_sum(states: Sequence[State], weights: Sequence[float] | None = None) -> dict:
    """``sum_i w_i * state_i`` per key, accumulated in float64, returned in the input dtype."""
    _check_states(states)
    w = _check_weights(weights, len(states))
    out: dict[str, Tensor] = {}
    for key, ref in states[0].items():
        acc_dtype = torch.complex128 if ref.is_complex() else torch.float64
        acc = torch.zeros(ref.shape, dtype=acc_dtype, device=ref.device)
        for st, wi in zip(states, w, strict=True):
            acc += st[key].to(acc_dtype) * wi
        out[key] = _cast_back(acc, ref)
    return out


def fedavg(states: Sequence[State], weights: Sequence[float] | None = None) -> dict:
    """Weighted element-wise mean ``sum_i w_i s_i / sum_i w_i`` (FedAvg, McMahan et al.).

    ``weights`` default to equal; usually the clients' sample counts. Raises
    :class:`AggregationError` naming the client index and key on a key, shape or
    dtype mismatch or a non-finite value, and on negative or all-zero weights.
    """
    _check_states(states)
    w = _check_weights(weights, len(states))
    total = sum(w)
    if total <= 0:
        raise AggregationError(f"weights sum to {total}; at least one must be > 0")
    return weighted_sum(states, [x / total for x in w])


def coordinate_median(states: Sequence[State]) -> dict:
    """Per value, the median over ``states`` (the mean of the two middle values when their
    number is even), computed in float64 and returned in the input dtype.  Raises
    :class:`AggregationError` as :func:`fedavg` does."""
    _check_states(states)
    n = len(states)
    out: dict[str, Tensor] = {}
    for key, ref in states[0].items():
        if ref.is_complex():
            raise AggregationError(f"key {key!r}: no median of complex values")
        ordered = torch.stack([st[key].to(torch.float64) for st in states]).sort(dim=0).values
        middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        out[key] = _cast_back(middle, ref)
    return out


# ---------------------------------------------------------------------------
# Bounds on what one client adds
# ---------------------------------------------------------------------------


def state_norm(state: State) -> float:
    """The L2 norm of all of a state's floating values together, in float64 (``inf`` when
    even float64 cannot hold it)."""
    total = 0.0
    for t in state.values():
        if t.is_floating_point() or t.is_complex():
            total += float(torch.linalg.vector_norm(t.detach().to(torch.float64)
                                                    if t.is_floating_point() else t.detach()
                                                    ) ** 2)
    return math.sqrt(total) if math.isfinite(total) else math.inf


def far_beyond(norms: Sequence[float], ratio: float) -> tuple[list[int], float]:
    """Indices of the norms more than ``ratio`` times the median of ``norms`` (the lower
    median: with two states, the smaller norm), and that median.  A median of 0 (most
    states empty) flags only infinite norms."""
    if not norms:
        return [], 0.0
    median = sorted(norms)[(len(norms) - 1) // 2]
    if median <= 0 or not math.isfinite(median):
        return [i for i, n in enumerate(norms) if not math.isfinite(n)], median
    return [i for i, n in enumerate(norms) if not n <= ratio * median], median


def is_finite(state: State) -> bool:
    """Whether every floating value of ``state`` is finite."""
    return all(torch.isfinite(t).all() for t in state.values()
               if t.is_floating_point() or t.is_complex())
