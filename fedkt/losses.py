"""Deprecated: the generic distillation losses are :mod:`fedkt.train.losses`; this module
re-exports its public names and warns on import."""

from __future__ import annotations

import warnings

from fedkt.train.losses import (
    check_temperature,
    hidden_mse,
    kl_div,
    kl_div_from_probs,
    masked_mean,
    soft_cross_entropy,
)

__all__ = [
    "check_temperature",
    "hidden_mse",
    "kl_div",
    "kl_div_from_probs",
    "masked_mean",
    "soft_cross_entropy",
]

warnings.warn("fedkt.losses is now fedkt.train.losses; import it from there",
              DeprecationWarning, stacklevel=2)
