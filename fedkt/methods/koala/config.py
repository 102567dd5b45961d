"""KOALA's settings (paper defaults: Adam, T=7, lr 1e-3 / 1e-4, wd 1e-6, A=2)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedkt.config import MethodConfig
from fedkt.train.pretrain import VisionPretrain


class KoalaConfig(MethodConfig):
    """KOALA hyper-parameters (paper defaults: Adam, T=7, lr 1e-3 / 1e-4, wd 1e-6, A=2)."""

    name: Literal["koala"] = "koala"
    # homo: every client runs the same small model (averaged into a global one);
    # hete: clients' small models differ (Eqs. 8-11, each distilled separately).
    mode: Literal["homo", "hete"] = "homo"
    forward_distillation: bool = True
    temperature: float = Field(7.0, gt=0)
    amplification: float = Field(2.0, gt=0)  # A of Eq. 8
    reverse_lr: float = Field(1e-3, gt=0)
    forward_lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(1e-6, ge=0)
    # Passes over the proxy set per round.
    reverse_epochs: float = Field(5.0, gt=0)
    forward_epochs: float = Field(1.0, gt=0)
    distill_batch_size: int = Field(64, ge=1)
    # lambda of Eqs. 14 and 17 (weight of the feature loss).
    feature_weight: float = Field(1.0, ge=0)
    # h and g: blocks of the large / small model whose output features are matched
    # (None: the whole backbone, i.e. the features the head reads).
    large_feature_layers: int | None = Field(None, ge=0)
    small_feature_layers: int | None = Field(None, ge=0)
    # Both feature maps are average-pooled to this size before W (1: vectors).
    feature_size: int = Field(1, ge=1)
    # Whose soft labels teach the large model: clients (KOALA) or a random-teacher control:
    # shuffled (permuted across proxy images), untrained (a never-trained small model) or
    # marginal (every image gets the clients' mean soft label: the average over permutations).
    teacher: Literal["clients", "shuffled", "untrained", "marginal"] = "clients"
    # teacher: shuffled: how often the permutation of the soft labels across proxy images is
    # redrawn. epoch: a fresh one for every reverse pass, so the head cannot memorise one
    # random image -> label mapping; round: one per round (the earlier control, which 50
    # reverse passes memorise, landing far below or above chance by the draw).
    shuffle_every: Literal["epoch", "round"] = "epoch"
    pretrain: VisionPretrain = Field(default_factory=VisionPretrain)
