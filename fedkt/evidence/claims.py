"""Claims: one line each, decided by the paired confidence interval.

Grammar (spaces optional)::

    ARM[@ROUND].GROUP.METRIC  OP  [FACTOR *] (ARM[@ROUND].GROUP.METRIC | NUMBER)  [(+|-) OFFSET]
    ARM[@ROUND].GROUP.METRIC  ~=  [FACTOR *] (ARM[@ROUND].GROUP.METRIC | NUMBER)  [(+|-) OFFSET]
                              +- TOLERANCE

* ``OP`` is ``>``, ``>=``, ``<`` or ``<=``; ``~=`` is equivalence within ``TOLERANCE``
  (``+-`` or ``±``), e.g. a control at chance: ``shuffled.server.accuracy ~= 0.2 +- 0.1``;
* ``GROUP`` is ``server``, ``clients`` (mean over clients, paired client by
  client), ``client_K`` or another participant name;
* ``ARM@0`` is that arm's round-0 evaluation (``eval.round0``), the zero-shot row;
* ``max(ARM1, ARM2).GROUP.METRIC`` (right-hand side) is the larger of the arms, paired
  item by item and taken on each resample: a claim against the stronger of two controls,
  e.g. ``fedmkt.server.accuracy_cli > max(shuffled, marginal).server.accuracy_cli``.

* ``CLAIM and CLAIM [and ...]``: a joint claim (transfer *and* no forgetting), decided
  by :func:`decide_joint` from each part's own verdict.

Examples: ``fedmkt.clients.accuracy > standalone.clients.accuracy``,
``fedmkt.server.accuracy >= 0.9 * centralized.server.accuracy``,
``koala.server.accuracy >= baseline.server.accuracy - 0.07``.

The claim is the sign of ``D = LHS - (FACTOR * RHS + OFFSET)``.  For ``>``/``>=``:

* **reproduced** when the whole CI of D is above 0,
* **contradicted** when the whole CI is below 0,
* **not resolved** when the CI contains 0 (it straddles or touches the boundary).

``<``/``<=`` mirror this.  That is the interval's verdict (:func:`verdict`); a suite's
verdict (:func:`decide`) asks more of the seeds (or folds) before it says reproduced or
contradicted:

* at least ``MIN_SEEDS`` (4) seeds;
* their own differences agree with the interval's side in all but at most one seed;
* the seeds' t-interval (:func:`fedkt.evidence.stats.seed_interval`) is on that side too.

An interval that decides but seeds that do not is **fragile**, with the reason
(``fragile: 2 seeds (4 needed)``, ``fragile: 2 of 5 seeds disagree``, ``fragile: the
seeds' t-interval contains 0``).  A **not resolved** verdict says whether the estimate lies
below the claim's detection floor (the smallest true difference its items and seeds detect
with 80% power: :func:`fedkt.evidence.stats.detection_floor`).  A quantity that no
resample and no seed moves (a model's size, bytes by design) is decided by its interval
alone, and only that: both sides run-level numbers (no per-example predictions, so no
item resample can move them), a zero-width interval, and at least ``MIN_FIXED_SEEDS`` (2)
seeds that all gave the same difference.  A per-example metric whose interval happens to
have zero width (two arms right on the same items) still needs ``MIN_SEEDS`` seeds.  ``>`` and ``>=`` are decided alike: an interval that
touches the boundary decides neither way.  For ``~=`` (|D| < TOLERANCE):

* **reproduced** when the whole CI of D lies inside (-TOLERANCE, +TOLERANCE),
* **contradicted** when the whole CI lies outside it (above +TOLERANCE or below -TOLERANCE),
* **not resolved** otherwise: a wide CI never proves equivalence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Claim", "ClaimError", "Decision", "Joint", "Ref", "claim_parts", "decide",
           "decide_joint", "is_ref", "parse_claim", "verdict"]

REPRODUCED, NOT_RESOLVED, CONTRADICTED = "reproduced", "not resolved", "contradicted"
FRAGILE = "fragile"
MIN_SEEDS = 4  # seeds (or folds) a suite's "reproduced" / "contradicted" needs
# Seeds that must give the identical difference before a run-level number (bytes by design)
# is decided without MIN_SEEDS: one seed cannot show that a seed does not move it.
MIN_FIXED_SEEDS = 2

_NAME = r"[A-Za-z0-9][A-Za-z0-9_\-]*"
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_REF = rf"{_NAME}(?:@\d+)?\.{_NAME}\.{_NAME}"
_MAX = rf"max\(\s*{_NAME}(?:\s*,\s*{_NAME})+\s*\)(?:@\d+)?\.{_NAME}\.{_NAME}"
_POS = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_CLAIM = re.compile(
    rf"^\s*(?P<lhs>{_REF})\s*(?P<op>>=|<=|~=|>|<)\s*(?:(?P<factor>{_NUM})\s*\*\s*)?"
    rf"(?P<rhs>{_MAX}|{_REF}|{_NUM})\s*(?:(?P<sign>[+-])\s*(?P<offset>\d+\.?\d*(?:[eE][-+]?\d+)?))?"
    rf"\s*(?:(?:\+-|±)\s*(?P<tol>{_POS}))?\s*$"
)


class ClaimError(ValueError):
    """A claim line that does not parse or names an unknown arm."""


@dataclass(frozen=True)
class Ref:
    """``ARM[@ROUND].GROUP.METRIC``, or ``max(ARM, ARM...)[@ROUND].GROUP.METRIC`` (the
    larger of the arms on each resample; right-hand side only)."""

    arm: str
    round: int | None
    group: str
    metric: str
    others: tuple[str, ...] = ()  # max(arm, *others)

    @property
    def arms(self) -> tuple[str, ...]:
        return (self.arm, *self.others)

    @classmethod
    def parse(cls, text: str) -> Ref:
        text = re.sub(r"\s+", "", text)
        if text.startswith("max("):
            inside, _, rest = text[4:].partition(")")
            names = inside.split(",")
            rnd, group, metric = re.fullmatch(r"(?:@(\d+))?\.([^.]+)\.([^.]+)", rest).groups()
            return cls(names[0], int(rnd) if rnd else None, group, metric, tuple(names[1:]))
        arm_part, group, metric = text.split(".")
        arm, _, rnd = arm_part.partition("@")
        return cls(arm, int(rnd) if rnd else None, group, metric)

    def __str__(self) -> str:
        at = f"@{self.round}" if self.round is not None else ""
        head = f"max({', '.join(self.arms)})" if self.others else self.arm
        return f"{head}{at}.{self.group}.{self.metric}"


@dataclass(frozen=True)
class Claim:
    text: str
    lhs: Ref
    op: str
    rhs: Ref | float
    factor: float = 1.0
    offset: float = 0.0
    tolerance: float | None = None  # ``~=``: |D| < tolerance

    @property
    def greater(self) -> bool:
        return self.op in (">", ">=")

    def arms(self) -> set[str]:
        return {self.lhs.arm} | (set(self.rhs.arms) if isinstance(self.rhs, Ref) else set())


@dataclass(frozen=True)
class Joint:
    """Claims joined with ``and``: an intersection-union test (:func:`decide_joint`)."""

    text: str
    parts: tuple[Claim, ...]

    def arms(self) -> set[str]:
        return set().union(*(p.arms() for p in self.parts))


_AND = re.compile(r"\s+and\s+")


def is_ref(text: str) -> bool:
    """Whether ``text`` is one side of a claim, ``ARM[@ROUND].GROUP.METRIC``."""
    return re.fullmatch(_REF, re.sub(r"\s+", "", text or "")) is not None


def parse_claim(text: str, arms: set[str] | None = None) -> Claim | Joint:
    """Parse one claim line (parts joined with ``and`` give a :class:`Joint`); with
    ``arms``, unknown arm names are refused."""
    pieces = _AND.split((text or "").strip())
    if len(pieces) > 1:
        if any(not p for p in pieces):
            raise ClaimError(f"claim {text!r}: 'and' joins two claims; one side is empty")
        return Joint(text.strip(), tuple(_parse_one(p, arms) for p in pieces))
    return _parse_one(text, arms)


def _parse_one(text: str, arms: set[str] | None = None) -> Claim:
    m = _CLAIM.match(text or "")
    if not m:
        raise ClaimError(
            f"claim {text!r} does not parse; write ARM.GROUP.METRIC OP [FACTOR *] "
            "ARM.GROUP.METRIC [+|- OFFSET] (or ~= ... +- TOLERANCE), e.g. "
            "'fedmkt.clients.accuracy > standalone.clients.accuracy'")
    if (m["op"] == "~=") != (m["tol"] is not None):
        raise ClaimError(f"claim {text!r}: '~=' needs '+- TOLERANCE' (a positive number), "
                         "and only '~=' takes one")
    tol = float(m["tol"]) if m["tol"] is not None else None
    if tol is not None and tol <= 0:
        raise ClaimError(f"claim {text!r}: the tolerance must be positive")
    rhs_text = m["rhs"]
    rhs: Ref | float = (Ref.parse(rhs_text) if re.fullmatch(_REF, rhs_text)
                        or re.fullmatch(_MAX, rhs_text) else float(rhs_text))
    offset = float(m["offset"] or 0.0) * (-1 if m["sign"] == "-" else 1)
    claim = Claim(text.strip(), Ref.parse(m["lhs"]), m["op"], rhs,
                  float(m["factor"]) if m["factor"] else 1.0, offset, tol)
    if arms is not None:
        unknown = sorted(claim.arms() - arms)
        if unknown:
            raise ClaimError(f"claim {text!r} names unknown arm(s) {unknown}; "
                             f"arms: {sorted(arms)}")
    return claim


def verdict(claim: Claim, low: float, high: float) -> str:
    """The verdict of a claim given the CI ``[low, high]`` of its ``D``."""
    if claim.tolerance is not None:  # ~=: equivalence within the tolerance
        tol = claim.tolerance
        if -tol < low and high < tol:
            return REPRODUCED
        if low > tol or high < -tol:
            return CONTRADICTED
        return NOT_RESOLVED
    if not claim.greater:
        low, high = -high, -low
    if low > 0:
        return REPRODUCED
    if high < 0:
        return CONTRADICTED
    return NOT_RESOLVED


@dataclass(frozen=True)
class Decision:
    """A suite's verdict on a claim and, unless it is plain, why (:func:`decide`)."""

    verdict: str
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}" if self.reason else self.verdict


