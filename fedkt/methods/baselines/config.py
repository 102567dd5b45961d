"""The baselines' settings; ``family`` names the kind of model each one trains."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from fedkt.config.bounds import Layers
from fedkt.config.method_schema import MethodConfig
from fedkt.config.method_settings import EncoderHead, ExchangeSettings, VisionPretrain

if TYPE_CHECKING:
    from fedkt.config import RunConfig

# ------------------------------------------------------------------ causal LMs


class ZeroShotConfig(MethodConfig):
    family: ClassVar[str] = "lm"
    name: Literal["zero_shot"] = "zero_shot"


class StandaloneConfig(MethodConfig):
    family: ClassVar[str] = "lm"
    name: Literal["standalone"] = "standalone"


class CentralizedConfig(MethodConfig):
    family: ClassVar[str] = "lm"
    name: Literal["centralized"] = "centralized"
    include_public: bool = Field(True, description=(
        "Pool the public set's labelled records with the private ones."))


# ------------------------------------------------------------------ text classifiers


class EncoderChoice(EncoderHead):
    """Which encoder: ``clients.models[0]`` whole (teacher size) or cut (student size)."""

    family: ClassVar[str] = "encoder"
    layers: Layers | None = Field(None, description=(
        "Encoder layers kept: None, the whole encoder (teacher size); N, its embeddings and first "
        "N layers (student size)."))
    freeze_embeddings: bool = Field(True, description="The embeddings do not train.")


class StandaloneEncoderConfig(EncoderChoice):
    name: Literal["standalone_encoder"] = "standalone_encoder"


class CentralizedEncoderConfig(EncoderChoice):
    name: Literal["centralized_encoder"] = "centralized_encoder"
    include_public: bool = Field(True, description=(
        "Pool the public set's labelled records with the private ones."))


class FedAvgEncoderConfig(EncoderChoice, ExchangeSettings):
    name: Literal["fedavg_encoder"] = "fedavg_encoder"
    compress: bool = False


# ------------------------------------------------------------------ image classifiers


class FedAvgVisionConfig(MethodConfig):
    name: Literal["fedavg_vision"] = "fedavg_vision"
    model: Literal["server", "client"] = Field("server", description=(
        "server: clients run the server's (large, pretrained) model; client: clients.models."))
    trainable: Literal["head", "full"] = Field("head", description=(
        "head: only the classifier head trains (KOALA's baseline); full: every weight."))
    weighted: bool = Field(True, description=(
        "Weight each client's update by its number of training examples (else equal weights)."))
    pretrain: VisionPretrain = Field(default_factory=VisionPretrain, description=(
        "Pretraining of the server model's backbone (used with model: server)."))


def check_centralized(cfg: RunConfig) -> None:
    """``include_public`` pools the public set's labelled records: not when they are withheld."""
    if getattr(cfg.method, "include_public", False) and not cfg.data.public_labels:
        raise ValueError("method.include_public pools the public set's labelled records, but "
                         "data.public_labels is false; set include_public: false")
