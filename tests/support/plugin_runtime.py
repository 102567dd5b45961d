"""A runtime defined outside fedkt, as a plugin would define one (``tests/runtime/
test_new_runtime.py``): clients run in this process in the order its settings say, and
every exchange is journalled (the clients in the order they ran, the request bytes) to the
file its settings name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedkt.config import RunConfig
from fedkt.runtime.base import default_state_root, handle_request
from fedkt.runtime.registry import register_runtime

NAME = "journal"


class JournalSettings(BaseModel):
    """``runtime.journal``: this runtime's own settings."""

    model_config = ConfigDict(extra="forbid")

    # The file every exchange is appended to, one JSON line each.
    log: str = Field(min_length=1)
    # Run the clients last id first (else in id order).
    reverse: bool = True


class JournalTransport:
    def __init__(self, settings: JournalSettings, state_root: Path) -> None:
        self.settings, self.state_root = settings, state_root

    def exchange(self, requests: dict[int, bytes], timeout: float
                 ) -> dict[int, bytes | BaseException]:
        order = sorted(requests, reverse=self.settings.reverse)
        replies: dict[int, bytes | BaseException] = {
            cid: handle_request(requests[cid], self.state_root, cid, allow_remote_code=True)
            for cid in order}
        with open(self.settings.log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"clients": order,
                                 "request_bytes": [len(requests[c]) for c in order]}) + "\n")
        return replies

    def close(self) -> None:
        pass


def start(cfg: RunConfig, job: Any, *, resume: bool = False, quiet: bool = False
          ) -> list[dict[str, Any]]:
    settings: JournalSettings = cfg.runtime.journal  # its section, validated on load
    return job(cfg, JournalTransport(settings, default_state_root(cfg)), resume=resume,
               quiet=quiet)


def install() -> None:
    """Register the runtime (a plugin does this when it is imported)."""
    register_runtime(NAME, start, settings=JournalSettings)


install()
