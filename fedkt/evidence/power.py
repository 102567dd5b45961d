"""Power before the run (``fedkt suite power PILOT``): how many folds a suite needs.

From a pilot (a finished suite folder, or one fold of one), per claim:

* the **fold SD** ``s``: the SD of the per-fold differences (it holds the fold's own
  variation, its test items' noise and its seeds'); unknown with one fold;
* the **item SE**: the standard error the test items alone give one fold's difference.
  With one fold it is the bootstrap interval's half-width over ``z(0.975)``; with K folds
  (seeds, items resampled) the bootstrap's variance is about ``(s²(K−1)/K + se²)/K``, so
  ``se² = K·(h/z)² − s²(K−1)/K`` (0 where the noise makes it negative);
* the current **detection floor** (from the suite);
* the folds needed: the smallest K (at least 4, the verdict's minimum) whose folds'
  t-interval, ``t(K−1) · s / √K``, has a half-width at most the target, and whose floor
  ``t(K−1) · s / √K · (1 + z(0.80) / z(0.975))`` is at most the target floor.  With one
  fold, the item SE stands in for ``s`` (a fold varies at least by its items), so the
  answer is a lower bound and says so;
* runs (folds × seeds per fold × arms) and hours, from the pilot runs' recorded wall
  times (their ``metrics.jsonl`` rows, or the pilot's "Where the time went" table).

More seeds inside a fold average only the seeds' part of ``s``, never the fold's or its
items'. Where the pilot ran several seeds in a fold (its claims' ``per_run``), the fold SD
is split as a one-way random-effects model (method of moments, :func:`seed_split`): the
**seed SD** ``s_w``, the spread of training seeds on one fold's items, pooled over the
folds, and the **between-fold SD** ``s_b``, what the fold itself adds (its items, its
classes and data), from ``s² = s_b² + s_w² / m`` with ``m`` seeds a fold.  A plan with
``m'`` seeds a fold then has the fold SD ``√(s_b² + s_w² / m')`` (``--seeds``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from fedkt.evidence.across import read_suite_result
from fedkt.evidence.claims import MIN_SEEDS, claim_parts
from fedkt.evidence.stats import DEFAULT_LEVEL, DEFAULT_POWER, _normal_quantile
from fedkt.tracking.tables import format_table

__all__ = ["ClaimPower", "SeedSplit", "claim_power", "folds_needed", "item_se", "pilot_power",
           "power_report", "seed_split", "suite_targets"]

MAX_FOLDS = 1000


def _t(k: int, level: float = DEFAULT_LEVEL) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(1 - (1 - level) / 2, k - 1))


def floor_factor(level: float = DEFAULT_LEVEL, power: float = DEFAULT_POWER) -> float:
    """The detection floor over the half-width: ``1 + z(power) / z(level)`` (≈ 1.43)."""
    return 1 + _normal_quantile(power) / _normal_quantile(1 - (1 - level) / 2)


def folds_needed(sd: float, target: float, *, factor: float = 1.0,
                 level: float = DEFAULT_LEVEL, minimum: int = MIN_SEEDS) -> int | None:
    """The smallest K >= ``minimum`` with ``factor · t(K−1) · sd / √K <= target`` (None
    beyond :data:`MAX_FOLDS`).  ``factor`` 1: a half-width; :func:`floor_factor`: a floor."""
    if sd <= 0:
        return minimum
    for k in range(max(2, minimum), MAX_FOLDS + 1):
        if factor * _t(k, level) * sd / math.sqrt(k) <= target:
            return k
    return None


def item_se(half_width: float, folds: int, fold_sd: float | None,
            level: float = DEFAULT_LEVEL) -> float:
    """One fold's item standard error from the suite's bootstrap half-width (module doc)."""
    z = _normal_quantile(1 - (1 - level) / 2)
    if folds <= 1 or fold_sd is None:
        return half_width / z
    var = folds * (half_width / z) ** 2 - fold_sd ** 2 * (folds - 1) / folds
    return math.sqrt(max(var, 0.0))


@dataclass(frozen=True)
class SeedSplit:
    """A fold SD split into its seeds' and its folds' parts (:func:`seed_split`)."""

    seed_sd: float  # training seeds on one fold's items, pooled over the folds
    between_sd: float | None  # what a fold adds; None with one fold
    seeds_per_fold: float  # the harmonic mean of the folds' seed counts

    def fold_sd(self, seeds: float) -> float | None:
        """The SD of a fold's mean over ``seeds`` seeds (None: the fold part unknown)."""
        if self.between_sd is None:
            return None
        return math.sqrt(self.between_sd ** 2 + self.seed_sd ** 2 / seeds)