def _seed_side(claim: Claim, value: float, side: str) -> bool:
    """Whether one seed's difference lies on the side the interval decided (``side``)."""
    if claim.tolerance is not None:
        inside = abs(value) < claim.tolerance
        return inside if side == REPRODUCED else not inside
    if not claim.greater:
        value = -value
    return value > 0 if side == REPRODUCED else value < 0


def decide(claim: Claim, low: float, high: float, per_seed: tuple[float, ...] | list[float],
           *, seed_interval: tuple[float, float] | None = None, estimate: float | None = None,
           floor: float | None = None, min_seeds: int = MIN_SEEDS,
           fixed: bool = False, unit: str = "seed") -> Decision:
    """A suite's verdict: the interval's (:func:`verdict`) if the seeds carry it, else
    ``fragile`` with the reason; ``not resolved`` says when the estimate is below the
    detection ``floor`` (module docstring).  ``fixed``: both sides are run-level numbers
    without per-example data (bytes, sizes); only then may an exact result skip the seed
    count, and only with ``MIN_FIXED_SEEDS`` seeds that all gave the same difference.
    ``unit``: what ``per_seed`` holds one of, as the reasons name it (``fold`` where the
    suite's unit is the fold: each value a fold's mean over its seeds)."""
    side = verdict(claim, low, high)
    if side == NOT_RESOLVED:
        if floor is not None and estimate is not None and claim.tolerance is None:
            d = estimate if claim.greater else -estimate
            if abs(d) < floor:
                return Decision(NOT_RESOLVED, f"the estimate's size is below the detection floor {floor:.3f}")
        return Decision(NOT_RESOLVED, "the interval contains the boundary")
    k = len(per_seed)
    if fixed and high == low and k >= MIN_FIXED_SEEDS and len(set(per_seed)) == 1:
        return Decision(side)  # a run-level number that no resample and no seed moved
    if k < min_seeds:
        return Decision(FRAGILE, f"{side} by the interval, but {k} {unit}{'s' * (k != 1)} "
                                 f"({min_seeds} needed)")
    against = sum(not _seed_side(claim, v, side) for v in per_seed)
    if against > 1:
        return Decision(FRAGILE, f"{side} by the interval, but {against} of {k} {unit}s disagree")
    if seed_interval is not None and verdict(claim, *seed_interval) != side:
        return Decision(FRAGILE, f"{side} by the interval, but the {unit}s' t-interval "
                                 f"[{seed_interval[0]:+.3f}, {seed_interval[1]:+.3f}] does not "
                                 "agree")
    return Decision(side)


