"""``fedkt suite run --stop-by WHEN``: a suite that must end by a given time (a machine's
lease, a batch job's wall-time limit) starts no run that would not finish by then.

Each run is started only if the mean wall time of its arm's finished runs in the suite
folder (what ``fedkt suite status`` times the runs left by) fits in the time left; the
first run that does not fit stops the suite from starting any more, so a suite of folds
still stops between runs in its own order.  A run whose arm has no finished run yet is
started while the stop time has not passed (nothing times it).  The runs already going
finish and are kept; then :class:`SuiteStopped` ends the command with
:data:`STOPPED_EXIT`, and the same command goes on later.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["STOPPED_EXIT", "SuiteStopped", "clock", "parse_stop_by", "why_not_start"]

#: The exit status of ``fedkt suite run`` stopped by ``--stop-by`` (EX_TEMPFAIL: the
#: same command later goes on with what is left), apart from 0 (the suite is done).
STOPPED_EXIT = 75

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


class SuiteStopped(Exception):
    """A suite stopped starting runs at its ``--stop-by`` time; the runs it had started
    finished.  The message names the first run not started, why, and how many are left."""


def parse_stop_by(text: str, now: float) -> float:
    """The stop time ``text`` gives, in seconds since the epoch: a duration from ``now``
    (``90m``, ``2h30m``, ``45s``, ``1.5h``) or a time with its zone (``2026-12-06T12:00Z``,
    ``2026-12-06T13:00+01:00``).  Anything else raises ValueError naming ``--stop-by``."""
    text = text.strip()
    match = _DURATION.fullmatch(text)
    if text and match and any(match.groups()):
        hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
        return now + hours * 3600 + minutes * 60 + seconds
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--stop-by {text!r}: give a duration from now (90m, 2h30m, "
                         "45s) or a time with its zone (2026-12-06T12:00Z)") from None
    if when.tzinfo is None:
        raise ValueError(f"--stop-by {text!r}: a time needs its zone (Z for UTC, or "
                         "+01:00): a machine's local time is not assumed")
    return when.timestamp()


def clock(epoch: float) -> str:
    """``epoch`` as a UTC time to the second: ``2026-12-06 12:00:00 UTC``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def why_not_start(estimate: float | None, stop_by: float, now: float) -> str | None:
    """Why a run is not started at ``now`` under the stop time ``stop_by``, or None where
    it starts: ``estimate`` is its arm's mean wall time in seconds (None: no finished run
    of its arm times it, and it starts while the stop time has not passed)."""
    left = stop_by - now
    if left <= 0:
        return f"the stop time ({clock(stop_by)}) has passed"
    if estimate is not None and estimate > left:
        return (f"its arm's mean wall time here, {estimate:.0f} s, is more than the "
                f"{left:.0f} s left before {clock(stop_by)}")
    return None
