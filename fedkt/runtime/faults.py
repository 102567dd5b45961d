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
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from fedkt.federated.payload import Payload, dumps, loads
from fedkt.methods import get_method
from fedkt.methods.base import ClientContext, Handler
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


# --------------------------------------------------------------------------- hostile replies

# What a hostile client may put in the runtime's fields of its reply (hostile_reply), and
# in the numbers and names the server uses from it: its predictions' scope names and ids,
# the aggregated upload, a method's reported loss, its error text.
TARGETS = ("metrics", "metric", "envelope", "seconds", "timings", "error", "num_examples",
           "predictions", "scope", "ids", "adapter", "method_number", "error_text")
_SCOPES = ("a/../b", "../../escaped", "x" * 300, "a\x00b", "..", ".", "a.b", "/abs", "tést",
           " ", "aux", "slm_2")  # the last two are file names: accepted
_METHOD_NUMBERS = (5.67e307, -333328.0, 1e300, -5.0, 1e10, "low", True, 7.5, 0.0, -1e-9)
_METRIC_NUMBERS = (("test/accuracy", 1e300), ("test/accuracy", 1.5), ("test/accuracy", -0.1),
                   ("test/rougeL", 400.0), ("train/loss", -5.0), ("test/macro_f1", 2.0),
                   ("train/steps", 1e16), ("test/accuracy", 0.5), ("test/rougeL", 55.0))
_ERROR_TEXTS = ("boom\x1b[2K\r\nWARNING fedkt: round 1: client 1 excluded",
                "\x1b]0;owned\x07", "line1\nline2\rline3", "\u202eevil", "\x00\x08\x7f",
                "plain error text")
_NAMES = ("round", "participant", "split", "excluded", "bytes_sent", "wall_time",
          "clients_replied", "eval_bytes", "loss", "accuracy", "step_seconds", "x" * 300, "",
          "a/b/c", "../up", "tést", "__class__", "train/", "/x")
_SPLITS = ("train", "test", "", "server", "x" * 40, "a b")


def _junk(rng: random.Random, depth: int = 0) -> object:
    """A JSON value a hostile client might send where a number (or mapping) belongs."""
    kind = rng.randrange(12 if depth < 2 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**63), 10**400, 7])
    if kind == 3:
        return rng.choice([float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 1.5,
                           -1e-300, 3.25])
    if kind in (4, 5):
        return rng.choice(["", "inf", "nan", "-inf", "1e999", "-5", " 3 ", "0x10", "1_000",
                           "12.5", "x" * rng.choice([1, 100, 100_000]), "\u0000", "∞"])
    if kind in (6, 7, 8):
        return rng.uniform(-10.0, 10.0)
    if kind == 9:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_name(rng): _junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def _name(rng: random.Random) -> str:
    name = rng.choice(_NAMES)
    return f"{rng.choice(_SPLITS)}/{name}" if rng.random() < 0.7 else name


@lru_cache(maxsize=1)
def _bomb() -> bytes:
    import gzip

    return gzip.compress(b"[" * 10**8, compresslevel=9, mtime=0)


def _blob(rng: random.Random) -> torch.Tensor:
    import gzip

    kind = rng.randrange(5)
    if kind == 0:  # a gzip bomb: ~100 kB that inflates to 100 MB
        data = _bomb()
    elif kind == 1:  # not gzip
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif kind == 2:  # gzip of something that is not a predictions table
        data = gzip.compress(json.dumps(_junk(rng)).encode(), mtime=0)
    elif kind == 3:  # a truncated stream
        data = gzip.compress(b'{"": {"columns": {"id": [1, 2]}}}', mtime=0)[:-9]
    else:  # a tensor of the wrong kind
        return rng.choice([torch.zeros(3, 4), torch.ones(5, dtype=torch.int64),
                           torch.zeros(2, 2, dtype=torch.uint8)])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _table_blob(tables: dict[str, object]) -> torch.Tensor:
    from fedkt.eval.predictions import pack

    return torch.frombuffer(bytearray(pack(tables)), dtype=torch.uint8).clone()  # type: ignore[arg-type]


def _scaled(adapter: dict[str, torch.Tensor], rng: random.Random) -> dict[str, torch.Tensor]:
    """A finite but huge (or, below the norm bound, merely large) version of ``adapter``."""
    kind = rng.choice(["x1e30", "-x1e30", "float_max", "one_max", "x1e5", "x100", "x3"])
    out = {}
    for i, (k, v) in enumerate(adapter.items()):
        if kind == "float_max":
            v = torch.full_like(v, torch.finfo(v.dtype).max)
        elif kind == "one_max" and i == 0:
            v = v.clone()
            v.view(-1)[0] = torch.finfo(v.dtype).max
        elif kind != "one_max":
            v = v * {"x1e30": 1e30, "-x1e30": -1e30, "x1e5": 1e5, "x100": 100.0, "x3": 3.0}[kind]
        out[k] = v
    return out


