"""Deprecated: the wire format of every message is :mod:`fedkt.federated.payload`; this module
re-exports its public names and warns on import."""

from __future__ import annotations

import warnings

from fedkt.federated.payload import (
    MAGIC,
    Payload,
    PayloadError,
    check_state_like,
    check_tensor,
    dumps,
    loads,
    nbytes,
)

__all__ = [
    "MAGIC",
    "Payload",
    "PayloadError",
    "check_state_like",
    "check_tensor",
    "dumps",
    "loads",
    "nbytes",
]

warnings.warn("fedkt.payload is now fedkt.federated.payload; import it from there",
              DeprecationWarning, stacklevel=2)
