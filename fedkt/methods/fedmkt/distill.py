"""FedMKT's selection and distillation: Algorithm 2 (DualMinCE) and Eqs. 5-10.

Fan, Ma, Kang, Gu, Song, Fan, Chen, Yang, "FedMKT: Federated Mutual Knowledge Transfer for
Large and Small Language Models", COLING 2025 (arXiv:2406.02224).

* :func:`dual_min_ce`: per public sample, the other model whose loss is smallest, used
  only when it beats the learner's own loss (Algorithm 2);
* :func:`distill`: the learner trains on D_p with L = lambda L_FT + (1 - lambda) L_KD
  (Eq. 9 on the server, Eq. 10 on a client), L_KD against the targets
  :func:`fedkt.alignment.targets.build_targets` builds from the selection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedkt.alignment.receiving import kd_scale
from fedkt.alignment.targets import KDTargets, kd_loss
from fedkt.config import RunConfig
from fedkt.infra.precision import upcast
from fedkt.infra.timing import timed
from fedkt.train.lm import LM, train_lm
from fedkt.train.optim import grad_norm, trainable

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = ["DIAGNOSTICS", "distill", "dual_min_ce", "lambda_mix"]


def dual_min_ce(own_loss: Tensor, other_losses: Tensor) -> Tensor:
    """Algorithm 2 (DualMinCE) for every sample: which model's logits to distil from.

    ``own_loss`` [N]: the learner's own per-sample loss; ``other_losses`` [M, N]: the
    other models' (``inf`` where a model sent nothing for the sample).  Returns int64
    [N]: the index ``m`` of the other model with the smallest loss when that loss is
    strictly below the own loss, else -1 (keep the learner's own knowledge).  Ties
    between other models go to the lowest index.
    """
    own_loss = torch.as_tensor(own_loss, dtype=torch.float64)
    other = torch.as_tensor(other_losses, dtype=torch.float64)
    if other.dim() != 2 or other.shape[1] != own_loss.shape[0]:
        raise ValueError(f"dual_min_ce: other_losses should be [M, {own_loss.shape[0]}], "
                         f"got {tuple(other.shape)}")
    if other.shape[0] == 0:
        return torch.full(own_loss.shape, -1, dtype=torch.int64)
    other = torch.nan_to_num(other, nan=math.inf)
    best = other.argmin(dim=0)  # first minimum: lowest index on ties
    best_loss = other.gather(0, best[None]).squeeze(0)
    return torch.where(best_loss < own_loss, best, torch.full_like(best, -1))


def lambda_mix(l_ft: Tensor | float, l_kd: Tensor | float, lam: float) -> Tensor | float:
    """FedMKT Eqs. 9-10: ``lam * L_FT + (1 - lam) * L_KD`` with ``0 <= lam <= 1``."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must lie in [0, 1], got {lam}")
    return lam * l_ft + (1.0 - lam) * l_kd


# Logged with each distillation (server and client rows): the KD term's gradient norm over
# L_FT's on the first batch, both as weighted in L (0 at lambda = 1), and the top-1
# agreement of the projected teacher with the learner's ground-truth next token.
DIAGNOSTICS = ("kd_grad_ratio", "kd_teacher_top1", "kd_teacher_top1_target")


@timed("distill")
def distill(cfg: RunConfig, lm: LM, records: list[dict], targets: KDTargets, *,
            data: FederatedData, epochs: float, lr: float | None, seed: int,
            desc: str) -> dict[str, float]:
    """Train ``lm`` on D_p with L = lambda L_FT + (1 - lambda) L_KD (Eq. 9 server, Eq. 10
    client; lambda is ``method.ft_weight``); ``records`` are of ``data``, the run's data.

    :func:`~fedkt.train.lm.train_lm` adds ``task_weight * L_FT`` (Eqs. 5, 6) and the
    ``extra_loss`` (1 - lambda) L_KD (Eqs. 7, 8), i.e. :func:`lambda_mix`; with
    ``receiving.t_squared`` (an extension) L_KD at temperature T is multiplied by T**2.
    The logged ``kd_loss`` is L_KD before that factor.
    """
    m = cfg.method
    kd_cfg = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"local_epochs": epochs})})
    kd_sum: list[float] = []
    ratio: list[float] = []
    scale = kd_scale(m.temperature, m.receiving.t_squared)  # T**2 (an extension) or 1

    def extra(model: torch.nn.Module, batch: dict[str, Tensor], outputs: Any, step: int
              ) -> Tensor:
        kd = kd_loss(targets, outputs, batch, temperature=m.temperature,
                     positions=m.kd_positions)
        kd_sum.append(float(kd.detach()))
        kd_term = lambda_mix(0.0, kd * scale, m.ft_weight)  # (1 - lambda) * L_KD
        if step == 0:  # diagnostic: the KD term's gradient against L_FT's, as weighted
            params = trainable(model)
            ft = lambda_mix(1.0, 0.0, m.ft_weight) * upcast(outputs.loss)
            ratio.append(grad_norm(kd_term, params) / max(grad_norm(ft, params), 1e-30))
        return kd_term

    stats = train_lm(kd_cfg, lm, records, data=data, seed=seed, extra_loss=extra,
                     task_weight=lambda_mix(1.0, 0.0, m.ft_weight), lr=lr, desc=desc)
    counts = targets.counts or {}
    total = max(sum(counts.get(k, 0) for k in ("teacher", "one_hot", "own")), 1)
    return {"loss": stats["loss"], "kd_loss": sum(kd_sum) / max(len(kd_sum), 1),
            "steps": stats["steps"], "kd_one_hot": counts.get("one_hot", 0) / total,
            "kd_grad_ratio": ratio[0] if ratio else 0.0, **targets.diagnostics()}