def seed_split(per_run: dict[str, dict[str, float]]) -> SeedSplit | None:
    """The seed SD within folds and the SD between folds of a claim's per-run differences
    (``{fold: {seed: difference}}``), by one-way ANOVA's method of moments: ``s_w²`` the
    pooled within-fold variance, ``s_b² = max(var(fold means) − s_w² / m, 0)`` with ``m``
    the harmonic mean of the seeds a fold.  None where no fold has two seeds."""
    folds = [[float(v) for v in seeds.values()] for seeds in per_run.values() if seeds]
    dof = sum(len(f) - 1 for f in folds)
    if dof < 1:
        return None
    within = sum(sum((v - sum(f) / len(f)) ** 2 for v in f) for f in folds) / dof
    m = len(folds) / sum(1 / len(f) for f in folds)
    between = None
    if len(folds) >= 2:
        means = [sum(f) / len(f) for f in folds]
        grand = sum(means) / len(means)
        var = sum((x - grand) ** 2 for x in means) / (len(means) - 1)
        between = math.sqrt(max(var - within / m, 0.0))
    return SeedSplit(math.sqrt(within), between, m)


@dataclass(frozen=True)
class ClaimPower:
    """One claim's (or part's) numbers and the folds its targets need."""

    claim: str
    folds: int
    fold_sd: float | None
    item_se: float
    floor: float | None
    folds_for_floor: int | None
    folds_for_half: int | None
    lower_bound: bool  # one fold: the item SE stood in for the fold SD
    split: SeedSplit | None = None  # the fold SD's seed and fold parts (several seeds a fold)
    plan_seeds: float | None = None  # seeds a fold the folds needed assume (None: the pilot's)

    @property
    def folds_needed(self) -> int | None:
        got = [self.folds_for_floor, self.folds_for_half]
        return None if None in got else max(got)  # type: ignore[type-var]


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?", text)]


def claim_power(claim: str, per_fold: list[float], low: float, high: float,
                floor: float | None, target_floor: float, target_half: float,
                level: float = DEFAULT_LEVEL, per_run: dict[str, dict[str, float]] | None = None,
                seeds: int | None = None) -> ClaimPower:
    """:class:`ClaimPower` from a claim's per-fold differences and bootstrap interval;
    ``per_run`` (``{fold: {seed: difference}}``) splits the fold SD, and ``seeds`` plans
    with that many seeds a fold instead of the pilot's (it needs the split)."""
    k = len(per_fold)
    mean = sum(per_fold) / k if k else 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in per_fold) / (k - 1)) if k >= 2 else None
    se = item_se((high - low) / 2, k, sd, level)
    plan_sd = sd if sd is not None else se
    split = seed_split(per_run) if per_run else None
    planned = None
    if seeds is not None and split is not None and split.fold_sd(seeds) is not None:
        plan_sd, planned = split.fold_sd(seeds), float(seeds)  # type: ignore[assignment]
    return ClaimPower(claim, k, sd, se, floor,
                      folds_needed(plan_sd, target_floor, factor=floor_factor(level),
                                   level=level),
                      folds_needed(plan_sd, target_half, level=level), sd is None, split,
                      planned)


