"""The ``secure_aggregation`` and ``differential_privacy`` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedkt.config.base import _Strict
from fedkt.config.bounds import MAX_CLIENTS

__all__ = ["DifferentialPrivacyConfig", "SecureAggregationConfig"]


class SecureAggregationConfig(_Strict):
    """Flower's SecAgg+ on every runtime: the server learns only the clients' weighted mean.

    Applies to methods whose server sums client uploads (adapters, updates, prompts).
    """

    enabled: bool = Field(False, description=(
        "Sum the clients' uploads by SecAgg+: the server sees only their (weighted) mean."))
    num_shares: int | float = Field(1.0, gt=0, le=MAX_CLIENTS, description=(
        "Neighbours each client shares its secrets with: an int > 2, or a fraction of the clients "
        "in the round (1.0: all, i.e. SecAgg)."))
    reconstruction_threshold: int | float = Field(0.5, gt=0, le=MAX_CLIENTS, description=(
        "Shares needed to rebuild a dropped client's mask: an int, or a fraction of num_shares. "
        "Higher: more privacy against colluding clients, less tolerance to dropouts."))
    clipping_range: float = Field(8.0, gt=0, le=1e6, description=(
        "Each value (times weight / max_weight) is clipped to [-clipping_range, clipping_range] "
        "and quantised to quantization_range levels before masking."))
    quantization_range: int = Field(2**22, gt=0, le=2**31, description=(
        "Levels each clipped value is quantised to before masking."))
    modulus_range: int = Field(2**32, gt=0, le=2**62, description=(
        "The modulus of the masked sums: a power of 2 above quantization_range."))
    max_weight: float = Field(1000.0, gt=0, le=1e12, description=(
        "The largest client weight (examples); larger weights overflow."))

    @model_validator(mode="after")
    def _flower_checks(self) -> SecureAggregationConfig:
        if self.modulus_range <= self.quantization_range or self.modulus_range & (
                self.modulus_range - 1):
            raise ValueError("modulus_range must be a power of 2 above quantization_range")
        if isinstance(self.num_shares, int) and self.num_shares != 1 and self.num_shares <= 2:
            raise ValueError("num_shares as an integer must be > 2 (or a fraction of clients)")
        if isinstance(self.num_shares, float) and self.num_shares > 1:
            raise ValueError("num_shares as a fraction must be in (0, 1]")
        if isinstance(self.reconstruction_threshold, float) and self.reconstruction_threshold > 1:
            raise ValueError("reconstruction_threshold as a fraction must be in (0, 1]")
        if (isinstance(self.num_shares, int) and isinstance(self.reconstruction_threshold, int)
                and self.num_shares > 2 and self.reconstruction_threshold >= self.num_shares):
            raise ValueError("reconstruction_threshold must be below num_shares")
        return self


class DifferentialPrivacyConfig(_Strict):
    """Client-side Gaussian mechanism on each upload: clip the change to clip_norm (L2),
    add N(0, (noise_multiplier * clip_norm)^2) noise; epsilon reported per round."""

    enabled: bool = Field(False, description=(
        "Clip each client's upload and add Gaussian noise before it leaves the client."))
    clip_norm: float = Field(1.0, gt=0, le=1e6, description=(
        "The L2 bound each upload's change is clipped to."))
    noise_multiplier: float = Field(1.0, gt=0, le=1e3, description=(
        "The noise's standard deviation, in units of clip_norm."))
    delta: float = Field(1e-5, gt=0, lt=1, description=(
        "The delta of the (epsilon, delta) guarantee reported per round."))
    noise: Literal["local", "distributed"] = Field("local", description=(
        "local: every client adds the full noise (a guarantee for each upload, even against the "
        "server). distributed: each adds it divided by sqrt(m), m = the fewest clients a round's "
        "sum may hold (clients.min_replies, else the clients per round), so the securely "
        "aggregated sum carries the full noise; needs secure_aggregation (docs/security.md says "
        "which guarantee holds against which party)."))
