"""A suite's wall time as its runs recorded it: each run's ``environment.json`` holds
``spans``, when each of its processes computed its rounds (``[start, end]`` in UTC;
:func:`fedkt.runtime.job._record_environment`).  The union of a suite's finished runs'
spans, cut where the suite stopped, gives its sittings and their sum: what suite.md's
"Where the time went", suite.json's ``wall``, ``fedkt suite status`` and docs/results.md
report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fedkt.tracking.summary import read_environment

__all__ = ["SITTING_GAP_S", "Wall", "suite_wall"]

#: Runs whose spans lie less than this many seconds apart are one sitting of their suite
#: (its loop starts the next run within seconds of the last); a longer gap is the suite
#: stopped and run again.
SITTING_GAP_S = 120.0


@dataclass(frozen=True)
class Wall:
    """A suite's wall time as its runs recorded it (``environment.json``'s ``spans``)."""

    seconds: float
    sittings: list[tuple[datetime, datetime]]
    timed: int  # runs that recorded their spans
    runs: int

    def duration(self) -> str:
        """``2 h 14 min 39 s``."""
        s = round(self.seconds)
        h, m, s = s // 3600, s % 3600 // 60, s % 60
        return (f"{h} h " if h else "") + f"{m} min {s} s"

    def text(self) -> str:
        """The wall time, its sittings in UTC and which runs it leaves out."""
        def at(a: datetime, b: datetime) -> str:
            end = b.strftime("%H:%M:%S" if a.date() == b.date() else "%Y-%m-%d %H:%M:%S")
            return f"{a:%Y-%m-%d %H:%M:%S}-{end}"

        out = (f"{self.duration()} in {len(self.sittings)} sitting(s) ("
               + ", ".join(at(a, b) for a, b in self.sittings) + " UTC)")
        if self.timed < self.runs:
            out += (f"; {self.runs - self.timed} of its {self.runs} runs recorded no times "
                    "(made before runs recorded their spans), so their time is not in it")
        return out


def _spans(run_dir: Path) -> list[tuple[datetime, datetime]]:
    out = []
    for entry in read_environment(run_dir):
        for span in entry.get("spans") or []:
            try:
                a, b = (datetime.fromisoformat(str(x)) for x in span)
            except (TypeError, ValueError):
                continue  # not a [start, end] pair: read as not recorded
            out.append((a, max(a, b)))
    return out


def suite_wall(folders: Sequence[Path]) -> Wall | None:
    """The wall time of the runs in ``folders``: the union of their recorded spans, spans
    less than :data:`SITTING_GAP_S` apart joined into one sitting; None where no run
    recorded any."""
    spans, timed = [], 0
    for folder in folders:
        mine = _spans(folder)
        timed += bool(mine)
        spans += mine
    if not spans:
        return None
    sittings: list[tuple[datetime, datetime]] = []
    for a, b in sorted(spans):
        if sittings and (a - sittings[-1][1]).total_seconds() < SITTING_GAP_S:
            sittings[-1] = (sittings[-1][0], max(sittings[-1][1], b))
        else:
            sittings.append((a, b))
    seconds = sum((b - a).total_seconds() for a, b in sittings)
    return Wall(seconds, sittings, timed, len(folders))
