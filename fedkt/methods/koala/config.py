"""KOALA's settings (paper defaults: Adam, T=7, lr 1e-3 / 1e-4, wd 1e-6, A=2)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedkt.config.bounds import MAX_LAYERS, BatchSize, Epochs, LearningRate, Temperature, Weight
from fedkt.config.method_schema import MethodConfig
from fedkt.config.method_settings import VisionPretrain


class KoalaConfig(MethodConfig):
    """KOALA hyper-parameters (paper defaults: Adam, T=7, lr 1e-3 / 1e-4, wd 1e-6, A=2)."""

    name: Literal["koala"] = "koala"
    mode: Literal["homo", "hete"] = Field("homo", description=(
        "homo: every client runs the same small model (averaged into a global one); hete: "
        "clients' small models differ (Eqs. 8-11, each distilled separately)."))
    forward_distillation: bool = Field(True, description=(
        "Step 4: distil the large model back into the small ones (large -> small)."))
    temperature: Temperature = Field(7.0, description=(
        "Softmax temperature of the soft labels and the KL (T)."))
    amplification: float = Field(2.0, gt=0, le=100, description="A of Eq. 8")
    reverse_lr: LearningRate = Field(1e-3, description=(
        "Learning rate of reverse distillation (small -> large)."))
    forward_lr: LearningRate = Field(1e-4, description=(
        "Learning rate of forward distillation (large -> small)."))
    weight_decay: float = Field(1e-6, ge=0, le=10, description="Weight decay of both distillations' Adam.")
    reverse_epochs: Epochs = Field(5.0, description=(
        "Passes over the proxy set per round in reverse distillation."))
    forward_epochs: Epochs = Field(1.0, description=(
        "Passes over the proxy set per round in forward distillation."))
    distill_batch_size: BatchSize = Field(64, description="Proxy images per distillation step.")
    feature_weight: Weight = Field(1.0, description=(
        "lambda of Eqs. 14 and 17 (weight of the feature loss)."))
    large_feature_layers: int | None = Field(None, ge=0, le=MAX_LAYERS, description=(
        "h: blocks of the large model whose output features are matched (None: the whole "
        "backbone, the features the head reads)."))
    small_feature_layers: int | None = Field(None, ge=0, le=MAX_LAYERS, description=(
        "g: blocks of the small model whose output features are matched (None: the whole "
        "backbone)."))
    feature_size: int = Field(1, ge=1, le=4096, description=(
        "Both feature maps are average-pooled to this size before W (1: vectors)."))
    teacher: Literal["clients", "shuffled", "untrained", "marginal"] = Field(
        "clients", description=(
        "Whose soft labels teach the large model: clients (KOALA) or a random-teacher control: "
        "shuffled (permuted across proxy images), untrained (a never-trained small model) or "
        "marginal (every image gets the clients' mean soft label: the average over permutations)."))
    shuffle_every: Literal["epoch", "round"] = Field("epoch", description=(
        "teacher: shuffled: how often the permutation of the soft labels across proxy images is "
        "redrawn. epoch: a fresh one for every reverse pass, so the head cannot memorise one "
        "random image -> label mapping; round: one per round (the earlier control, which 50 "
        "reverse passes memorise, landing far below or above chance by the draw)."))
    pretrain: VisionPretrain = Field(default_factory=VisionPretrain, description=(
        "Pretraining of the server model's backbone before round 1, on data disjoint from the "
        "task's classes."))