def decide_joint(parts: list[Decision] | tuple[Decision, ...]) -> Decision:
    """A joint claim's verdict from its parts', each decided on its own at the suite's
    level (an intersection-union test needs no correction): **reproduced** only if every
    part is, **contradicted** if any part is, else **not resolved**, naming the parts that
    held it back.  A part that was not decided at all (not run, an error) gives its word."""
    words = [p.verdict for p in parts]
    for k, word in enumerate(words, 1):
        if word not in (REPRODUCED, CONTRADICTED, NOT_RESOLVED, FRAGILE):
            return Decision(word, f"part {k}")
    against = [k for k, w in enumerate(words, 1) if w == CONTRADICTED]
    if against:
        return Decision(CONTRADICTED, "part" + "s" * (len(against) > 1) + " "
                        + ", ".join(map(str, against)) + " contradicted")
    if all(w == REPRODUCED for w in words):
        return Decision(REPRODUCED)
    held = [f"part {k} {p}" for k, p in enumerate(parts, 1) if p.verdict != REPRODUCED]
    return Decision(NOT_RESOLVED, "; ".join(held))


def claim_parts(records: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], bool]]:
    """Each decided claim's parts (a claim that is not joint: itself), with whether it is
    the first of its text: a suite that declares a joint claim and then its parts alone
    holds each such part twice, and its tables give it one row."""
    seen: set[str] = set()
    for record in records:
        for part in record.get("parts") or [record]:
            yield part, part["claim"] not in seen
            seen.add(part["claim"])
