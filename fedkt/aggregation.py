"""Deprecated: fedAvg of tensors are :mod:`fedkt.federated.aggregation`; this module
re-exports its public names and warns on import."""

from __future__ import annotations

import warnings

from fedkt.federated.aggregation import (
    AggregationError,
    State,
    coordinate_median,
    far_beyond,
    fedavg,
    is_finite,
    state_norm,
    weighted_sum,
)

__all__ = [
    "AggregationError",
    "State",
    "coordinate_median",
    "far_beyond",
    "fedavg",
    "is_finite",
    "state_norm",
    "weighted_sum",
]

warnings.warn("fedkt.aggregation is now fedkt.federated.aggregation; import it from there",
              DeprecationWarning, stacklevel=2)