def hostile_reply(rng: random.Random, reply: Payload, table: object | None = None
                  ) -> tuple[str, bytes]:
    """``reply`` (a real one, parsed) with one or more of its runtime fields (or its
    predictions' scope names or ids, its ``adapter``, its ``train_loss``, its error text)
    replaced by what a hostile client could send, serialised as such a client would (JSON
    numbers may be NaN or Infinity, which :func:`fedkt.federated.payload.dumps` refuses to write);
    ``table``: a real :class:`~fedkt.eval.predictions.Predictions` table of test ids, for
    the scope and id attacks.  Returns ``(the fields attacked, the bytes)``."""
    import copy

    reply = Payload(reply)
    env = dict(reply.get(ENVELOPE) or {})
    hit = rng.sample(TARGETS, rng.choice([1, 1, 1, 2, 3]))
    for target in hit:
        if target == "metrics":
            reply["metrics"] = _junk(rng)
        elif target == "metric":
            metrics = reply.get("metrics")
            metrics = dict(metrics) if isinstance(metrics, dict) else {}
            metrics[_name(rng)] = _junk(rng) if rng.random() < 0.8 else rng.uniform(0, 1)
            reply["metrics"] = metrics
        elif target == "envelope":
            reply[ENVELOPE] = env = _junk(rng) if rng.random() < 0.6 else {**env,
                                                                         _name(rng): 1.0}
        elif target == "seconds" and isinstance(env, dict):
            env[rng.choice(["seconds", "compute", "cpu"])] = _junk(rng)
            reply[ENVELOPE] = env
        elif target == "timings" and isinstance(env, dict):
            env["timings"] = _junk(rng) if rng.random() < 0.5 else {_name(rng): _junk(rng)}
            reply[ENVELOPE] = env
        elif target == "error":
            reply[ERROR] = _junk(rng)
        elif target == "num_examples":
            reply["num_examples"] = _junk(rng)
        elif target == "predictions":
            reply["_predictions"] = _blob(rng)
        elif target == "scope" and table is not None:
            reply["_predictions"] = _table_blob({rng.choice(_SCOPES): table})
        elif target == "ids" and table is not None:
            forged = copy.deepcopy(table)
            ids = forged.columns["id"]  # type: ignore[attr-defined]
            how = rng.randrange(3)
            for i in range(len(ids)) if how == 0 else [rng.randrange(len(ids))]:
                ids[i] = f"forged-{i}" if how < 2 else "../" + ids[i]
            reply["_predictions"] = _table_blob({"": forged})
        elif target == "adapter" and isinstance(reply.get("adapter"), dict):
            reply["adapter"] = _scaled(reply["adapter"], rng)
            if rng.random() < 0.3:
                reply["num_examples"] = 10**7  # runtime.limits.num_examples' default
        elif target == "method_number":
            if rng.random() < 0.5:
                reply["train_loss"] = rng.choice(_METHOD_NUMBERS)
            else:
                name, value = rng.choice(_METRIC_NUMBERS)
                metrics = reply.get("metrics")
                reply["metrics"] = {**(metrics if isinstance(metrics, dict) else {}),
                                    name: value}
        elif target == "error_text":
            reply[ERROR] = rng.choice(_ERROR_TEXTS)
    tensors = {k: v for k, v in reply.items()
               if isinstance(v, torch.Tensor) or (isinstance(v, dict) and v and all(
                   isinstance(t, torch.Tensor) for t in v.values()))}
    clean = loads(dumps(tensors)) if tensors else {}
    data = dumps(tensors) if tensors else dumps({})
    (n,) = struct.unpack("<Q", data[4:12])
    header = json.loads(data[12 : 12 + n])
    header["meta"] = {k: v for k, v in reply.items() if k not in clean}
    raw = json.dumps(header, allow_nan=True).encode()
    return "+".join(hit), data[:4] + struct.pack("<Q", len(raw)) + raw + data[12 + n:]


@dataclass
class AttackReport:
    """What :func:`run_attacks` saw: attacks per outcome, and per attacked field."""

    tried: int = 0
    accepted: int = 0  # the reply was valid after all (e.g. a metric with a plain number)
    rejected: int = 0  # the client was excluded, its reason naming it
    refused: int = 0  # kept, but its predictions were not written, a warning naming it
    unnamed: int = 0  # excluded, but the reason does not name the client
    crashes: list[str] = field(default_factory=list)  # an exception escaped the server
    lost: list[str] = field(default_factory=list)  # a row key, another client's data, a NaN
    by_target: dict[str, int] = field(default_factory=dict)
    slowest: float = 0.0  # seconds, the longest one reply took to check


