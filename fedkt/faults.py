"""Fault injection for tests and drills: crashed clients, malformed replies, failing handlers.

:class:`FaultyTransport` wraps any transport (tests and ``benchmarks/faults.py``
wrap :class:`fedkt.runtime.local.LocalTransport`).  A *plan* says which fault, if
any, client ``cid`` shows in round ``rnd``:

* ``crash``: the client is not reached; the server gets a ``ConnectionResetError``;
* ``nan``: the client's real reply with its first float tensor set to NaN;
* ``shape``: ... with that tensor one element longer (and flattened);
* ``dtype``: ... with that tensor in another float dtype;
* ``garbage``: random bytes of the reply's length instead of the reply.

Plans are pure functions of ``(cid, rnd)`` (and a seed), so a round that is
re-run or resumed meets the same faults; round 0 (the evaluation before training)
is never faulted.

:func:`fail_handlers` (or the context manager :func:`failing_handlers`) works on the
client side instead: client ``cid``'s handlers raise :class:`InjectedFault` in round
``rnd``, so the server receives the client's error reply, as for any handler that fails.
It acts in the process that calls it (where the ``local`` runtime runs its clients); a
client in another process (a Flower SuperNode, a simulation worker) opts in through a
plugin, ``FEDKT_PLUGINS=module:function``, whose function calls it.  Nothing is injected
unless one of these is called.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fedkt.methods import get_method
from fedkt.methods.base import ClientContext, Handler
from fedkt.payload import Payload, dumps, loads
from fedkt.runtime.base import ENVELOPE, ERROR, Transport

CRASH = "crash"
MALFORMED = ("nan", "shape", "dtype", "garbage")
KINDS = (CRASH, *MALFORMED)

Plan = Callable[[int, int], str | None]


def request_round(data: bytes) -> int:
    """The round a serialised request belongs to (read from its JSON header only)."""
    (n,) = struct.unpack("<Q", data[4:12])
    return int(json.loads(data[12 : 12 + n])["meta"][ENVELOPE]["round"])


def transient_plan(p_crash: float, p_bad: float, seed: int, attempt: int = 0) -> Plan:
    """Each (client, round) crashes with ``p_crash``, else sends a malformed reply with
    ``p_bad`` (kind drawn uniformly from :data:`MALFORMED`); ``attempt`` re-draws."""
    def plan(cid: int, rnd: int) -> str | None:
        rng = random.Random(f"fault/{seed}/{attempt}/{cid}/{rnd}")
        u = rng.random()
        if u < p_crash:
            return CRASH
        if u < p_crash + p_bad:
            return rng.choice(MALFORMED)
        return None

    return plan


def persistent_plan(faulty: dict[int, str]) -> Plan:
    """Client ``cid`` shows fault ``faulty[cid]`` in every round."""
    return lambda cid, rnd: faulty.get(cid)


def corrupt(reply: bytes, kind: str, rng: random.Random) -> bytes:
    """A malformed version of a serialised reply (see the module docstring)."""
    if kind == "garbage":
        return rng.randbytes(len(reply))
    payload = loads(reply, source="fault injection")
    if ERROR in payload:
        return reply  # the handler failed anyway
    for key, value in payload.items():
        if key == ENVELOPE:
            continue
        tensors = value if isinstance(value, dict) else {None: value}
        for sub, t in tensors.items():
            if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
                continue
            if kind == "nan":
                t = t.clone()
                t.view(-1)[0] = float("nan")
            elif kind == "shape":
                t = torch.cat([t.reshape(-1), t.reshape(-1)[:1]])
            elif kind == "dtype":
                t = t.to(torch.float16 if t.dtype != torch.float16 else torch.float32)
            else:
                raise ValueError(f"unknown fault kind {kind!r}; kinds: {KINDS}")
            if sub is None:
                payload[key] = t
            else:
                value[sub] = t
            return dumps(payload)
    raise ValueError(f"fault {kind!r}: the reply has no float tensor to corrupt")


class FaultyTransport:
    """A transport that injects the faults ``plan`` names into another transport's traffic.

    ``injected`` maps ``(round, cid)`` to the fault injected there.
    """

    def __init__(self, inner: Transport, plan: Plan, seed: int = 0) -> None:
        self.inner = inner
        self.plan = plan
        self.seed = seed
        self.injected: dict[tuple[int, int], str] = {}

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        # Round 0 (evaluation before training, eval.round0) is never faulted: plans are
        # about the training rounds.
        kinds = {cid: self.plan(cid, rnd) if (rnd := request_round(data)) else None
                 for cid, data in requests.items()}
        reached = {cid: data for cid, data in requests.items() if kinds[cid] != CRASH}
        replies = self.inner.exchange(reached, timeout) if reached else {}
        out: dict[int, bytes | BaseException] = {}
        for cid, data in requests.items():
            kind = kinds[cid]
            if kind is None:
                if cid in replies:
                    out[cid] = replies[cid]
                continue
            rnd = request_round(data)
            self.injected[(rnd, cid)] = kind
            if kind == CRASH:
                out[cid] = ConnectionResetError(f"injected crash of client {cid}")
            elif cid in replies:
                got = replies[cid]
                out[cid] = got if isinstance(got, BaseException) else corrupt(
                    got, kind, random.Random(f"corrupt/{self.seed}/{cid}/{rnd}"))
        return out

    def close(self) -> None:
        self.inner.close()


# ------------------------------------------------------------------ failing handlers

HandlerFaults = Iterable[tuple[int, int]] | str


class InjectedFault(RuntimeError):
    """A client handler's failure injected by :func:`fail_handlers`."""


