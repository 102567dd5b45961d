"""FedKD's settings: the exchange (Eqs. 8-9), the student, Eq. 5's layer pairs, the rates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedkt.config.bounds import Layers, LearningRate, Temperature
from fedkt.config.method_settings import EncoderHead, ExchangeSettings

# eta_s / eta_t of the paper's Table 6 (SMM4H: 1e-5 / 2e-6).
STUDENT_LR_RATIO = 5.0


class FedKDConfig(ExchangeSettings, EncoderHead):
    name: Literal["fedkd"] = "fedkd"
    student_layers: Layers = Field(2, description=(
        "The student: the teacher's embeddings and first N layers (paper: 4 or 2 of 12)."))
    layer_map: list[int] | None = Field(None, description=(
        "Teacher layer (1-based) matched to student layer l = 1..N in Eq. 5; 0 leaves l "
        "unmatched. None: l * L_t / N (the official mapping: last to last, evenly spaced)."))
    hidden_loss: bool = Field(True, description=(
        "Eq. 5's hidden-state loss between the matched layers."))
    attention_loss: bool = Field(True, description=(
        "Eq. 5's attention-map loss between the matched layers."))
    temperature: Temperature = Field(1.0, description=(
        "Softmax temperature of the mutual distillation KL (Eqs. 3-4)."))
    teacher_lr: LearningRate | None = Field(None, description=(
        "Learning rate of the teacher and W_h (None: training.lr)."))
    student_lr: LearningRate | None = Field(None, description=(
        "Learning rate of the student (None: STUDENT_LR_RATIO x the teacher's, Table 6's eta_s / "
        "eta_t = 1e-5 / 2e-6)."))
    detach_denominator: bool = Field(True, description=(
        "1 / (L_t^t + L_s^t) as a weight (detached) or in the graph (official code)."))
    min_task_loss_sum: float = Field(0.1, gt=0, le=1e6, description=(
        "Lower bound of L_t^t + L_s^t: the adaptive weight 1 / (L_t^t + L_s^t) of Eqs. 3-5 is at "
        "most 1 / min_task_loss_sum (10 by default; about 0.72 at initialisation)."))

    def rates(self, lr: float) -> tuple[float, float]:
        """(teacher, student) learning rates given ``training.lr``."""
        teacher = self.teacher_lr or lr
        return teacher, self.student_lr or STUDENT_LR_RATIO * teacher

    @model_validator(mode="after")
    def _layer_map_length(self) -> FedKDConfig:
        if self.layer_map is not None and len(self.layer_map) != self.student_layers:
            raise ValueError(f"layer_map has {len(self.layer_map)} entries; give one teacher "
                             f"layer (or 0) per student layer ({self.student_layers})")
        return self
