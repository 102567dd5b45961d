"""One verdict across kernel settings, blocked by fold, and its operating characteristics.

A suite run under S kernel settings (fp32, bf16 with or without AMX) on the same K folds
gives each claim a difference ``d[f, s]`` per fold ``f`` and setting ``s``.  The folds
are shared (the same split, the same training seed), so the setting is a factor *inside*
each fold.  The pooled analysis averages over settings within each fold,
``m_f = mean_s d[f, s]``, and treats the K fold means as the suite's own seeds: Student's
t-interval ``mean(m) ± t(K−1) · sd(m) / √K`` and the suite's rules (:func:`fedkt.evidence.
claims.decide`: at least 4 folds, all but one of them on the interval's side).  With the
settings balanced (every fold under every setting) this is the two-way additive model
fold + setting's test of the grand mean: the setting effects average out of each fold
mean and the fold × setting interaction is the residual the t-interval measures.

What the pooled verdict claims: the effect averaged over these kernel settings, not that
it holds under each.  "Both must win" (each setting's own verdict reproduced) asks the
second, and pays for it in power (:func:`simulate_across`, docs/evidence.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedkt.evidence.claims import MIN_SEEDS, Claim, Decision, decide, parse_claim
from fedkt.evidence.stats import DEFAULT_LEVEL, DEFAULT_POWER, _normal_quantile, seed_interval

__all__ = ["Pooled", "align_folds", "pooled_decision", "simulate_across", "t_rule"]


@dataclass(frozen=True)
class Pooled:
    """The pooled verdict of one claim across settings (per-fold means over settings)."""

    estimate: float
    low: float
    high: float
    fold_means: tuple[float, ...]
    decision: Decision
    aligned_by: str  # "fold label", "shared folds" or "position"
    folds: tuple[str, ...] = ()  # the fold labels pooled (by position: "#0", "#1", ...)

    @property
    def shared_only(self) -> bool:
        """Pooled on the folds every setting ran, where some ran more."""
        return self.aligned_by == "shared folds"


def align_folds(per_setting: Sequence[dict[str, float]]
                ) -> tuple[np.ndarray, str, list[str]] | None:
    """``[folds, settings]`` differences, how they were matched and the folds' labels: by
    fold label where every setting has the same labels; on the labels every setting has
    (``shared folds``, two or more) where some ran more folds (``fedkt suite run
    --fold``); else by position where they have the same count; None otherwise."""
    if not per_setting or any(not p for p in per_setting):
        return None
    labels = [list(p) for p in per_setting]
    if all(set(x) == set(labels[0]) for x in labels):
        return (np.array([[p[f] for p in per_setting] for f in labels[0]], float),
                "fold label", labels[0])
    shared = [f for f in labels[0] if all(f in p for p in per_setting)
              and not f.startswith("#")]
    if len(shared) >= 2:
        return (np.array([[p[f] for p in per_setting] for f in shared], float),
                "shared folds", shared)
    if len({len(x) for x in labels}) == 1:
        return (np.array([list(p.values()) for p in per_setting], float).T, "position",
                [f"#{k}" for k in range(len(labels[0]))])
    return None


def pooled_decision(claim_text: str, per_setting: Sequence[dict[str, float]],
                    level: float = DEFAULT_LEVEL) -> Pooled | None:
    """The pooled verdict of ``claim_text`` from each setting's per-fold differences
    (None where the folds cannot be matched or there are fewer than 2)."""
    got = align_folds(per_setting)
    if got is None or got[0].shape[0] < 2:
        return None
    table, how, labels = got
    means = table.mean(1)
    low, high = seed_interval(means.tolist(), level)  # type: ignore[misc]
    claim = parse_claim(claim_text)
    if not isinstance(claim, Claim):
        raise ValueError(f"{claim_text!r}: pool each part of a joint claim on its own")
    decision = decide(claim, low, high, means.tolist(), seed_interval=(low, high), unit="fold",
                      estimate=float(means.mean()),
                      floor=(high - low) / 2 * (1 + _normal_quantile(DEFAULT_POWER)
                                                / _normal_quantile(1 - (1 - level) / 2)))
    return Pooled(float(means.mean()), float(low), float(high),
                  tuple(float(m) for m in means), decision, how, tuple(labels))


def t_rule(d: np.ndarray, level: float = DEFAULT_LEVEL, min_folds: int = MIN_SEEDS
           ) -> np.ndarray:
    """:func:`decide`'s verdict for a ``>`` claim on the fold differences ``d[..., K]``,
    vectorised over the leading axes, with the t-interval as the interval: +1 reproduced,
    -1 contradicted, 0 otherwise (not resolved or fragile)."""
    from scipy.stats import t as student_t

    k = d.shape[-1]
    mean = d.mean(-1)
    half = student_t.ppf(1 - (1 - level) / 2, k - 1) * d.std(-1, ddof=1) / math.sqrt(k)
    low, high = mean - half, mean + half
    up = (low > 0) & ((d <= 0).sum(-1) <= 1)
    down = (high < 0) & ((d >= 0).sum(-1) <= 1)
    out = np.where(up, 1, np.where(down, -1, 0))
    return out if k >= min_folds else np.zeros_like(out)


def simulate_across(effect: float, *, folds: int = 4, settings: int = 2,
                    fold_sd: float = 0.15, setting_sd: float = 0.10, sims: int = 2000,
                    seed: int = 0, level: float = DEFAULT_LEVEL) -> dict[str, float]:
    """Rates over ``sims`` simulated suites of a ``>`` claim with true difference ``effect``.

    Each suite: ``d[f, s] = effect + u_f + e_{f,s}``, ``u_f ~ N(0, fold_sd)`` shared by the
    settings of fold f (the split and seed), ``e ~ N(0, setting_sd)`` the setting's own
    noise within the fold (its kernels, and the items' noise).  Returns the rates of:
    ``pooled`` (pooled verdict reproduced), ``pooled_contradicted``, ``both`` (every
    setting's own verdict reproduced: "both must win"), ``any_decided_wrong`` (the pooled
    verdict decided either side; at a null effect its false-positive rate)."""
    rng = np.random.default_rng(seed)
    u = rng.normal(0.0, fold_sd, size=(sims, folds, 1))
    e = rng.normal(0.0, setting_sd, size=(sims, folds, settings))
    d = effect + u + e
    own = t_rule(np.moveaxis(d, 2, 1), level)  # [sims, settings]
    pooled = t_rule(d.mean(2), level)  # [sims]
    return {"pooled": float((pooled == 1).mean()),
            "pooled_contradicted": float((pooled == -1).mean()),
            "pooled_decided": float((pooled != 0).mean()),
            "both": float((own == 1).all(1).mean()),
            "machine_dependent": float(((own == 1).any(1) & (own == -1).any(1)).mean())}