def parse_handler_faults(spec: HandlerFaults) -> frozenset[tuple[int, int]]:
    """``"CID:ROUND[,CID:ROUND...]"`` (or pairs) -> ``{(cid, round), ...}``."""
    if not isinstance(spec, str):
        return frozenset((int(cid), int(rnd)) for cid, rnd in spec)
    faults = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        cid, _, rnd = item.partition(":")
        try:
            faults.add((int(cid), int(rnd)))
        except ValueError:
            raise ValueError(f"handler fault {item!r}: expected CID:ROUND, e.g. 1:2") from None
    return frozenset(faults)


@dataclass(frozen=True)
class _Failing:
    """A client handler that raises for the ``(cid, round)`` pairs in ``faults``."""

    handler: Handler
    faults: frozenset[tuple[int, int]]

    def __call__(self, ctx: ClientContext, msg: Payload) -> Payload:
        if (ctx.cid, ctx.rnd) in self.faults:
            raise InjectedFault(f"injected fault: client {ctx.cid}, round {ctx.rnd}")
        return self.handler(ctx, msg)


def fail_handlers(method: str, faults: HandlerFaults) -> Callable[[], None]:
    """Make every client handler of ``method`` raise :class:`InjectedFault` for client
    ``cid`` in round ``rnd``, for each ``(cid, rnd)`` in ``faults`` (pairs, or the text
    ``"CID:ROUND[,CID:ROUND...]"``), in this process; returns a function that undoes it.

    Calling it again replaces the faults installed before (wrappers never nest), so a
    plugin that runs before every request may call it each time.
    """
    faults = parse_handler_faults(faults)
    handlers = get_method(method).handlers
    before = dict(handlers)
    for name, handler in before.items():
        inner = handler.handler if isinstance(handler, _Failing) else handler
        handlers[name] = _Failing(inner, faults)

    def undo() -> None:
        handlers.update(before)

    return undo


@contextmanager
def failing_handlers(method: str, faults: HandlerFaults) -> Iterator[None]:
    """:func:`fail_handlers` for the duration of a ``with`` block."""
    undo = fail_handlers(method, faults)
    try:
        yield
    finally:
        undo()
