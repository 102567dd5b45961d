"""``fedkt`` that pauses in round N before the checkpoint, for tests that kill it there.

    python -m tests.support.paused_run N fedkt-arguments...   (e.g. ``2 run config.yaml -q``)

It runs :func:`fedkt.cli.main` with the arguments after N, like ``python -m fedkt.cli``,
with one change: in round N the server says so on stderr (:data:`PAUSE_LINE`) and sleeps
``PAUSE_SECONDS`` after the clients replied and the round's metrics rows were written,
just before its checkpoint marks the round complete (``fedkt.tracking.checkpoint.mark_checkpoint`` is
wrapped: the round's rows are logged, its checkpoint is not yet the latest).
"""

from __future__ import annotations

import sys
import time
from typing import Any

PAUSE_SECONDS = 600.0
PAUSE_LINE = "fedkt: paused in round {rnd} before the checkpoint"


def pause_before_checkpoint(rnd: int, seconds: float = PAUSE_SECONDS) -> None:
    """Make the job stop for ``seconds`` in round ``rnd`` just before its checkpoint."""
    from fedkt.tracking import checkpoint

    mark = checkpoint.mark_checkpoint

    def paused(recorder: Any, at: int, *rest: Any) -> None:
        if at == rnd:
            print(PAUSE_LINE.format(rnd=at), file=sys.stderr, flush=True)
            time.sleep(seconds)
        mark(recorder, at, *rest)

    checkpoint.mark_checkpoint = paused


if __name__ == "__main__":
    from fedkt.cli import main

    pause_before_checkpoint(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
