"""FedAvg's settings (the paper has none beyond the weighting)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedkt.config import MethodConfig


class AdapterAveragingConfig(MethodConfig):
    """Settings of methods whose clients train one shared adapter that the server averages."""

    weighted: bool = Field(True, description=(
        "Weight each client's adapter by its number of training examples (else equal weights)."))


class FedAvgConfig(AdapterAveragingConfig):
    name: Literal["fedavg"] = "fedavg"
