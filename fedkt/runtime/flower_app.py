"""fedkt on Flower's Message API: a Grid transport, a ClientApp and a ServerApp.

The server procedure runs inside a Flower ``ServerApp`` and reaches its clients
through :class:`GridTransport`: one Message per client per handler call, whose
content is the request's bytes (the same bytes the ``local`` runtime passes
around).  The ``ClientApp`` hands those bytes to
:func:`fedkt.runtime.base.handle_request` and sends the reply's bytes back.

fedkt client ids are the SuperNodes' ``partition-id`` node config (the
simulation engine sets it; a deployed SuperNode gets it from ``--node-config``).
An optional ``state-dir`` node config puts the client's state on that folder.

Used by :mod:`fedkt.runtime.flower_sim` (in-process apps) and by :mod:`fedkt.apps`,
whose ``server_app`` and ``client_app`` are the deployed FAB's components (they sit above
the runner, which the ServerApp runs; no runtime module imports it).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedkt.infra.plugins import PLUGINS_ENV, import_plugins
from fedkt.runtime.base import ALLOW_REMOTE_CODE_KEY, handle_request, truthy
from fedkt.runtime.envelope import ERROR, TransportError
from fedkt.runtime.secagg import secure_fit

log = logging.getLogger("fedkt.runtime.flower")

REQUEST_TYPE = "query.fedkt"  # one fedkt request (handler call) for one client
HELLO_TYPE = "query.fedkt_hello"  # asks a node for its partition-id
RECORD = "fedkt"  # record (and array) name carrying the bytes
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
STATE_DIR = "state-dir"

# Keys of the Flower run config the ServerApp reads (see flower_app/pyproject.toml).
CFG_YAML = "fedkt-config"
CFG_PATH = "fedkt-config-path"
CFG_RESUME = "resume"
CFG_QUIET = "quiet"
CFG_PLUGINS = "fedkt-plugins"
CFG_CONNECT_TIMEOUT = "connect-timeout"

DEFAULT_CONNECT_TIMEOUT = 600.0


class FlowerTransportError(TransportError):
    """The Flower federation does not match the job (missing or duplicated client ids)."""


# --------------------------------------------------------------------------- helpers


def method_plugins(method_name: str) -> list[str]:
    """Modules a fresh process must import so ``method_name`` is registered there.

    Built-in methods need nothing; a method registered from elsewhere (a plugin
    or a test) is found through the module that registered it.
    """
    from fedkt.methods import plugin_module

    module = plugin_module(method_name)
    return [module] if module else []


def pack(data: bytes) -> RecordDict:
    """Wrap bytes as message content (an Array, so large payloads travel in chunks)."""
    array = Array(dtype="uint8", shape=(len(data),), stype="fedkt.bytes", data=bytes(data))
    return RecordDict({RECORD: ArrayRecord({RECORD: array})})


def unpack(content: RecordDict) -> bytes:
    """The bytes :func:`pack` wrapped."""
    return content.array_records[RECORD][RECORD].data


def _send_and_receive(grid: Grid, msgs: list[Message], timeout: float
                      ) -> list[tuple[int, Message | None]]:
    """Send messages; return ``(destination node, reply)`` for the replies that came back,
    and ``(node, None)`` for messages Flower did not accept."""
    sent = list(msgs)
    # Like Grid.send_and_receive, but polling fast at first (the deployed grid sleeps 3 s).
    ids = list(grid.push_messages(sent))
    out: list[tuple[int, Message | None]] = []
    if len(ids) != len(sent):  # the deployed grid returns [] if the push was too large
        ids = [None] * len(sent)
    out += [(m.metadata.dst_node_id, None) for m, i in zip(sent, ids, strict=True) if not i]
    pending = {i for i in ids if i}
    replies: list[Message] = []
    deadline = time.monotonic() + timeout
    interval = 0.05
    while pending:
        got = list(grid.pull_messages(pending))
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(interval * 1.5, 1.0)
    dst_of = {i: m.metadata.dst_node_id for m, i in zip(sent, ids, strict=True) if i}
    dst_nodes = set(dst_of.values())
    for reply in replies:
        node = dst_of.get(reply.metadata.reply_to_message_id)
        if node is None and reply.metadata.src_node_id in dst_nodes:
            node = reply.metadata.src_node_id
        if node is None:
            log.warning("ignoring a Flower reply to an unknown message (from node %d)",
                        reply.metadata.src_node_id)
            continue
        out.append((node, reply))
    return out


def _reply_error(reply: Message) -> str:
    return f"Flower error {reply.error.code}: {(reply.error.reason or '').strip()}"


# --------------------------------------------------------------------------- server side


class GridTransport:
    """:class:`fedkt.runtime.base.Transport` over a Flower ``Grid``.

    On construction it waits until the federation has a node for every client
    id ``0 .. num_clients-1`` (asking each node for its ``partition-id``), and
    fails with :class:`FlowerTransportError` if an id is duplicated or still
    missing after ``connect_timeout`` seconds.
    """

    def __init__(self, grid: Grid, num_clients: int, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 ttl: float | None = None, ids: Iterable[int] | None = None) -> None:
        self.grid = grid
        self.num_clients = num_clients
        # The client ids taking part (clients.participants); all by default.
        self.ids = sorted(ids) if ids is not None else list(range(num_clients))
        self.ttl = ttl
        self.node_of: dict[int, int] = self._discover(connect_timeout)
        self.cid_of: dict[int, int] = {node: cid for cid, node in self.node_of.items()}

    # -- discovery

    def _discover(self, connect_timeout: float) -> dict[int, int]:
        wanted = set(self.ids)
        deadline = time.monotonic() + connect_timeout
        partition: dict[int, int] = {}  # node id -> partition id
        asked: set[int] = set()
        errors: dict[int, list[str]] = {}  # node id -> errors of its hello replies
        announced = False
        while True:
            fresh = [n for n in self.grid.get_node_ids() if n not in asked]
            if fresh:
                asked.update(fresh)
                wait = max(1.0, min(60.0, deadline - time.monotonic()))
                msgs = [Message(RecordDict(), dst_node_id=n, message_type=HELLO_TYPE,
                                ttl=self._ttl(wait)) for n in fresh]
                for node, reply in _send_and_receive(self.grid, msgs, wait):
                    if reply is None:
                        raise FlowerTransportError(f"Flower did not accept a message to node {node}")
                    if reply.has_error():
                        errors.setdefault(node, []).append(_reply_error(reply))
                        log.warning("node %d did not say its partition-id: %s", node,
                                    errors[node][-1])
                        if len(errors[node]) >= 3:
                            raise FlowerTransportError(
                                f"SuperNode {node} fails to run the fedkt ClientApp (is fedkt "
                                f"installed there?): {errors[node][-1]}")
                        continue
                    info = reply.content.config_records.get(RECORD, ConfigRecord())
                    if info.get("error"):
                        raise FlowerTransportError(f"SuperNode {node}: {info['error']}")
                    partition[node] = int(info[PARTITION_ID])
                for node in fresh:
                    if node not in partition:
                        asked.discard(node)
            by_cid: dict[int, list[int]] = {}
            for node, pid in partition.items():
                by_cid.setdefault(pid, []).append(node)
            dup = {cid: nodes for cid, nodes in by_cid.items() if len(nodes) > 1 and cid in wanted}
            if dup:
                text = "; ".join(f"client id {c} on nodes {sorted(n)}" for c, n in sorted(dup.items()))
                raise FlowerTransportError(
                    f"client ids are duplicated in the Flower federation ({text}); give each "
                    "SuperNode its own --node-config partition-id")
            missing = sorted(wanted - set(by_cid))
            if not missing:
                extra = sorted(set(by_cid) - wanted)
                if extra:
                    log.warning("ignoring SuperNodes with partition-id %s (the job has %d clients)",
                                extra, self.num_clients)
                mapping = {cid: by_cid[cid][0] for cid in sorted(wanted)}
                log.info("Flower nodes for clients: %s", mapping)
                return mapping
            if time.monotonic() >= deadline:
                raise FlowerTransportError(
                    f"no SuperNode for client id(s) {missing} after {connect_timeout:.0f} s "
                    f"(found partition-ids {sorted(by_cid)}); start one SuperNode per client with "
                    f"--node-config \"partition-id=N num-partitions={self.num_clients}\"")
            if not announced:
                log.info("waiting for SuperNodes of client id(s) %s ...", missing)
                announced = True
            time.sleep(0.5)

    def _ttl(self, timeout: float) -> float:
        # A reply must be allowed to arrive until the server stops waiting for it.
        return self.ttl if self.ttl is not None else max(timeout + 60.0, 43200.0)

    # -- Transport

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        out: dict[int, bytes | BaseException] = {}
        msgs = []
        for cid, data in sorted(requests.items()):
            node = self.node_of.get(cid)
            if node is None:
                out[cid] = FlowerTransportError(f"no Flower node for client {cid}")
                continue
            msgs.append(Message(pack(data), dst_node_id=node, message_type=REQUEST_TYPE,
                                ttl=self._ttl(timeout)))
        if not msgs:
            return out
        for node, reply in _send_and_receive(self.grid, msgs, timeout):
            cid = self.cid_of[node]
            if reply is None:
                out[cid] = RuntimeError("Flower did not accept the request (too large for the "
                                        "SuperLink?)")
                continue
            if reply.has_error():
                out[cid] = RuntimeError(_reply_error(reply))
                continue
            try:
                out[cid] = unpack(reply.content)
            except (KeyError, AttributeError) as exc:
                out[cid] = RuntimeError(f"malformed Flower reply: {exc!r}")
        for cid in requests:
            out.setdefault(cid, TimeoutError(f"no reply from client {cid} within {timeout:.0f} s"))
        return out

    def secagg_grid(self, cids: list[int]) -> tuple[_FastGrid, dict[int, int]]:
        """The grid for Flower's SecAgg+ workflow (:mod:`fedkt.runtime.secagg`), node ids."""
        return _FastGrid(self.grid, self._ttl), {c: self.node_of[c] for c in cids
                                                 if c in self.node_of}

    def close(self) -> None:
        pass


