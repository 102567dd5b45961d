"""Seeds: a stable seed derived from a base seed and tags, and seeding every generator."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["derive_seed", "seed_everything"]


def derive_seed(base: int, *tags: object) -> int:
    """A stable 31-bit seed from a base seed and tags (independent of hash randomisation)."""
    text = "/".join(str(t) for t in (base, *tags))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators with ``seed``."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