def _wall_per_fold(folder: Path, seeds: int, per_fold: int = 1
                   ) -> tuple[float, float] | None:
    """Seconds one fold of the pilot took, all arms and seeds together, and what it would
    have taken with nothing served from the reuse store (each run's wall time plus the
    seconds reuse spared it): from the runs' metrics rows where the folder has them
    (``seeds``: the folds they make up), else its "Where the time went" table (an arm's
    mean run, times ``per_fold`` seeds a fold)."""
    from fedkt.tracking.rows import read_rows, time_breakdown

    walls, wholes = [], []
    for metrics in sorted(folder.glob("*/**/metrics.jsonl")):
        try:
            spent = time_breakdown(read_rows(metrics))
        except (OSError, ValueError):
            spent = None
        if spent is not None:
            walls.append(spent["wall"])
            wholes.append(spent["wall"] + spent["saved"])
    if walls:
        return sum(walls) / max(1, seeds), sum(wholes) / max(1, seeds)
    table = folder / "suite.md"
    if not table.is_file():
        return None
    lines = table.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        start = lines.index("## Where the time went")
    except ValueError:
        return None
    per_arm, spared, spared_at = [], [], None
    for line in lines[start:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("## ") and line != lines[start]:
            break
        if len(cells) > 2 and not cells[0] and cells[1] == "wall (s)":  # the header
            spared_at = next((i for i, c in enumerate(cells) if c.startswith("spared")), None)
        elif len(cells) > 2 and cells[0] and cells[0] not in ("all runs",) and \
                re.fullmatch(r"\d+(\.\d+)?", cells[1]):
            per_arm.append(float(cells[1]))  # an arm's mean wall seconds per run
            got = cells[spared_at] if spared_at is not None and spared_at < len(cells) else ""
            spared.append(float(got) if re.fullmatch(r"\d+(\.\d+)?", got) else 0.0)
    if not per_arm:
        return None
    return sum(per_arm) * per_fold, (sum(per_arm) + sum(spared)) * per_fold


def pilot_power(folder: str | Path, target_floor: float, target_half: float,
                seeds: int | None = None
                ) -> tuple[list[ClaimPower], dict[str, float | int | None]]:
    """Per claim (a joint claim: per part) :class:`ClaimPower`, and the pilot's design:
    seeds per fold, arms, seconds per fold (all arms and seeds).  A claim that is also a
    part of another (a suite that declares a joint claim and its parts alone) gets one
    row.  ``seeds``: plan with that many seeds a fold (:func:`claim_power`)."""
    folder = Path(folder)
    result = read_suite_result(folder)
    rows: list[ClaimPower] = []
    for part, first in claim_parts(result.claims.values()):
        if not first:
            continue
        per = part.get("per_seed")
        values = [float(v) for v in per.values()] if isinstance(per, dict) and per else \
            [float(x) for x in str(part.get("per_seed_text") or "").split(",")
             if x.strip() not in ("", "-")]
        ci = _numbers(str(part.get("ci", "")))
        if not values or len(ci) != 2:
            continue
        floor = part.get("floor")
        if not isinstance(floor, int | float):
            got = _numbers(str(part.get("floor_text", "")))
            floor = got[0] if got else None
        per_run = part.get("per_run")
        rows.append(claim_power(part["claim"], values, ci[0], ci[1], floor,
                                target_floor, target_half,
                                per_run=per_run if isinstance(per_run, dict) else None,
                                seeds=seeds))
    import json

    data = {}
    if (folder / "suite.json").is_file():
        data = json.loads((folder / "suite.json").read_text())
    seeds = len(data.get("seeds") or []) or (rows[0].folds if rows else 1)
    folds = data.get("folds") or {}
    if folds:  # the suite's design: seeds inside folds
        declared = len(set(folds.values()))
        per = max(1, len(folds) // declared)
        # a suite stopped part-way: the folds that have results
        n_folds = min(declared, max(r.folds for r in rows)) if rows else declared
    else:  # each seed its own unit
        n_folds, per = seeds, 1
    spent = _wall_per_fold(folder, n_folds, per)
    arms = len({r.get("arm") for r in data.get("table", []) if not
                str(r.get("arm", "")).startswith("round 0")}) or None
    return rows, {"seeds_per_fold": per, "arms": arms,
                  "seconds_per_fold": spent[0] if spent else None,
                  "whole_seconds_per_fold": spent[1] if spent else None, "folds": n_folds}


def suite_targets(folder: str | Path) -> tuple[float | None, float | None]:
    """The pilot's own ``target_floor`` and ``target_half_width`` (its suite.yaml), if any."""
    import yaml

    try:
        raw = yaml.safe_load((Path(folder) / "suite.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None, None
    if not isinstance(raw, dict):
        return None, None
    out = []
    for key in ("target_floor", "target_half_width"):
        value = raw.get(key)
        out.append(float(value) if isinstance(value, int | float) and value > 0 else None)
    return out[0], out[1]


def _sd(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def power_report(folder: str | Path, target_floor: float = 0.10,
                 target_half: float = 0.06, seeds: int | None = None) -> str:
    """The table ``fedkt suite power`` prints (``seeds``: plan with that many seeds a fold)."""
    if target_floor <= 0 or target_half <= 0:
        raise ValueError("--target-floor and --half-width must be positive")
    if seeds is not None and seeds < 1:
        raise ValueError("--seeds must be at least 1")
    rows, design = pilot_power(folder, target_floor, target_half, seeds)
    if not rows:
        raise ValueError(f"{folder}: no claim with per-fold differences and an interval")
    pilot_m, arms, sec = design["seeds_per_fold"], design["arms"], design["seconds_per_fold"]
    whole = design["whole_seconds_per_fold"]
    if not (sec and whole and whole > sec * 1.01):  # reuse spared the pilot under 1%
        whole = None
    table = []
    unplanned = []
    for r in rows:
        need = r.folds_needed
        bound = "≥" if r.lower_bound else ""
        m = pilot_m
        if seeds is not None and r.plan_seeds is not None:
            m = seeds
        elif seeds is not None and seeds != pilot_m:
            unplanned.append(r.claim)
        per_fold = sec * m / pilot_m if sec and pilot_m else sec
        runs = need * m * arms if need is not None and arms else None
        hours = need * per_fold / 3600 if need is not None and per_fold else None
        upper = (f"-{need * whole * m / pilot_m / 3600:.1f}"
                 if whole and hours is not None else "")
        split = r.split
        table.append([r.claim, str(r.folds), _sd(r.fold_sd), f"{r.item_se:.3f}",
                      _sd(split.seed_sd if split else None),
                      _sd(split.between_sd if split else None),
                      "-" if r.floor is None else f"{r.floor:.3f}",
                      f"{bound}{r.folds_for_floor}" if r.folds_for_floor else f">{MAX_FOLDS}",
                      f"{bound}{r.folds_for_half}" if r.folds_for_half else f">{MAX_FOLDS}",
                      f"{bound}{need} x {m}" if need else "-",
                      f"{bound}{runs}" if runs else "-",
                      f"{bound}{hours:.1f}{upper}" if hours is not None else "-"])
    plan = (f"- planned with {seeds} seed(s) per fold: the fold SD √(between² + seed SD² / "
            f"{seeds})" + (f"; {len(unplanned)} of {len(rows)} claim(s) kept at the pilot's "
                           f"{pilot_m}: no between-folds part to plan with (one fold, or one "
                           "seed a fold)" if unplanned else "")
            ) if seeds is not None else None
    lines = [f"# Power from the pilot {folder}", "",
             f"- targets: detection floor {target_floor:.3f}, 95% half-width {target_half:.3f}",
             f"- pilot: {design['folds']} fold(s), {pilot_m} seed(s) per fold, "
             f"{arms or '?'} arms; "
             + (f"{sec / 3600:.2f} h per fold (all arms and seeds, one after another)"
                if sec else "no recorded wall times")
             + (f", up to {whole / 3600:.2f} h with nothing served from the reuse store "
                "(each run's wall time plus the seconds it spared; hours: the range)"
                if whole else ""),
             "- fold SD: of the per-fold differences; item SE: one fold's, from its test items; "
             "folds for a target: the smallest K >= 4 whose folds' t-interval reaches it "
             "(≥: one fold, the item SE standing in for the fold SD, a lower bound); seed SD: "
             "training seeds on one fold's items; between folds: what a fold adds beyond its "
             "seeds' mean (several seeds a fold); runs: folds x seeds per fold x arms "
             "(docs/evidence.md, \"Power before the run\")",
             *([plan] if plan else []), "",
             format_table(["claim", "folds", "fold SD", "item SE", "seed SD",
                           "between folds", "floor",
                           f"folds for floor {target_floor:.2f}",
                           f"folds for half-width {target_half:.2f}", "folds x seeds", "runs",
                           "hours"], table, markdown=True)]
    return "\n".join(lines) + "\n"
