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
items'; so the fold count is what the targets buy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from fedkt.evidence.across import read_suite_result
from fedkt.evidence.claims import MIN_SEEDS
from fedkt.evidence.stats import DEFAULT_LEVEL, DEFAULT_POWER, _normal_quantile
from fedkt.tracking.tables import format_table

__all__ = ["ClaimPower", "claim_power", "folds_needed", "item_se", "pilot_power",
           "power_report", "suite_targets"]

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

    @property
    def folds_needed(self) -> int | None:
        got = [self.folds_for_floor, self.folds_for_half]
        return None if None in got else max(got)  # type: ignore[type-var]


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?", text)]


def claim_power(claim: str, per_fold: list[float], low: float, high: float,
                floor: float | None, target_floor: float, target_half: float,
                level: float = DEFAULT_LEVEL) -> ClaimPower:
    """:class:`ClaimPower` from a claim's per-fold differences and bootstrap interval."""
    k = len(per_fold)
    mean = sum(per_fold) / k if k else 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in per_fold) / (k - 1)) if k >= 2 else None
    se = item_se((high - low) / 2, k, sd, level)
    plan_sd = sd if sd is not None else se
    return ClaimPower(claim, k, sd, se, floor,
                      folds_needed(plan_sd, target_floor, factor=floor_factor(level),
                                   level=level),
                      folds_needed(plan_sd, target_half, level=level), sd is None)


def _wall_per_fold(folder: Path, seeds: int) -> float | None:
    """Seconds one fold of the pilot took, all arms and seeds together: from the runs'
    metrics rows where the folder has them, else its "Where the time went" table."""
    from fedkt.tracking.rows import read_rows, run_wall_time

    walls = []
    for metrics in sorted(folder.glob("*/**/metrics.jsonl")):
        try:
            wall = run_wall_time(read_rows(metrics))
        except (OSError, ValueError):
            wall = None
        if wall is not None:
            walls.append(wall)
    if walls:
        return sum(walls) / max(1, seeds)
    table = folder / "suite.md"
    if not table.is_file():
        return None
    lines = table.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        start = lines.index("## Where the time went")
    except ValueError:
        return None
    per_arm = []
    for line in lines[start:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[0] and cells[0] not in ("all runs",) and \
                re.fullmatch(r"\d+(\.\d+)?", cells[1]):
            per_arm.append(float(cells[1]))  # an arm's mean wall seconds per run
    return sum(per_arm) if per_arm else None


def pilot_power(folder: str | Path, target_floor: float, target_half: float
                ) -> tuple[list[ClaimPower], dict[str, float | int | None]]:
    """Per claim (a joint claim: per part) :class:`ClaimPower`, and the pilot's design:
    seeds per fold, arms, seconds per fold (all arms and seeds)."""
    folder = Path(folder)
    result = read_suite_result(folder)
    rows: list[ClaimPower] = []
    for text, claim in result.claims.items():
        parts = claim.get("parts") or [claim]
        for part in parts:
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
            rows.append(claim_power(part.get("claim", text), values, ci[0], ci[1], floor,
                                    target_floor, target_half))
    import json

    data = {}
    if (folder / "suite.json").is_file():
        data = json.loads((folder / "suite.json").read_text())
    seeds = len(data.get("seeds") or []) or (rows[0].folds if rows else 1)
    folds = data.get("folds") or {}
    n_folds = len(set(folds.values())) if folds else seeds
    per_fold = _wall_per_fold(folder, n_folds)
    arms = len({r.get("arm") for r in data.get("table", []) if not
                str(r.get("arm", "")).startswith("round 0")}) or None
    return rows, {"seeds_per_fold": max(1, seeds // max(1, n_folds)), "arms": arms,
                  "seconds_per_fold": per_fold, "folds": n_folds}


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


def power_report(folder: str | Path, target_floor: float = 0.10,
                 target_half: float = 0.06) -> str:
    """The table ``fedkt suite power`` prints."""
    if target_floor <= 0 or target_half <= 0:
        raise ValueError("--target-floor and --half-width must be positive")
    rows, design = pilot_power(folder, target_floor, target_half)
    if not rows:
        raise ValueError(f"{folder}: no claim with per-fold differences and an interval")
    m, arms, sec = design["seeds_per_fold"], design["arms"], design["seconds_per_fold"]
    table = []
    for r in rows:
        need = r.folds_needed
        bound = "≥" if r.lower_bound else ""
        runs = need * m * arms if need is not None and arms else None
        hours = need * sec / 3600 if need is not None and sec else None
        table.append([r.claim, str(r.folds), "-" if r.fold_sd is None else f"{r.fold_sd:.3f}",
                      f"{r.item_se:.3f}", "-" if r.floor is None else f"{r.floor:.3f}",
                      f"{bound}{r.folds_for_floor}" if r.folds_for_floor else f">{MAX_FOLDS}",
                      f"{bound}{r.folds_for_half}" if r.folds_for_half else f">{MAX_FOLDS}",
                      f"{bound}{need} x {m}" if need else "-",
                      f"{bound}{runs}" if runs else "-",
                      f"{bound}{hours:.1f}" if hours is not None else "-"])
    lines = [f"# Power from the pilot {folder}", "",
             f"- targets: detection floor {target_floor:.3f}, 95% half-width {target_half:.3f}",
             f"- pilot: {design['folds']} fold(s), {m} seed(s) per fold, {arms or '?'} arms; "
             + (f"{sec / 3600:.2f} h per fold (all arms and seeds, one after another)"
                if sec else "no recorded wall times"),
             "- fold SD: of the per-fold differences; item SE: one fold's, from its test items; "
             "folds for a target: the smallest K >= 4 whose folds' t-interval reaches it "
             "(≥: one fold, the item SE standing in for the fold SD, a lower bound); runs: "
             "folds x seeds per fold x arms (docs/evidence.md, \"Power before the run\")", "",
             format_table(["claim", "folds", "fold SD", "item SE", "floor",
                           f"folds for floor {target_floor:.2f}",
                           f"folds for half-width {target_half:.2f}", "folds x seeds", "runs",
                           "hours"], table, markdown=True)]
    return "\n".join(lines) + "\n"
