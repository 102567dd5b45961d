"""A FedKD client's three models: the mentor (teacher), the mentee (student) and Eq. 5's W_h.

The teacher is ``clients.models[0]`` (e.g. all-MiniLM-L6-v2); the student is its
embeddings and first ``student_layers`` layers, the same on every client (the head is
seeded by ``seed``); ``W_h`` maps each matched student layer's states into the teacher's
space (:func:`layer_pairs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedkt.config import RunConfig
from fedkt.errors import ConfigError
from fedkt.train.encoder import build_encoder, encoder_config, num_layers
from fedkt.train.optim import trainable

from .config import FedKDConfig

__all__ = ["FedKDModels", "layer_pairs"]


def layer_pairs(teacher_layers: int, student_layers: int, layer_map: list[int] | None
                ) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs of Eq. 5, 1-based."""
    if layer_map is None:
        return [(s, s * teacher_layers // student_layers) for s in range(1, student_layers + 1)]
    if len(layer_map) != student_layers:
        raise ConfigError(f"method.layer_map: {len(layer_map)} entries for "
                          f"{student_layers} student layers")
    for t in layer_map:
        if not 0 <= t <= teacher_layers:
            raise ConfigError(f"method.layer_map: teacher layer {t} is outside "
                              f"1..{teacher_layers} (0: unmatched)")
    return [(s, t) for s, t in enumerate(layer_map, start=1) if t]


@dataclass
class FedKDModels:
    """One client's mentor (teacher), mentee (student) and the W_h maps of Eq. 5."""

    teacher: nn.Module
    student: nn.Module
    projections: nn.ModuleList
    tokenizer: Any
    pairs: list[tuple[int, int]]

    @classmethod
    def build(cls, cfg: RunConfig, labels: int, device: str | None = None) -> FedKDModels:
        m: FedKDConfig = cfg.method
        model_cfg = encoder_config(cfg)
        kw = dict(freeze_embeddings=m.freeze_embeddings, eager_attention=m.attention_loss,
                  pooling=m.pooling, device=device or cfg.runtime.device)
        teacher, tokenizer = build_encoder(model_cfg, labels, cfg.seed, **kw)
        if m.student_layers > num_layers(teacher):
            raise ConfigError(f"method.student_layers: {m.student_layers} is more than the "
                              f"teacher's {num_layers(teacher)} layers")
        student, _ = build_encoder(model_cfg, labels, cfg.seed, layers=m.student_layers, **kw)
        pairs = layer_pairs(num_layers(teacher), m.student_layers, m.layer_map)
        d_t, d_s = teacher.config.hidden_size, student.config.hidden_size
        projections = nn.ModuleList()
        gen = torch.Generator().manual_seed(cfg.seed)
        for _ in pairs if m.hidden_loss else []:
            w = nn.Linear(d_s, d_t, bias=False)  # W_h: student dim -> teacher dim
            with torch.no_grad():
                if d_s == d_t:  # a truncated student starts in the teacher's space
                    w.weight.copy_(torch.eye(d_t))
                else:
                    w.weight.copy_(nn.init.xavier_uniform_(torch.empty(d_t, d_s), generator=gen))
            projections.append(w)
        device = next(teacher.parameters()).device
        return cls(teacher, student, projections.to(device), tokenizer, pairs)

    def parameters(self) -> list[nn.Parameter]:
        return trainable(self.teacher, self.student, self.projections)

    def param_groups(self, lr: float, student_lr: float) -> list[dict[str, Any]]:
        """Optimiser groups: teacher and W_h at ``lr``, the student at ``student_lr``."""
        return [{"params": trainable(self.teacher, self.projections), "lr": lr},
                {"params": trainable(self.student), "lr": student_lr}]
