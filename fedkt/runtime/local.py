"""The ``local`` runtime: clients run in this process, one after another.

Requests and replies still go through the wire format, so byte counts and
results are identical to the Flower runtimes.  Client state is kept on disk
under the run folder, as a deployed client keeps it on its own machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedkt.config import RunConfig
from fedkt.runtime.base import default_state_root, handle_request


class LocalTransport:
    """In-process transport (no Ray, no servers).

    Its clients run model code the config asks for (``trust_remote_code``): they share the
    process, and the config, of the one who started the run."""

    def __init__(self, state_root: Path | None = None) -> None:
        self.state_root = state_root

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        # Sequential and in order of client id: deterministic; `timeout` is not enforced here.
        return {cid: handle_request(data, self.state_root, cid, allow_remote_code=True)
                for cid, data in sorted(requests.items())}

    def secagg_grid(self, cids: list[int]) -> tuple[object, dict[int, int]]:
        """An in-process Flower grid for SecAgg+ (:mod:`fedkt.runtime.secagg`) and the
        clients' node ids on it."""
        from fedkt.runtime.secagg import LocalGrid

        grid = LocalGrid(lambda cid, data: handle_request(data, self.state_root, cid,
                                                          allow_remote_code=True))
        return grid, {cid: LocalGrid.node(cid) for cid in cids}

    def close(self) -> None:
        pass


def start(cfg: RunConfig, job: Any, *, resume: bool = False, quiet: bool = False
          ) -> list[dict[str, Any]]:
    """The ``local`` runtime: the job here, its clients in this process."""
    return job(cfg, LocalTransport(default_state_root(cfg)), resume=resume, quiet=quiet)
