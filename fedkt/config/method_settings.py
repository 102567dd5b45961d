"""Settings that several methods' configs share, torch-free.

A method's config module imports its shared settings from here rather than from another
method's package or from the module that uses them (whose imports reach torch): validating
a config then imports neither an algorithm nor torch (tests/methods/test_registry.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedkt.config.base import _Strict
from fedkt.config.bounds import MAX_REHEARSAL, BatchSize, Epochs, LearningRate, Weight
from fedkt.config.data_schema import DatasetConfig
from fedkt.config.method_schema import MethodConfig

if TYPE_CHECKING:
    from fedkt.config import RunConfig

__all__ = ["AdapterAveragingConfig", "EncoderHead", "ExchangeSettings", "ReceivingOptions",
           "VisionPretrain", "check_rehearsal"]


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
    epochs: Epochs = Field(30.0, description="Pretraining passes over that dataset.")
    lr: LearningRate = Field(1e-3, description="Pretraining learning rate.")
    weight_decay: float = Field(1e-6, ge=0, le=10, description="Pretraining weight decay.")
    batch_size: BatchSize = Field(64, description="Pretraining images per step.")
    cache: bool = Field(True, description=(
        "Cache the pretrained weights on disk ($FEDKT_CACHE or ~/.cache/fedkt)."))


class ReceivingOptions(_Strict):
    """How a receiver takes in the other side's choice posteriors while keeping its own
    knowledge: options beyond the papers (FedMKT, LLM2SLM, FedCoLLM), each off by default.

    The mechanics are :mod:`fedkt.alignment.receiving`; every option but ``t_squared``
    needs ``knowledge: choices`` and none applies to ``teacher: none`` (no KD step).
    """

    rehearsal_ratio: float = Field(0.0, ge=0, le=MAX_REHEARSAL, description=(
        "Rehearsal: steps on the receiver's own labelled data (the server's records for the "
        "LLM, a client's private data for its SLM) per KD step, interleaved with the KD steps "
        "(0: none; 1: one after every KD step; 0.5: one after every second). Each is a step of "
        "CE on the gold choice of its own records; never on the public set."))
    anchor_weight: Weight = Field(0.0, description=(
        "Anchoring (Learning without Forgetting, Li & Hoiem 2016): the weight of "
        "KL(own || learner) over every public sample, own = the receiver's posteriors before "
        "the exchange (0: none). The LLM's weight, and the clients' unless "
        "client_anchor_weight sets theirs."))
    client_anchor_weight: Weight | None = Field(None, description=(
        "The clients' (SLMs') anchoring weight where it should differ from the LLM's "
        "(None: anchor_weight). FedCoLLM's SLM: its KD term is about ten times its anchoring "
        "term at weight 1 (docs/methods/fedcollm.md)."))
    t_squared: bool = Field(False, description=(
        "Multiply every KD and anchoring term by T**2, T = method.temperature (Hinton et al. "
        "2015), so their gradients keep their size as T grows; false: the papers' loss at T."))
    take: Literal["all", "confident"] = Field("all", description=(
        'Which of the samples the method\'s own selection gives a teacher are distilled: "all" '
        '(the papers) or "confident", only those where the teacher\'s largest posterior is at '
        "least teacher_confidence and the receiver's is below learner_confidence."))
    teacher_confidence: float = Field(0.9, gt=0, le=1, description=(
        "take: confident: the teacher's largest choice posterior must reach this."))
    learner_confidence: float = Field(0.5, gt=0, le=1, description=(
        "take: confident: the receiver's own largest choice posterior must lie below this."))

    def check(self, knowledge: str, teacher: str) -> None:
        """Refuse an option the method's settings leave nothing to act on (ValueError
        naming the field): any with ``teacher: none`` (no KD step), any but
        ``t_squared`` with ``knowledge: logits``, and a confidence without
        ``take: confident``."""
        for key in ("teacher_confidence", "learner_confidence"):
            if self.take != "confident" and \
                    getattr(self, key) != type(self).model_fields[key].default:
                raise ValueError(f"method.receiving.{key}: read only with "
                                 f"method.receiving.take: confident (take is {self.take!r}); "
                                 "set take: confident or remove it")
        for key in self.active():
            if teacher == "none":
                raise ValueError(f"{key}: teacher: none skips the distillation step, so "
                                 "there is nothing to receive; leave it at its default or "
                                 "choose another teacher")
            if knowledge != "choices" and not key.endswith("t_squared"):
                raise ValueError(f"{key}: acts on posteriors over the task's choices; set "
                                 "method.knowledge: choices")

    def active(self) -> list[str]:
        """The options set away from their defaults, as ``method.receiving.<field>``."""
        return [f"method.receiving.{k}" for k in ("rehearsal_ratio", "anchor_weight",
                                                  "client_anchor_weight", "t_squared", "take")
                if getattr(self, k) != type(self).model_fields[k].default]


def check_rehearsal(cfg: RunConfig, llm_receives: bool) -> None:
    """``receiving.rehearsal_ratio > 0`` where the LLM receives: it rehearses on the
    server's own records, so ``data.split.server_size`` must give it some."""
    if cfg.method.receiving.rehearsal_ratio > 0 and llm_receives and not cfg.data.split.server_size:
        raise ValueError(f"method.receiving.rehearsal_ratio: {cfg.method.name}'s LLM rehearses on "
                         "the server's own labelled records and data.split.server_size is 0; set "
                         "it, or rehearsal_ratio: 0")
