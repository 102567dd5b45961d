"""Secure aggregation with Flower's SecAgg+ protocol, on every runtime.

When ``secure_aggregation.enabled`` is on, a method's summed upload (adapters,
student updates, prompts) never reaches the server in the clear: the server runs
Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow` (Bell et al., CCS 2020:
key agreement, Shamir shares of each client's secrets among its neighbours,
pairwise and self masks over a quantised vector) and the clients run Flower's
``secaggplus_mod`` around fedkt's handler.  The server learns only the weighted
mean ``sum_k w_k x_k / sum_k w_k``; clients that drop out after the key exchange
are recovered from their neighbours' shares as long as at least
``reconstruction_threshold`` shares survive.

The same Flower code runs on every runtime:

* ``flower-sim`` / ``flower``: over the real Flower ``Grid``; the ClientApp carries
  ``secaggplus_mod`` (:mod:`fedkt.runtime.flower_app`);
* ``local``: over :class:`LocalGrid`, which hands each Flower ``Message`` to the
  mod and the client handler in this process (one Flower ``Context`` per client,
  as a SuperNode keeps it).

So the same config gives the same protocol, the same messages and (with the
quantisation's stochastic rounding seeded by the client's handler seed) the same
numbers on every runtime.

fedkt's request travels inside the legacy ``FitIns`` (one bytes array); the
client's reply becomes a ``FitRes`` whose parameters are the summed field's
tensors (sorted by name, float64) and whose ``num_examples`` is the client's
weight; everything else of the reply (numbers, metrics) travels in clear in the
``FitRes`` metrics, as the method's non-secret part.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.supercore.task_identity import TaskIdentity

from fedkt.config import SecureAggregationConfig
from fedkt.federated.payload import Payload, PayloadError, dumps, loads
from fedkt.runtime.envelope import ENVELOPE, ERROR, ClientFailure

AGGREGATE = "aggregate"  # envelope key: which reply field is summed, and how
REST = "fedkt"  # FitRes metrics key carrying the rest of the reply (bytes)


class SecAggError(RuntimeError):
    """Secure aggregation could not finish (too few clients or shares survived)."""


# --------------------------------------------------------------------------- client side


def summed_field(reply: Payload, spec: dict[str, Any], source: str
                 ) -> tuple[dict[str, torch.Tensor], int]:
    """The reply's summed field, checked against the server's spec, and the client's weight."""
    name = spec["field"]
    shapes = {k: tuple(v) for k, v in spec["shapes"].items()}
    if isinstance(reply.get(name), torch.Tensor):  # a one-tensor field
        tensors = {name: reply.tensor(name, source=source)}
    else:
        tensors = reply.state(name, source=source)
    if set(tensors) != set(shapes):
        missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
        raise PayloadError(f"{source}: field {name!r}: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, t in tensors.items():
        if tuple(t.shape) != shapes[key]:
            raise PayloadError(f"{source}: field {name!r}[{key!r}] has shape {tuple(t.shape)}, "
                               f"expected {shapes[key]}")
        if t.is_complex() or not torch.isfinite(t.to(torch.float64)).all():
            raise PayloadError(f"{source}: field {name!r}[{key!r}] must be finite real numbers")
    weight = 1
    if spec.get("weighted", True):
        n = reply.number("num_examples", source=source, low=0)
        if n != int(n):
            raise PayloadError(f"{source}: field 'num_examples' must be an integer, got {n}")
        weight = int(n)
    return tensors, weight


def secure_fit(content: RecordDict, run: Callable[[bytes], bytes], source: str = "client"
               ) -> RecordDict:
    """The inner ClientApp of SecAgg+'s 'collect masked vectors' stage.

    Runs fedkt's request (``run``: bytes -> reply bytes) and returns a legacy
    ``FitRes`` whose parameters are the summed field, for ``secaggplus_mod`` to
    quantise and mask.  A failed handler contributes zeros with weight 0 and its
    error in the clear part.
    """

    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    request = fitins.parameters.tensors[0]
    spec = loads(request, source="server")[ENVELOPE][AGGREGATE]
    reply = loads(run(request), source=source)
    try:
        if ERROR in reply:
            raise ClientFailure(reply[ERROR])
        tensors, weight = summed_field(reply, spec, source)
        if weight > spec["max_weight"]:
            raise PayloadError(f"{source}: weight {weight} (num_examples) exceeds "
                               f"secure_aggregation.max_weight {spec['max_weight']:g}, which "
                               "would overflow SecAgg+'s quantisation; raise max_weight")
        del reply[spec["field"]]
    except (ClientFailure, PayloadError) as exc:
        # A failed handler (or an upload that fails its own check) takes part with weight
        # 0: it adds nothing to the mean, and the clear part tells the server why, which
        # excludes the client. (Raising would make it a dropout, which SecAgg+ survives
        # too, but a Flower simulation worker that raises can take other clients' messages
        # down with it.)
        text = reply[ERROR] if ERROR in reply else f"{type(exc).__name__}: {exc}"
        reply = Payload({ERROR: text})
        tensors = {k: torch.zeros(tuple(v)) for k, v in spec["shapes"].items()}
        weight = 0
    arrays = [tensors[k].detach().cpu().to(torch.float64).numpy() for k in sorted(tensors)]
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), weight,
                 {REST: dumps(reply)})
    return compat.fitres_to_recorddict(res, keep_input=False)


