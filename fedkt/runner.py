"""``fedkt run``: a job on the runtime its config names.

The runner only picks the runtime (:mod:`fedkt.runtime.registry`) and hands it the job
(:func:`fedkt.runtime.job.run_job`), which the runtime runs where the server is: in this
process (``local``, ``flower-sim``) or in the SuperLink's ServerApp (``flower``), as a
Flower ``ServerApp`` wraps its main function.
"""

from __future__ import annotations

from typing import Any

from fedkt.config import RunConfig
from fedkt.runtime.job import run_job
from fedkt.runtime.registry import get_runtime

__all__ = ["run"]


def run(cfg: RunConfig, *, resume: bool = False, quiet: bool = False) -> list[dict[str, Any]]:
    """Run (or resume) a job on the runtime its config names; returns its metrics rows."""
    return get_runtime(cfg.runtime.name)(cfg, run_job, resume=resume, quiet=quiet)