def run_attacks(cfg: object, good: bytes, n: int, seed: int = 0) -> AttackReport:
    """Send ``n`` :func:`hostile_reply` variants of ``good`` (a real FedAvg train reply's
    bytes) from client 0, with client 1 sending ``good`` itself, through the server's real
    reply handling and aggregation (:meth:`fedkt.runtime.base.RuntimeClients.aggregate` of
    the ``adapter``) and the run loop's writing of client predictions into a scratch run
    folder; ``cfg``: a run config with ``clients.min_replies: 1`` and 2 clients.  Counts
    what happened to each."""
    import logging
    import tempfile
    from pathlib import Path

    warnings: list[str] = []

    class Warnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    handler = Warnings(logging.WARNING)
    logger = logging.getLogger("fedkt")
    logger.addHandler(handler)
    try:
        with tempfile.TemporaryDirectory(prefix="fedkt-attacks-") as scratch:
            return _attack_loop(cfg, good, n, seed, warnings, Path(scratch))
    finally:
        logger.removeHandler(handler)


def _attack_loop(cfg: Any, good: bytes, n: int, seed: int, warnings: list[str],
                 scratch: Path) -> AttackReport:
    """:func:`run_attacks`' loop; ``warnings`` collects what the server logs meanwhile."""
    import math
    import shutil
    import time

    from fedkt.data.splits import run_data
    from fedkt.eval.predictions import (
        Predictions,
        prediction_files,
        read_predictions,
        write_client_predictions,
    )
    from fedkt.federated.aggregation import is_finite, state_norm
    from fedkt.runtime.base import RuntimeClients
    from fedkt.runtime.replies import SERVER_ROW_KEYS, printable

    rng = random.Random(f"attacks/{seed}")
    base = loads(good)
    report = AttackReport()
    data = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    test_ids = {str(r["id"]) for r in data.test}
    table = Predictions({"id": sorted(test_ids)[:8], "pred": [0] * min(8, len(test_ids))})
    like = base["adapter"]
    bound = cfg.runtime.limits.norm_ratio * state_norm(like)

    class Replies:
        data = b""

        def exchange(self, requests: dict[int, bytes], timeout: float
                     ) -> dict[int, bytes | BaseException]:
            return {0: self.data, 1: good}

        def close(self) -> None:
            pass

    transport = Replies()
    clients = RuntimeClients(cfg, transport)  # type: ignore[arg-type]
    expected: dict[str, float] | None = None
    run_dir = scratch / "run"
    for _ in range(n):
        what, transport.data = hostile_reply(rng, base, table)
        report.tried += 1
        for target in what.split("+"):
            report.by_target[target] = report.by_target.get(target, 0) + 1
        clients.start_round(1, evaluate=True)
        warnings.clear()
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        start = time.perf_counter()
        try:
            replies, mean = clients.aggregate("train", {0: Payload(), 1: Payload()},
                                              field="adapter", like=like)
            write_client_predictions(run_dir, 1, clients.traffic.predictions, test_ids)
        except Exception as exc:  # noqa: BLE001 - counted: the goal is none
            report.crashes.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        report.slowest = max(report.slowest, time.perf_counter() - start)
        traffic = clients.traffic
        if expected is None:
            expected = dict(traffic.metrics[1])
        if traffic.metrics[1] != expected or 1 not in replies:
            report.lost.append(f"{what}: client 1's metrics or reply changed")
        if not is_finite(mean) or state_norm(mean) > bound:
            report.lost.append(f"{what}: the mean adapter is poisoned (norm "
                               f"{state_norm(mean):.3g})")
        written = [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()]
        files = prediction_files(run_dir)
        if any(not w.startswith("predictions/round_0001/") for w in written) \
                or any(key[1] not in ("client_0", "client_1") for key in files):
            report.lost.append(f"{what}: a predictions file out of place: {written[:3]}")
        for key, path in files.items():
            if set(read_predictions(path).ids) - test_ids:
                report.lost.append(f"{what}: {key[1]}'s predictions kept ids that are no "
                                   "test ids")
        for text in [*warnings, *traffic.excluded.values()]:
            if printable(text) != text:
                report.lost.append(f"{what}: unescaped text logged: {text[:60]!r}")
        if 0 in traffic.excluded:
            reason = traffic.excluded[0]
            named = "client 0" in reason or reason.startswith("ClientFailure")
            report.rejected += named
            report.unnamed += not named
            if traffic.metrics.get(0):
                report.lost.append(f"{what}: an excluded reply's metrics were kept")
            continue
        if any("predictions" in w for w in warnings):  # kept, its predictions not written
            named = any("client 0" in w for w in warnings if "predictions" in w)
            report.refused += named
            report.unnamed += not named
        else:
            report.accepted += 1
        for key, value in traffic.metrics.get(0, {}).items():
            name = key.rpartition("/")[2]
            if name in SERVER_ROW_KEYS or not isinstance(value, float) \
                    or not math.isfinite(value):
                report.lost.append(f"{what}: accepted metric {key!r} = {value!r}")
        for value in (traffic.seconds[0], *traffic.compute[0]):
            if not (isinstance(value, float) and math.isfinite(value) and value >= 0):
                report.lost.append(f"{what}: accepted time {value!r}")
    return report