# --------------------------------------------------------------------------- in-process grid


def record_nbytes(content: RecordDict) -> int:
    """Approximate size of a message's content (arrays and bytes/str config values)."""
    total = 0
    for rec in content.array_records.values():
        total += sum(len(a.data) for a in rec.values())
    for rec in content.config_records.values():
        for v in rec.values():
            items = v if isinstance(v, list) else [v]
            total += sum(len(x) if isinstance(x, bytes | str) else 8 for x in items)
    return total


class LocalGrid:
    """Delivers Flower messages to in-process clients running ``secaggplus_mod``.

    ``run(cid, request_bytes) -> reply_bytes`` is the client's fedkt handler (the
    same :func:`fedkt.runtime.base.handle_request` the local transport calls).
    Node ids are ``cid + 1``; each client keeps one Flower ``Context`` for the run.
    """

    def __init__(self, run: Callable[[int, bytes], bytes]) -> None:
        self.run = run
        self.contexts: dict[int, Context] = {}

    @staticmethod
    def node(cid: int) -> int:
        return cid + 1

    @staticmethod
    @contextmanager
    def identity() -> Iterator[None]:
        """Flower stamps messages with the process's task identity; give one in-process."""
        saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
        if saved[1] is None:
            TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 0, 0
        try:
            yield
        finally:
            TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved

    def send_and_receive(self, messages: list[Message], timeout: float | None = None
                         ) -> list[Message]:
        out = []
        for sent in sorted(messages, key=lambda m: m.metadata.dst_node_id):
            msg = copy.deepcopy(sent)  # each client gets its own copy, as over the wire
            nid = msg.metadata.dst_node_id
            cid = nid - 1
            ctx = self.contexts.setdefault(cid, Context(run_id=0, node_id=nid, node_config={},
                                                        state=RecordDict(), run_config={}))

            def inner(m: Message, c: Context, cid: int = cid) -> Message:
                content = secure_fit(m.content, lambda data: self.run(cid, data),
                                     source=f"client {cid}")
                return Message(content, reply_to=m)

            try:
                out.append(secaggplus_mod(msg, ctx, inner))
            except Exception as exc:  # noqa: BLE001 - a dropped client, as Flower reports it
                out.append(Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"),
                                   reply_to=msg))
        return out


# --------------------------------------------------------------------------- server side


