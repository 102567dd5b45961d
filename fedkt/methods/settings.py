"""Settings that several methods' configs share, torch-free.

A method's config module imports its shared settings from here rather than from another
method's package or from the module that uses them (whose imports reach torch): validating
a config then imports neither an algorithm nor torch (tests/methods/test_registry.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedkt.config import DatasetConfig, MethodConfig
from fedkt.config.schema import _Strict

__all__ = ["AdapterAveragingConfig", "EncoderHead", "ExchangeSettings", "VisionPretrain"]


class AdapterAveragingConfig(MethodConfig):
    """Settings of methods whose clients train one shared adapter that the server averages."""

    weighted: bool = Field(True, description=(
        "Weight each client's adapter by its number of training examples (else equal weights)."))


class ExchangeSettings(MethodConfig):
    """How a global model's updates travel: SVD compression (Eqs. 8-9), FedAvg weights."""

    compress: bool = Field(True, description=(
        "SVD-compress each update before it travels (Eqs. 8-9)."))
    T_start: float = Field(0.95, ge=0.0, le=1.0, description=(
        "Eq. 9: the energy threshold T of the first round."))
    T_end: float = Field(0.98, ge=0.0, le=1.0, description=(
        "Eq. 9: the energy threshold T of the last round."))
    schedule: Literal["endpoints", "official"] = Field("endpoints", description=(
        "Eq. 9's t: \"endpoints\" (round 1 uses T_start, the last T_end) or \"official\" (run.py)."))
    weighted: bool = Field(True, description=(
        "Weight each client's update by its number of training examples (FedAvg)."))
    freeze_embeddings: bool = Field(True, description=(
        "The embeddings neither train nor travel (official code)."))


class EncoderHead(MethodConfig):
    """The classification head of every encoder method (FedKD and its baselines)."""

    pooling: Literal["attention", "mean", "cls"] = Field("attention", description=(
        "attention: attentive pooling + a dense layer (the paper's SMM4H head); mean: masked mean "
        "pooling + a dense layer; cls: the [CLS] state through BERT's pooler (the "
        "*ForSequenceClassification head). The pooling weights train and travel with the model."))


class VisionPretrain(_Strict):
    """A server model's backbone, trained before round 1 on data the federation never labels.

    Stands in for the ImageNet pretraining the papers start from, and must not learn
    from the federated task's labels: ``dataset`` is a labelled image dataset whose
    classes are disjoint from the task's (another dataset, or other classes of the same
    one, e.g. ``{name: digits, fields: {classes: "5-9"}}`` for a task on digits 0-4;
    :func:`fedkt.train.pretrain.check_pretrain_source` refuses a class overlap with ``data.dataset``). The
    backbone trains with a temporary linear head for the pretraining classes; the task
    head (the adapter) is then freshly initialised, so federated training starts from
    chance. The server's whole public split, labels removed, is the proxy set.

    ``enabled: false`` is refused for the plain-torch models: a random frozen backbone's
    eval-mode features collapse (about 1e-9) and every method on it lands at chance. It
    is accepted for ``torchvision:``/``timm:`` models with ``pretrained: true``.
    """

    enabled: bool = Field(True, description="Pretrain the server model's backbone before round 1.")
    dataset: DatasetConfig | None = Field(None, description=(
        "Labelled images whose classes are disjoint from the task's, e.g. {name: digits, fields: "
        "{classes: '5-9'}}."))
    epochs: float = Field(30.0, gt=0, description="Pretraining passes over that dataset.")
    lr: float = Field(1e-3, gt=0, description="Pretraining learning rate.")
    weight_decay: float = Field(1e-6, ge=0, description="Pretraining weight decay.")
    batch_size: int = Field(64, ge=1, description="Pretraining images per step.")
    cache: bool = Field(True, description=(
        "Cache the pretrained weights on disk ($FEDKT_CACHE or ~/.cache/fedkt)."))
