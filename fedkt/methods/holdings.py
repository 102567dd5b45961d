"""What each client already holds of what the server sends it: one primitive for every method.

A server sends some objects again and again by reference only: the global student a
FedKD client keeps in sync, the small model a KOALA client trains, the S_0 an LLM2SLM
client received once, the auxiliary model a FedSP client stores, the frozen backbone a
vision FedAvg client runs.  Each is a *named, versioned* object:

* server side, :class:`Holdings` (``server.holdings``) records, per client, the version
  of each object it holds.  :meth:`Holdings.offer` puts ``NAME_version`` in a request
  and the object itself under ``NAME`` only when the client does not hold that version;
  :meth:`Holdings.confirm` records, after the call, that the clients which replied hold
  it and forgets it for those that failed (they get it again next time).  The runner
  checkpoints it with the server's state, so a resumed run sends exactly what an
  uninterrupted one would;
* client side, :meth:`fedkt.methods.base.ClientContext.received` takes the object from
  the request (and keeps it on the client's disk at its version) or from the client's
  own copy of that version (:meth:`~fedkt.methods.base.ClientContext.cached`); a client
  that lacks it fails the call with a :class:`~fedkt.federated.payload.PayloadError`, is excluded
  from the round, and is sent the object next time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fedkt.federated.payload import Payload

__all__ = ["Holdings", "Version", "version_field"]

Version = int | str


def version_field(name: str) -> str:
    """The request field that carries the version of object ``name``."""
    return f"{name}_version"


class Holdings:
    """Per client, the version of each object it holds (as far as the server knows)."""

    def __init__(self) -> None:
        self._held: dict[int, dict[str, str]] = {}

    def holds(self, cid: int, name: str, version: Version) -> bool:
        """Whether client ``cid`` holds ``name`` at ``version``."""
        return self._held.get(cid, {}).get(name) == str(version)

    def lacking(self, cids: Iterable[int], name: str, version: Version) -> list[int]:
        """The clients among ``cids`` that do not hold ``name`` at ``version``."""
        return [cid for cid in cids if not self.holds(cid, name, version)]

    def offer(self, msg: Payload, cid: int, name: str, version: Version, value: Any) -> Payload:
        """Refer to ``name`` at ``version`` in a request to ``cid``: the version always, the
        value (under ``name``) only when the client does not hold that version."""
        msg[version_field(name)] = version
        if not self.holds(cid, name, version):
            msg[name] = value
        return msg

    def confirm(self, asked: Iterable[int], replied: Iterable[int], name: str,
                version: Version) -> None:
        """After a call that sent or used ``name`` at ``version``: the clients that replied
        hold it; those asked that did not reply are taken to hold nothing of it."""
        done = set(replied)
        for cid in asked:
            if cid in done:
                self._held.setdefault(cid, {})[name] = str(version)
            else:
                self._held.get(cid, {}).pop(name, None)

    def state_dict(self) -> dict[str, dict[str, str]]:
        """JSON-able: ``{"<cid>": {name: version}}`` (what the runner checkpoints)."""
        return {str(cid): dict(sorted(held.items()))
                for cid, held in sorted(self._held.items()) if held}

    def load_state_dict(self, state: dict[str, dict[str, str]]) -> None:
        self._held = {int(cid): {str(k): str(v) for k, v in held.items()}
                      for cid, held in state.items()}
