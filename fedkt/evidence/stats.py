"""Paired statistics over per-example predictions.

Every metric fedkt reports is a function of *sums over test examples*:
accuracy is (number right) / n, F1 of a class is 2tp / (2tp + fp + fn), macro-F1
averages such ratios over classes, Rouge-L is (sum of per-example scores) / n.
So a metric is described by a matrix of per-example **components** (one row per
example) and a function of their column sums (:class:`Metric`).  That makes
the bootstrap exact and cheap for every metric alike: a resample of the
examples is a vector of counts ``w``, and the metric on it is ``f(w @ C)``.

A comparison of A with B (``A - factor * B - offset``) is **paired**: both are
computed on the *same* resampled examples, so what the two have in common (the
hard items, the easy items) cancels, and differences far smaller than either
accuracy's own interval are resolved.

With several seeds, each seed contributes its own pair of runs; the
difference of the seed means is bootstrapped over seeds *and* examples:
each replicate draws seeds with replacement and, for each drawn seed, that
seed's own resample of its examples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedkt.eval.groups import GROUP_PREFIX, group_metric
from fedkt.eval.predictions import Predictions

__all__ = [
    "Largest",
    "Metric",
    "Sample",
    "bootstrap_difference",
    "detection_floor",
    "mcnemar_exact",
    "metric_names",
    "normal_difference",
    "sample",
    "seed_interval",
]

DEFAULT_BOOTSTRAP = 2000
DEFAULT_LEVEL = 0.95
DEFAULT_POWER = 0.80  # the detection floor: the effect found with this probability


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


@dataclass(frozen=True)
class Metric:
    """A metric as ``value = fn(column sums of components)``; ``fn`` works on ``[..., m]``."""

    name: str
    fn: Callable[[np.ndarray], np.ndarray]
    mean_like: bool  # value = mean of components[:, 0] (the normal approximation applies)
    # Only the examples whose components[:, 1] is not 0 count (a class group's accuracy):
    # :func:`sample` keeps those rows, so the bootstrap resamples the group's items only.
    restricted: bool = False


def _mean_metric(name: str) -> Metric:
    return Metric(name, lambda s: _ratio(s[..., 0], s[..., 1]), True)


def _f1(s: np.ndarray) -> np.ndarray:  # columns: tp, fp, fn
    return _ratio(2 * s[..., 0], 2 * s[..., 0] + s[..., 1] + s[..., 2])


_PRF = {
    "precision": lambda s: _ratio(s[..., 0], s[..., 0] + s[..., 1]),
    "recall": lambda s: _ratio(s[..., 0], s[..., 0] + s[..., 2]),
    "f1": _f1,
}


def _confusion(gold: np.ndarray, pred: np.ndarray, cls: object) -> np.ndarray:
    """Per-example (tp, fp, fn) indicators of one class."""
    g, p = gold == cls, pred == cls
    return np.stack([g & p, ~g & p, g & ~p], axis=1).astype(float)


def metric_names(table: Predictions) -> list[str]:
    """The metrics a predictions table supports, in report order."""
    task = table.meta.get("task", "")
    cols = table.columns
    if task == "generation" or "rougeL" in cols:
        return ["rougeL"]
    names = ["accuracy"]
    if "pred_norm" in cols:
        names.append("accuracy_norm")
    if task == "classifier" or "positive_label" in table.meta:
        names += ["precision", "recall", "f1"]
    if task in ("classification", "classifier"):
        names.append("macro_f1")
    groups = table.meta.get("class_groups") or {}
    if "gold" in cols and "pred" in cols:
        golds = set(cols["gold"])
        names += [GROUP_PREFIX + g for g, classes in groups.items() if golds & set(classes)]
    return names


def components(table: Predictions, metric: str) -> tuple[np.ndarray, Metric]:
    """``(C, metric)``: per-example component matrix ``[n, m]`` and how to reduce it."""
    cols = table.columns
    n = len(table)
    ones = np.ones(n)
    if metric == "rougeL":
        if "rougeL" not in cols:
            raise KeyError(metric)
        return np.stack([np.asarray(cols["rougeL"], float), ones], 1), _mean_metric(metric)
    group = group_metric(metric, table.meta.get("class_groups"))
    if group is not None:  # accuracy_<name>: the group's items only
        if "pred" not in cols or "gold" not in cols:
            raise KeyError(metric)
        keep = set(group[1])
        inside = np.array([g in keep for g in cols["gold"]], dtype=float)
        if not inside.any():
            raise KeyError(metric)
        right = np.array([p == g for p, g in zip(cols["pred"], cols["gold"], strict=True)],
                         dtype=float)
        return np.stack([right * inside, inside], 1), Metric(
            metric, lambda s: _ratio(s[..., 0], s[..., 1]), True, restricted=True)
    if metric in ("accuracy", "accuracy_norm"):
        pred_col = "pred" if metric == "accuracy" else "pred_norm"
        if pred_col not in cols or "gold" not in cols:
            raise KeyError(metric)
        right = np.array([p == g for p, g in zip(cols[pred_col], cols["gold"], strict=True)],
                         dtype=float)
        return np.stack([right, ones], 1), _mean_metric(metric)
    if "gold" not in cols or "pred" not in cols:
        raise KeyError(metric)
    gold = np.asarray(cols["gold"])
    pred = np.asarray(cols["pred"])
    if metric in _PRF:
        positive = table.meta.get("positive_label", 1)
        return _confusion(gold, pred, positive), Metric(metric, _PRF[metric], False)
    if metric == "macro_f1":
        labels = table.meta.get("labels")
        classes = list(labels) if labels is not None else sorted(set(gold.tolist())
                                                                 | set(pred.tolist()), key=repr)
        k = len(classes)
        comp = np.concatenate([_confusion(gold, pred, c) for c in classes], axis=1)

        def macro(s: np.ndarray) -> np.ndarray:
            per_class = [_f1(s[..., 3 * i: 3 * i + 3]) for i in range(k)]
            return np.mean(per_class, axis=0) if k else np.zeros(s.shape[:-1])

        return comp, Metric(metric, macro, False)
    raise KeyError(metric)


@dataclass
class Sample:
    """One or several participants' components on the same examples (a participant group).

    The group's metric is the mean over its participants of each one's metric.
    """

    ids: list[str]
    parts: list[np.ndarray]  # one [n, m] matrix per participant, rows in ``ids`` order
    metric: Metric

    def value(self, sums: Sequence[np.ndarray] | None = None) -> np.ndarray | float:
        sums = [p.sum(0) for p in self.parts] if sums is None else sums
        return np.mean([self.metric.fn(s) for s in sums], axis=0)

    def aligned(self, ids: Sequence[str]) -> Sample:
        """The same sample with rows reordered to ``ids`` (which must be a permutation)."""
        pos = {i: k for k, i in enumerate(self.ids)}
        order = np.array([pos[i] for i in ids], dtype=int)
        return Sample(list(ids), [p[order] for p in self.parts], self.metric)


def sample(tables: Sequence[Predictions], metric: str) -> Sample:
    """A :class:`Sample` of ``metric`` over participants' tables that share their ids."""
    if not tables:
        raise ValueError("no predictions to compare")
    ids = tables[0].ids
    parts, reducer = [], None
    for table in tables:
        comp, reducer = components(table, metric)
        if table.ids != ids:
            comp = Sample(table.ids, [comp], reducer).aligned(ids).parts[0]
        parts.append(comp)
    assert reducer is not None
    if reducer.restricted:  # the items the metric is over (the same in every table)
        keep = np.flatnonzero(parts[0][:, 1] != 0)
        return Sample([ids[i] for i in keep], [p[keep] for p in parts], reducer)
    return Sample(list(ids), parts, reducer)