class _Proxy(ClientProxy):
    """The SecAgg+ workflow only needs a proxy's ``node_id``."""

    def __init__(self, node_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id

    def get_properties(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def get_parameters(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def fit(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def evaluate(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def reconnect(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


class _OneShot(Strategy):
    """Hands each node its fedkt request and keeps the aggregate SecAgg+ computes."""

    def __init__(self, fitins: dict[int, FitIns]) -> None:
        self.fitins = fitins
        self.results: list[tuple[ClientProxy, FitRes]] = []
        self.failures: list[Any] = []

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any
                      ) -> list[tuple[ClientProxy, FitIns]]:
        return [(_Proxy(nid), ins) for nid, ins in sorted(self.fitins.items())]

    def aggregate_fit(self, server_round: int, results: list, failures: list
                      ) -> tuple[None, dict]:
        self.results, self.failures = list(results), list(failures)
        return None, {}

    def configure_evaluate(self, *a: Any, **k: Any) -> list:
        return []

    def aggregate_evaluate(self, *a: Any, **k: Any) -> tuple[None, dict]:
        return None, {}

    def evaluate(self, *a: Any, **k: Any) -> None:
        return None


class _Recording:
    """Wraps a grid: counts bytes per node and keeps each node's last error."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.errors: dict[int, str] = {}

    def send_and_receive(self, messages: list[Message], timeout: float | None = None
                         ) -> list[Message]:
        messages = list(messages)
        for m in messages:
            nid = m.metadata.dst_node_id
            self.sent[nid] = self.sent.get(nid, 0) + record_nbytes(m.content)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        answered = set()
        for r in replies:
            nid = r.metadata.src_node_id
            answered.add(nid)
            if r.has_error():
                self.errors[nid] = (r.error.reason or f"Flower error {r.error.code}").strip()
            else:
                self.received[nid] = self.received.get(nid, 0) + record_nbytes(r.content)
        for m in messages:
            nid = m.metadata.dst_node_id
            if nid not in answered:
                self.errors.setdefault(nid, f"no reply within {timeout} s")
        return replies


@contextmanager
def _quiet_flower() -> Iterator[None]:
    """Flower logs every SecAgg+ stage at INFO/DEBUG; fedkt logs the outcome per round."""
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        flwr_log.setLevel(level)


@dataclass
class SecureResult:
    """What the server learns: the mean of the summed field and the rest of each reply."""

    mean: dict[str, torch.Tensor] | None
    replies: dict[int, bytes] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)


def secure_mean(grid: Any, node_of: dict[int, int], requests: dict[int, bytes],
                shapes: dict[str, tuple[int, ...]], settings: SecureAggregationConfig,
                rnd: int, timeout: float | None) -> SecureResult:
    """Run one SecAgg+ aggregation of ``requests`` (client id -> fedkt request bytes).

    ``grid`` is a Flower ``Grid`` (or :class:`LocalGrid`), ``node_of`` maps client
    ids to node ids and ``shapes`` names the summed tensors.  Raises
    :class:`SecAggError` if the protocol halts (fewer than the threshold survived).
    """
    cid_of = {node_of[c]: c for c in requests}
    fitins = {node_of[c]: FitIns(Parameters([data], "fedkt.bytes"), {})
              for c, data in requests.items()}
    strategy = _OneShot(fitins)
    base = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    ctx = LegacyContext(base, strategy=strategy)
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: rnd})
    ctx.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(
        num_shares=settings.num_shares, reconstruction_threshold=settings.reconstruction_threshold,
        max_weight=settings.max_weight, clipping_range=settings.clipping_range,
        quantization_range=settings.quantization_range, modulus_range=settings.modulus_range,
        timeout=timeout)
    recording = _Recording(grid)
    try:
        with getattr(grid, "identity", nullcontext)(), _quiet_flower(), \
                np.errstate(divide="ignore", invalid="ignore"):  # all weights 0: the caller checks
            workflow(recording, ctx)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - e.g. every weight zero, inconsistent vectors
        raise SecAggError(f"secure aggregation failed in round {rnd}: {type(exc).__name__}: "
                          f"{exc}") from exc
    result = SecureResult(mean=None)
    result.sent = {cid_of[n]: b for n, b in recording.sent.items() if n in cid_of}
    result.received = {cid_of[n]: b for n, b in recording.received.items() if n in cid_of}
    done = {}
    for proxy, res in strategy.results:
        done[cid_of[proxy.node_id]] = res
    result.failed = {cid_of[n]: reason for n, reason in recording.errors.items()
                     if n in cid_of and cid_of[n] not in done}
    for cid in requests:
        if cid not in done:
            result.failed.setdefault(cid, "dropped out of secure aggregation")
    if not done:
        reasons = "; ".join(f"client {c}: {r}" for c, r in sorted(result.failed.items()))
        raise SecAggError(f"secure aggregation halted in round {rnd} (fewer clients or key "
                          f"shares than secure_aggregation.reconstruction_threshold survived): "
                          f"{reasons}")
    arrays = parameters_to_ndarrays(next(iter(done.values())).parameters)
    keys = sorted(shapes)
    if len(arrays) != len(keys):
        raise SecAggError(f"round {rnd}: the aggregate has {len(arrays)} tensors, expected "
                          f"{len(keys)}")
    result.mean = {k: torch.from_numpy(np.asarray(a, dtype=np.float64).reshape(shapes[k]))
                   for k, a in zip(keys, arrays, strict=True)}
    for cid, res in done.items():
        rest = res.metrics.get(REST)
        if not isinstance(rest, bytes):
            result.failed[cid] = "its reply has no fedkt part"
            continue
        result.replies[cid] = rest
    return result

