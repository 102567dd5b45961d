"""FedAvg's settings (the paper has none beyond the weighting)."""

from __future__ import annotations

from typing import Literal

from fedkt.config.method_settings import AdapterAveragingConfig

__all__ = ["AdapterAveragingConfig", "FedAvgConfig"]


class FedAvgConfig(AdapterAveragingConfig):
    name: Literal["fedavg"] = "fedavg"
