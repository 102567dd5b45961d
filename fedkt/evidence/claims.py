"""Claims: one line each, decided by the paired confidence interval.

Grammar (spaces optional)::

    ARM[@ROUND].GROUP.METRIC  OP  [FACTOR *] (ARM[@ROUND].GROUP.METRIC | NUMBER)  [(+|-) OFFSET]
    ARM[@ROUND].GROUP.METRIC  ~=  [FACTOR *] (ARM[@ROUND].GROUP.METRIC | NUMBER)  [(+|-) OFFSET]
                              +- TOLERANCE

* ``OP`` is ``>``, ``>=``, ``<`` or ``<=``; ``~=`` is equivalence within ``TOLERANCE``
  (``+-`` or ``±``), e.g. a control at chance: ``shuffled.server.accuracy ~= 0.2 +- 0.1``;
* ``GROUP`` is ``server``, ``clients`` (mean over clients, paired client by
  client), ``client_K`` or another participant name;
* ``ARM@0`` is that arm's round-0 evaluation (``eval.round0``), the zero-shot row.

Examples: ``fedmkt.clients.accuracy > standalone.clients.accuracy``,
``fedmkt.server.accuracy >= 0.9 * centralized.server.accuracy``,
``koala.server.accuracy >= baseline.server.accuracy - 0.07``.

The claim is the sign of ``D = LHS - (FACTOR * RHS + OFFSET)``.  For ``>``/``>=``:

* **reproduced** when the whole CI of D is above 0,
* **contradicted** when the whole CI is below 0,
* **not resolved** when the CI contains 0 (it straddles or touches the boundary).

``<``/``<=`` mirror this.  ``>`` and ``>=`` are decided alike: an interval that
touches the boundary decides neither way.  For ``~=`` (|D| < TOLERANCE):

* **reproduced** when the whole CI of D lies inside (-TOLERANCE, +TOLERANCE),
* **contradicted** when the whole CI lies outside it (above +TOLERANCE or below -TOLERANCE),
* **not resolved** otherwise: a wide CI never proves equivalence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Claim", "ClaimError", "Ref", "parse_claim", "verdict"]

REPRODUCED, NOT_RESOLVED, CONTRADICTED = "reproduced", "not resolved", "contradicted"

_NAME = r"[A-Za-z0-9][A-Za-z0-9_\-]*"
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_REF = rf"{_NAME}(?:@\d+)?\.{_NAME}\.{_NAME}"
_POS = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_CLAIM = re.compile(
    rf"^\s*(?P<lhs>{_REF})\s*(?P<op>>=|<=|~=|>|<)\s*(?:(?P<factor>{_NUM})\s*\*\s*)?"
    rf"(?P<rhs>{_REF}|{_NUM})\s*(?:(?P<sign>[+-])\s*(?P<offset>\d+\.?\d*(?:[eE][-+]?\d+)?))?"
    rf"\s*(?:(?:\+-|±)\s*(?P<tol>{_POS}))?\s*$"
)


class ClaimError(ValueError):
    """A claim line that does not parse or names an unknown arm."""


@dataclass(frozen=True)
class Ref:
    """``ARM[@ROUND].GROUP.METRIC``."""

    arm: str
    round: int | None
    group: str
    metric: str

    @classmethod
    def parse(cls, text: str) -> Ref:
        arm_part, group, metric = text.split(".")
        arm, _, rnd = arm_part.partition("@")
        return cls(arm, int(rnd) if rnd else None, group, metric)

    def __str__(self) -> str:
        at = f"@{self.round}" if self.round is not None else ""
        return f"{self.arm}{at}.{self.group}.{self.metric}"


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
        return {self.lhs.arm} | ({self.rhs.arm} if isinstance(self.rhs, Ref) else set())


def parse_claim(text: str, arms: set[str] | None = None) -> Claim:
    """Parse one claim line; with ``arms``, unknown arm names are refused."""
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
    rhs: Ref | float = Ref.parse(rhs_text) if re.fullmatch(_REF, rhs_text) else float(rhs_text)
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
