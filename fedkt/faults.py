"""Fault injection at the transport: crashed clients and malformed replies.

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
is never faulted.  For ``FEDKT_INJECT_FAULT`` (a handler
that raises) see :func:`fedkt.runtime.base.handle_request`.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable

import torch

from fedkt.payload import dumps, loads
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