def _resample_counts(rng: np.random.Generator, n: int, reps: int) -> np.ndarray:
    """``[reps, n]`` counts of each example in ``reps`` resamples of size ``n``.

    Drawn as ``rng.integers(0, n, size=(reps, n))`` (one row per replicate), so a
    hand computation with the same generator reproduces it.
    """
    idx = rng.integers(0, n, size=(reps, n))
    counts = np.zeros((reps, n))
    rows = np.repeat(np.arange(reps), n)
    np.add.at(counts, (rows, idx.ravel()), 1.0)
    return counts


@dataclass(frozen=True)
class Difference:
    """``estimate`` of ``A - factor * B - offset`` and its ``level`` bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float
    n: int  # examples per seed (smallest)
    seeds: int
    a: float
    b: float
    per_seed: tuple[float, ...] = ()  # each seed's (or fold's) own difference, in seed order
    # "seeds, items" (each seed its own unit) or "folds, seeds within a fold, items" (the
    # fold the unit: per_seed then holds each fold's mean over its seeds, in fold order)
    resampling: str = "seeds, items"
    # each run's own difference, in the order given: what splits a fold's spread into its
    # seeds' and its own (fedkt.evidence.power.seed_split)
    per_run: tuple[float, ...] = ()

    def seed_interval(self) -> tuple[float, float] | None:
        """The t-interval over :attr:`per_seed` at :attr:`level` (None below 2 seeds)."""
        return seed_interval(self.per_seed, self.level)

    def floor(self, power: float = DEFAULT_POWER) -> float:
        """The smallest true difference this design detects (:func:`detection_floor`)."""
        return detection_floor(self, power)


def bootstrap_difference(
    a: Sequence[Sample | float], b: Sequence[Sample | Largest | float], *, factor: float = 1.0,
    offset: float = 0.0, reps: int = DEFAULT_BOOTSTRAP, level: float = DEFAULT_LEVEL,
    seed: int = 0, units: Sequence[int] | None = None,
) -> Difference:
    """Paired bootstrap CI of ``mean_s A_s - factor * mean_s B_s - offset``.

    ``a[s]`` and ``b[s]`` belong to seed ``s``; a :class:`Sample` pair must be on the
    same example ids (``b`` is realigned to ``a``'s order), a plain number is a
    value without per-example data (bytes, wall time), which only the seed
    resampling moves.  With one seed this is the ordinary paired bootstrap: the
    replicates are ``rng.integers(0, n, size=(reps, n))`` of
    ``np.random.default_rng(seed)``; with several, each seed draws its example
    resamples in turn, then ``rng.integers(0, seeds, size=(reps, seeds))`` picks
    the seeds of each replicate.  The interval is the percentile one.  One side
    may be a plain number against a :class:`Sample` (a claim against a constant); ``b``
    may be a :class:`Largest` of samples on ``a``'s examples (the larger on each resample).

    ``units[s]``: the fold of seed ``s``, where a suite runs several training seeds inside
    each fold.  The fold is then the unit, and the bootstrap has three levels: after every
    seed's item resamples, each fold in turn (in fold order) draws its ``m`` seeds with
    replacement (``rng.integers(0, m, size=(reps, m))``), each drawn seed bringing its own
    item resample, then ``rng.integers(0, F, size=(reps, F))`` draws the folds; the
    replicate is the mean over the drawn folds of the mean over their drawn seeds.
    ``per_seed`` then holds each fold's mean over its seeds, so the seeds' t-interval and a
    suite's verdict count folds.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"paired seeds: {len(a)} and {len(b)} runs; give the same number (>0)")
    rng = np.random.default_rng(seed)
    per_seed_reps, per_seed_point, a_vals, b_vals, sizes = [], [], [], [], []
    for sa, sb in zip(a, b, strict=True):
        ref = sa if isinstance(sa, Sample) else sb if isinstance(sb, (Sample, Largest)) \
            else None
        counts = None
        if ref is not None:
            if isinstance(sa, Sample) and isinstance(sb, (Sample, Largest)):
                if set(sa.ids) != set(sb.ids):
                    raise ValueError("the two sides are not on the same examples")
                sb = sb.aligned(sa.ids) if sb.ids != sa.ids else sb
            counts = _resample_counts(rng, len(ref.ids), reps)
            sizes.append(len(ref.ids))
        ra, va = _replicates(sa, counts, reps)
        rb, vb = _replicates(sb, counts, reps)
        per_seed_reps.append(ra - factor * rb - offset)
        per_seed_point.append(va - factor * vb - offset)
        a_vals.append(va)
        b_vals.append(vb)
    k = len(per_seed_reps)
    stacked = np.stack(per_seed_reps, 0)  # [seeds, reps]
    if units is not None and len(units) != k:
        raise ValueError(f"units: {len(units)} folds given for {k} seeds")
    if units is not None and len(set(units)) < k:  # several seeds inside a fold
        replicates, fold_point, members = _fold_replicates(rng, stacked, per_seed_point,
                                                           units, reps)
        alpha = (1 - level) / 2
        low, high = np.quantile(replicates, [alpha, 1 - alpha])
        return Difference(float(np.mean(fold_point)), float(low), float(high), level,
                          min(sizes) if sizes else 0, len(fold_point),
                          float(np.mean([np.mean(np.asarray(a_vals)[i]) for i in members])),
                          float(np.mean([np.mean(np.asarray(b_vals)[i]) for i in members])),
                          tuple(fold_point), "folds, seeds within a fold, items",
                          tuple(float(v) for v in per_seed_point))
    if k == 1:
        replicates = stacked[0]
    else:
        pick = rng.integers(0, k, size=(reps, k))
        replicates = stacked[pick, np.arange(reps)[:, None]].mean(1)
    alpha = (1 - level) / 2
    low, high = np.quantile(replicates, [alpha, 1 - alpha])
    return Difference(float(np.mean(per_seed_point)), float(low), float(high), level,
                      min(sizes) if sizes else 0, k, float(np.mean(a_vals)),
                      float(np.mean(b_vals)), tuple(float(v) for v in per_seed_point),
                      per_run=tuple(float(v) for v in per_seed_point))


def _shrink(points: np.ndarray, within: float, between: float | None = None) -> float:
    """The factor that scales a level's units about their mean so that their spread is the
    between-unit part only: ``sqrt(max(1 - within / var(points), 0))``.  Resampling a level
    and then the level below it counts the lower level's noise twice (once in the units'
    own spread, once in the resample below); scaling the units by this factor counts it
    once (the shrunken hierarchical bootstrap, Davison and Hinkley 1997, section 3.8)."""
    if between is None:
        if len(points) < 2:
            return 0.0
        between = float(np.var(points, ddof=1))
    return math.sqrt(max(1.0 - within / between, 0.0)) if between > 0 else 0.0


def _fold_replicates(rng: np.random.Generator, stacked: np.ndarray,
                     per_seed_point: Sequence[float], units: Sequence[int], reps: int
                     ) -> tuple[np.ndarray, list[float], list[np.ndarray]]:
    """The three-level replicates (folds, seeds within a fold, items) of
    :func:`bootstrap_difference`, each level's units shrunk (:func:`_shrink`) by the
    variance the level below supplies; with no fold (or seed) variance the interval is the
    items' alone."""
    point = np.asarray(per_seed_point, float)
    item_var = stacked.var(1)  # each seed's item-resample variance
    folds = sorted(set(units))
    members = [np.flatnonzero(np.asarray(units) == f) for f in folds]
    rows = np.arange(reps)[:, None]
    fold_reps = np.empty((len(folds), reps))
    fold_point = []
    # one factor for the seeds of every fold: the seeds' variance within a fold, pooled
    # over the folds (two seeds a fold alone would make it a coin toss)
    spread = [float(np.var(point[idx], ddof=1)) for idx in members if len(idx) > 1]
    c = _shrink(point, float(item_var.mean()), float(np.mean(spread))) if spread else 0.0
    for i, idx in enumerate(members):
        mean = float(point[idx].mean())
        drawn = idx[rng.integers(0, len(idx), size=(reps, len(idx)))]
        # slot j of replicate r takes the item resample of column r + j: a seed drawn
        # twice brings two independent item resamples, not the same one twice
        cols = (rows + np.arange(len(idx))[None, :]) % reps
        fold_reps[i] = (mean + c * (point[drawn] - mean)
                        + stacked[drawn, cols] - point[drawn]).mean(1)
        fold_point.append(mean)
    fp = np.asarray(fold_point)
    grand = float(fp.mean())
    c = _shrink(fp, float(fold_reps.var(1).mean()))
    pick = rng.integers(0, len(folds), size=(reps, len(folds)))
    cols = (rows + np.arange(len(folds))[None, :]) % reps  # as above, for folds
    replicates = (grand + c * (fp[pick] - grand) + fold_reps[pick, cols] - fp[pick]).mean(1)
    return replicates, fold_point, members


def seed_interval(per_seed: Sequence[float], level: float = DEFAULT_LEVEL
                  ) -> tuple[float, float] | None:
    """Student's t-interval of the mean of per-seed differences: ``m ± t(k-1) * sd / √k``.

    It counts only the spread between seeds (each seed's own item noise shows in that
    spread), with the small-sample t quantile, so with few seeds it is wide where the
    two-level bootstrap, which can only redraw the seeds it has, is not.  None below 2.
    """
    k = len(per_seed)
    if k < 2:
        return None
    from scipy.stats import t as student_t

    values = np.asarray(per_seed, dtype=float)
    half = float(student_t.ppf(1 - (1 - level) / 2, k - 1) * values.std(ddof=1) / math.sqrt(k))
    mean = float(values.mean())
    return mean - half, mean + half


def detection_floor(diff: Difference, power: float = DEFAULT_POWER) -> float:
    """The smallest true difference that the design behind ``diff`` (its items and seeds)
    would show as an interval excluding 0 with probability ``power``:
    ``h * (1 + z(power) / z(level))``, where ``h`` is the larger half-width of the bootstrap
    interval and the seeds' t-interval (the normal approximation of a power analysis,
    with the spread this run measured)."""
    half = (diff.high - diff.low) / 2
    seeds = diff.seed_interval()
    if seeds is not None:
        half = max(half, (seeds[1] - seeds[0]) / 2)
    z_level = _normal_quantile(1 - (1 - diff.level) / 2)
    return float(half * (1 + _normal_quantile(power) / z_level))


@dataclass
class Largest:
    """The larger of several samples on the same examples, resample by resample: a claim
    against the stronger of two controls (``max(shuffled, marginal)``)."""

    samples: tuple[Sample, ...]

    @property
    def ids(self) -> list[str]:
        return self.samples[0].ids

    def aligned(self, ids: Sequence[str]) -> Largest:
        return Largest(tuple(s.aligned(ids) if s.ids != list(ids) else s for s in self.samples))

    def value(self) -> float:
        return max(float(s.value()) for s in self.samples)


def _replicates(side: Sample | Largest | float, counts: np.ndarray | None, reps: int
                ) -> tuple[np.ndarray, float]:
    """A side's value on each resample (constant for a plain number) and on the data."""
    if isinstance(side, Largest):
        got = [_replicates(s, counts, reps) for s in side.samples]
        return np.max([g[0] for g in got], axis=0), max(g[1] for g in got)
    if isinstance(side, Sample):
        assert counts is not None
        return np.asarray(side.value([counts @ p for p in side.parts]), float), \
            float(side.value())
    return np.full(reps, float(side)), float(side)


def normal_difference(a: Sample, b: Sample, *, factor: float = 1.0, offset: float = 0.0,
                      level: float = DEFAULT_LEVEL) -> Difference:
    """The normal approximation for mean-like metrics: ``d ± z * sd(d_i) / sqrt(n)``."""
    if not a.metric.mean_like:
        raise ValueError(f"{a.metric.name} is not a mean over examples; use the bootstrap")
    b = b.aligned(a.ids) if b.ids != a.ids else b
    per_a = np.mean([p[:, 0] / p[:, 1] for p in a.parts], axis=0)
    per_b = np.mean([p[:, 0] / p[:, 1] for p in b.parts], axis=0)
    d = per_a - factor * per_b - offset
    n = len(d)
    z = _normal_quantile(1 - (1 - level) / 2)
    se = float(np.std(d, ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    est = float(d.mean())
    return Difference(est, est - z * se, est + z * se, level, n, 1, float(per_a.mean()),
                      float(per_b.mean()))


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (bisection on ``math.erf``; exact to ~1e-12)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mcnemar_exact(right_a: Sequence[bool], right_b: Sequence[bool]) -> tuple[int, int, float]:
    """McNemar's exact test: ``(b, c, p)``.

    ``b``: examples A gets right and B wrong; ``c``: the reverse.  Under the null
    each discordant example is a fair coin, so ``p = min(1, 2 * P[Bin(b + c, 1/2) <=
    min(b, c)])`` (1 when there are no discordant examples).
    """
    ra, rb = np.asarray(right_a, bool), np.asarray(right_b, bool)
    if ra.shape != rb.shape:
        raise ValueError("McNemar needs the two runs' results on the same examples")
    b = int((ra & ~rb).sum())
    c = int((~ra & rb).sum())
    n = b + c
    if n == 0:
        return b, c, 1.0
    k = min(b, c)
    # Exact tail with integers, then one division: no underflow for large n.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return b, c, min(1.0, 2 * tail / 2 ** n)
