"""Settings shared by the methods whose server averages one client adapter (FedAvg and
FedCoLLM's SLM): a module of its own, so that a config importing it imports no algorithm."""

from __future__ import annotations

from pydantic import Field

from fedkt.config import MethodConfig


class AdapterAveragingConfig(MethodConfig):
    """Settings of methods whose clients train one shared adapter that the server averages."""

    weighted: bool = Field(True, description=(
        "Weight each client's adapter by its number of training examples (else equal weights)."))
