"""Shared pieces of the trust tests: transports that record, replay or tamper with the
exact bytes clients send back, each method's tiny config (the one it declares), and one
cached real run per method.

Every wrapper sits around the real transport: clients run the method's real handlers
on real (tiny) models and data; only the bytes of one reply are recorded or edited.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedkt.config import RunConfig, load_config
from fedkt.configs.catalog import resolve_config
from fedkt.federated.payload import Payload, loads
from fedkt.methods import get_method
from fedkt.runtime.base import ENVELOPE

# --------------------------------------------------------------------------- transports


def handler_of(request: bytes) -> str:
    """The client handler a serialised request names."""
    return loads(request, source="server")[ENVELOPE]["handler"]


@dataclass
class Exchange:
    """One client call as it travelled: handler, client, request and reply bytes."""

    handler: str
    cid: int
    request: bytes
    reply: bytes | BaseException


class RecordingTransport:
    """Wraps a transport and keeps every request and the exact bytes of every reply."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[Exchange] = []

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        replies = self.inner.exchange(requests, timeout)
        for cid, data in sorted(requests.items()):
            if cid in replies:
                self.calls.append(Exchange(handler_of(data), cid, data, replies[cid]))
        return replies

    def close(self) -> None:
        self.inner.close()


class ReplayTransport:
    """Answers each request with the reply the real client sent to the same (handler, cid,
    n-th call) in a recorded run of the same config: the server side runs for real, the
    clients' real bytes come from the recording (so the fault tests do not retrain)."""

    def __init__(self, calls: list[Exchange]) -> None:
        self.recorded: dict[tuple[str, int], list[bytes | BaseException]] = {}
        for c in calls:
            self.recorded.setdefault((c.handler, c.cid), []).append(c.reply)
        self.seen: dict[tuple[str, int], int] = {}

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        out: dict[int, bytes | BaseException] = {}
        for cid, data in sorted(requests.items()):
            key = (handler_of(data), cid)
            n = self.seen.get(key, 0)
            self.seen[key] = n + 1
            out[cid] = self.recorded[key][n]
        return out

    def close(self) -> None:
        pass


Tamper = Callable[[Payload], "Payload | bytes | None"]


class TamperingTransport:
    """Wraps a transport and corrupts the reply of client ``cid`` to ``handler``.

    ``tamper`` gets the parsed reply and returns the edited payload (re-serialised with
    :func:`fedkt.federated.payload.dumps`), raw bytes to send instead, or ``None``: the reply never
    arrives (the server's transport times out on that client).
    """

    def __init__(self, inner: Any, cid: int, handler: str, tamper: Tamper) -> None:
        self.inner, self.cid, self.handler, self.tamper = inner, cid, handler, tamper
        self.tampered = 0

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        from fedkt.federated.payload import dumps

        replies = dict(self.inner.exchange(requests, timeout))
        data = requests.get(self.cid)
        if data is not None and handler_of(data) == self.handler and self.cid in replies:
            self.tampered += 1
            got = self.tamper(loads(replies[self.cid], source=f"client {self.cid}"))
            if got is None:
                del replies[self.cid]
            else:
                replies[self.cid] = got if isinstance(got, bytes) else dumps(got)
        return replies

    def close(self) -> None:
        self.inner.close()


# --------------------------------------------------------------------------- configs


def tiny_config(method: str, root: Path, *overrides: str, name: str = "run") -> RunConfig:
    """The method's own tiny config (``Method.conformance.tiny_config``) as ``method``, 1 round unless
    overridden, its run folder ``root / name``."""
    spec = get_method(method).conformance.tiny_config
    assert spec, f"method {method!r} declares no tiny_config"
    return load_config(resolve_config(spec), [f"method.name={method}", "rounds=1",
                                              f"name={name}", f"output_dir={root / name}",
                                              "eval.plots=false", *overrides])


# --------------------------------------------------------------------------- runs


@dataclass
class RecordedRun:
    cfg: RunConfig
    rows: list[dict]
    calls: list[Exchange] = field(default_factory=list)

    def replies(self) -> list[Exchange]:
        return [c for c in self.calls if isinstance(c.reply, bytes)]

    def data(self) -> Any:
        """The run's federated data (every client's split, as the clients see it)."""
        from fedkt.data.splits import run_data

        return run_data(self.cfg.data, self.cfg.clients.num_clients, self.cfg.seed)


_ROOT: Path | None = None


def scratch() -> Path:
    """A folder for this test session's cached runs (removed at exit)."""
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="fedkt-trust-"))
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


def recorded_run(method: str) -> RecordedRun:
    """The real run of ``method`` on its tiny config that the conformance test records (two
    rounds, every reply's bytes kept; once per test session).  A test that replays its
    replies with a 1-round config gets round 1's."""
    from tests.support.conformance import conformance  # it builds on this module

    return conformance(method).run


def flat_tensors(payload: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of a payload: ``field`` or ``field/key`` for tensor dicts."""
    out: dict[str, torch.Tensor] = {}
    for key, value in payload.items():
        if isinstance(value, torch.Tensor):
            out[key] = value
        elif isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in value.items() if isinstance(v, torch.Tensor)})
    return out
