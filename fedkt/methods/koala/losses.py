"""KOALA's losses and soft labels (Chen et al., arXiv:2407.05268), by equation.

Eqs. 2, 8-10: soft labels on the proxy set (homo: the global small model's; hete: each
client's logits refined, integrated by sample count, softened); Eqs. 3 and 11: reverse
distillation into the large model's adapter; Eqs. 12-17: forward distillation into a
small model, output KL plus the feature MSE through the bridging matrix W.

One KL for every distillation step (Eqs. 3, 11, 12, 15): ``fedkt.train.losses.kl_div_from_probs``,
the target distribution (the teacher's soft labels) its first argument,
KL(P_teacher || P_student) = sum P_teacher (log P_teacher - log P_student), at
temperature T on the student's logits and without a T^2 factor, as the equations are
written.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedkt.infra.precision import upcast
from fedkt.models.vision import features_and_logits, pool_features
from fedkt.train.losses import check_temperature, hidden_mse, kl_div_from_probs

__all__ = [
    "BridgingMatrix",
    "forward_distillation_loss",
    "hete_soft_labels",
    "homo_soft_labels",
    "koala_feature_loss",
    "koala_integrate_logits",
    "koala_refine_logits",
    "koala_soft_labels",
]


def koala_refine_logits(logits: Tensor, amplification: float = 1.0) -> Tensor:
    """KOALA Eq. 8: ``z_hat = A (z - z_min) / (z_bar - z_min)`` per sample.

    ``z_min`` and ``z_bar`` are the minimum and the mean over the class (last) axis,
    so each refined row has minimum 0 and mean ``A``: logits of models with
    different scales become comparable before Eq. 9 mixes them.

    Degenerate rows (all logits equal within floating-point tolerance, so
    ``z_bar == z_min``) carry no preference; they are returned as all zeros, which
    is the uniform distribution after Eq. 10's softmax, instead of dividing by 0.
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits need a class axis, got shape {tuple(logits.shape)}")
    z = logits if logits.is_floating_point() else logits.float()
    z_min = z.amin(dim=-1, keepdim=True)
    z_max = z.amax(dim=-1, keepdim=True)
    z_bar = z.mean(dim=-1, keepdim=True)
    scale = z.detach().abs().amax(dim=-1, keepdim=True).clamp_min(1.0)
    tol = 8 * torch.finfo(z.dtype).eps * scale
    degenerate = (z_max - z_min) <= tol
    # When a row is not degenerate, z_bar - z_min >= (z_max - z_min) / C > 0.
    denom = torch.where(degenerate, torch.ones_like(z_bar), z_bar - z_min)
    refined = amplification * (z - z_min) / denom
    return torch.where(degenerate, torch.zeros_like(refined), refined)


def koala_integrate_logits(
    refined_logits: Sequence[Tensor], sample_counts: Sequence[float]
) -> Tensor:
    """KOALA Eq. 9: ``z_tilde = sum_k n_k z_hat_k / sum_k n_k`` (weights = local data sizes)."""
    zs = list(refined_logits)
    if not zs:
        raise ValueError("koala_integrate_logits needs at least one client's logits")
    if len(zs) != len(sample_counts):
        raise ValueError(f"{len(zs)} logit tensors but {len(sample_counts)} sample counts")
    for k, z in enumerate(zs):
        if z.shape != zs[0].shape:
            raise ValueError(
                f"client {k} logits have shape {tuple(z.shape)}, client 0 {tuple(zs[0].shape)}"
            )
    counts = [float(n) for n in sample_counts]
    if any(n < 0 for n in counts) or sum(counts) <= 0:
        raise ValueError(f"sample counts must be >= 0 with a positive sum, got {counts}")
    total = sum(counts)
    out = zs[0] * (counts[0] / total)
    for z, n in zip(zs[1:], counts[1:], strict=True):
        out = out + z * (n / total)
    return out