class _FastGrid:
    """``send_and_receive`` as the SecAgg+ workflow calls it, with fedkt's fast polling."""

    def __init__(self, grid: Grid, ttl: Callable[[float], float]) -> None:
        self.grid = grid
        self.ttl = ttl

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> list[Message]:
        timeout = DEFAULT_CONNECT_TIMEOUT * 72 if timeout is None else timeout
        msgs = list(messages)
        for m in msgs:
            m.metadata.ttl = self.ttl(timeout)
        return [r for _, r in _send_and_receive(self.grid, msgs, timeout) if r is not None]


def make_server_app(job: Callable[[Grid, Context], Any]) -> ServerApp:
    """A ServerApp whose main runs ``job(grid, context)``."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        job(grid, context)

    return app


# --------------------------------------------------------------------------- client side


def make_client_app(state_root: Path | str | None = None,
                    plugins: Iterable[str] = (), allow_remote_code: bool | None = None
                    ) -> ClientApp:
    """A ClientApp running fedkt's client handlers.

    ``state_root``: where clients keep state when the node config has no
    ``state-dir`` (default: :data:`fedkt.runtime.base.FALLBACK_STATE_ROOT` in the
    process's working directory).  ``plugins``: modules to import first (methods
    registered outside fedkt).  ``allow_remote_code``: run model code a job's config
    asks for (``trust_remote_code``); None (a deployed SuperNode): only if its node config
    has ``allow-remote-code=true`` or ``$FEDKT_ALLOW_REMOTE_CODE`` is set, else refused.
    """
    app = ClientApp(mods=[secaggplus_mod])  # SecAgg+ acts on 'train' messages only
    # Plugins named now (e.g. in FEDKT_PLUGINS) travel with the app to simulation workers.
    plugins = (*plugins, *os.environ.get(PLUGINS_ENV, "").split(","))
    default_root = None if state_root is None else str(state_root)

    def _partition(context: Context) -> int:
        if PARTITION_ID not in context.node_config:
            raise FlowerTransportError(
                f"this SuperNode has no '{PARTITION_ID}' node config; start it with "
                f"--node-config \"{PARTITION_ID}=N {NUM_PARTITIONS}=M\"")
        return int(context.node_config[PARTITION_ID])

    def _client(context: Context) -> tuple[int, Path | None]:
        """This node's client id and state folder (after importing the run's plugins)."""
        import_plugins(plugins + tuple(str(context.run_config.get(CFG_PLUGINS, "")).split(",")))
        root = context.node_config.get(STATE_DIR) or default_root
        return _partition(context), Path(str(root)) if root else None

    def _allowed(context: Context) -> bool | None:
        """This node's own word on running a job's model code (never the job's)."""
        if allow_remote_code is not None:
            return allow_remote_code
        if ALLOW_REMOTE_CODE_KEY in context.node_config:
            return truthy(context.node_config[ALLOW_REMOTE_CODE_KEY])
        return None  # the environment decides (handle_request)

    @app.query("fedkt_hello")
    def _hello(msg: Message, context: Context) -> Message:
        try:
            info = ConfigRecord({PARTITION_ID: _partition(context)})
        except FlowerTransportError as exc:
            info = ConfigRecord({"error": str(exc)})
        return Message(RecordDict({RECORD: info}), reply_to=msg)

    @app.query("fedkt")
    def _request(msg: Message, context: Context) -> Message:
        try:
            cid, state_root = _client(context)
        except Exception as exc:  # noqa: BLE001 - reported to the server as this client's error
            from fedkt.federated.payload import dumps

            reply = dumps({ERROR: f"{type(exc).__name__}: {exc}"})
        else:
            reply = handle_request(unpack(msg.content), state_root, cid,
                                   allow_remote_code=_allowed(context))
        return Message(pack(reply), reply_to=msg)

    @app.train()
    def _secure_train(msg: Message, context: Context) -> Message:
        # SecAgg+'s 'collect masked vectors' stage: secaggplus_mod masks what this returns.
        cid, state_root = _client(context)
        allowed = _allowed(context)
        content = secure_fit(msg.content, lambda data: handle_request(
            data, state_root, cid, allow_remote_code=allowed),
                             source=f"client {cid}")
        return Message(content, reply_to=msg)

    return app