def koala_soft_labels(integrated_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KOALA Eq. 10: soft labels ``softmax(z_tilde / T)``."""
    check_temperature(temperature)
    return F.softmax(upcast(integrated_logits) / temperature, dim=-1)


class BridgingMatrix(nn.Module):
    """KOALA's bridging matrix ``W`` of shape (small feature dim, large feature dim).

    ``forward(f_small)`` returns ``f_small @ W`` in the large model's feature space:
    on ``[..., d_small]`` it maps the last axis; on conv maps ``[B, d_small, H, W]``
    it maps the channel axis (a bias-free 1x1 convolution).
    """

    def __init__(self, small_dim: int, large_dim: int) -> None:
        super().__init__()
        if small_dim < 1 or large_dim < 1:
            raise ValueError(f"feature dims must be >= 1, got ({small_dim}, {large_dim})")
        self.small_dim = small_dim
        self.large_dim = large_dim
        self.weight = nn.Parameter(torch.empty(small_dim, large_dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() == 4:
            if features.shape[1] != self.small_dim:
                raise ValueError(f"expected {self.small_dim} channels, got {features.shape[1]}")
            return torch.einsum("bchw,cd->bdhw", features, self.weight)
        if features.shape[-1] != self.small_dim:
            raise ValueError(
                f"expected last dim {self.small_dim}, got shape {tuple(features.shape)}"
            )
        return features @ self.weight

    def extra_repr(self) -> str:
        return f"small_dim={self.small_dim}, large_dim={self.large_dim}"


def koala_feature_loss(
    small_features: Tensor,
    large_features: Tensor,
    bridge: BridgingMatrix | Tensor,
    mask: Tensor | None = None,
) -> Tensor:
    """KOALA Eqs. 13-14: ``MSE(F_small W, F_large)`` through the bridging matrix ``W``.

    Neither side is detached: the same expression trains the large model (reverse
    distillation) or the small one (forward), depending on whose parameters step.
    """
    mapped = bridge(small_features) if isinstance(bridge, nn.Module) else small_features @ bridge
    return hidden_mse(mapped, large_features, mask)


# --------------------------------------------------------------------------- the equations


def homo_soft_labels(global_logits: Tensor, temperature: float) -> Tensor:
    """Eq. 2: soft labels softmax(f(x, omega) / T) of the global small model."""
    return koala_soft_labels(global_logits, temperature)


def hete_soft_labels(logits: list[Tensor], counts: list[float], amplification: float,
                     temperature: float) -> Tensor:
    """Eqs. 8-10: refine each client's logits, integrate by sample counts, soften."""
    refined = [koala_refine_logits(z, amplification) for z in logits]  # Eq. 8
    integrated = koala_integrate_logits(refined, counts)  # Eq. 9
    return koala_soft_labels(integrated, temperature)  # Eq. 10


def forward_distillation_loss(
    small: nn.Module,
    bridge: BridgingMatrix,
    x: Tensor,
    large_probs: Tensor,
    large_features: Tensor,
    *,
    temperature: float,
    feature_weight: float,
    small_layers: int | None,
    feature_size: int = 1,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eqs. 12-14 (homo) / 15-17 (hete): ``(total, output KL, feature MSE)``.

    ``large_probs`` = softmax(F(x)/T) of the large model, ``large_features`` its
    first-h-block features pooled to ``feature_size``. Output term: KL(large || small)
    (Eqs. 12, 15); feature term: MSE(f_g(x) W, F_h(x)) (Eqs. 13, 16); total: output
    + lambda * feature (Eqs. 14, 17).
    """
    feats, logits = features_and_logits(small, x, small_layers)
    size = feature_size if large_features.dim() == 4 else 1
    kd = kl_div_from_probs(large_probs, logits, temperature)  # Eqs. 12, 15
    feat = koala_feature_loss(pool_features(feats, size), large_features, bridge)
    return kd + feature_weight * feat, kd, feat
