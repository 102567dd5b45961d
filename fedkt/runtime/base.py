"""The runtime seam: envelopes, client dispatch, accounting and failures.

A transport only moves bytes: ``exchange({cid: request_bytes}) -> {cid: reply_bytes
| error}``.  Everything else is the same for every transport and lives here:

* :class:`RuntimeClients` (server side) wraps payloads in an envelope (handler
  name, round, step, the run config), serialises them, counts the bytes each way,
  and turns client failures into excluded clients or a clean :class:`RoundError`;
* :func:`handle_request` (client side) parses the envelope, finds the method's
  handler, seeds torch for this (client, round, step) and runs it.
"""

from __future__ import annotations

import logging
import os
import random
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import yaml

from fedkt.config import RunConfig, TrackingConfig, parse_config, runtime_config_class
from fedkt.eval import predictions
from fedkt.eval.predictions import Predictions
from fedkt.federated.aggregation import coordinate_median, far_beyond, fedavg, is_finite, state_norm
from fedkt.federated.payload import Payload, PayloadError, dumps, loads
from fedkt.infra import progress
from fedkt.infra.precision import set_threads
from fedkt.infra.timing import SAVED, Clock, clocks, eval_clock, now, phase, phase_seconds
from fedkt.methods import get_method
from fedkt.methods.base import ClientContext, RoundError, derive_seed, seed_everything
from fedkt.runtime.envelope import (  # noqa: F401 - re-exported: the runtime's names
    ENVELOPE,
    ERROR,
    PREDICTIONS,
    ClientFailure,
    TransportError,
)
from fedkt.runtime.replies import check_reply, error_text

log = logging.getLogger("fedkt.runtime")


@runtime_checkable
class Transport(Protocol):
    """Moves serialised requests to clients and brings their replies back."""

    def exchange(self, requests: dict[int, bytes], timeout: float) -> dict[int, bytes | BaseException]:
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class SecAggTransport(Transport, Protocol):
    """A transport that can also run Flower's SecAgg+ (``secure_aggregation.enabled``)."""

    def secagg_grid(self, cids: list[int]) -> tuple[Any, dict[int, int]]:
        """A Flower grid reaching these clients, and each client's node id on it."""
        ...


@dataclass
class Traffic:
    """Bytes and seconds per client within one round."""

    sent: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # server -> client
    received: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # client -> server
    seconds: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    # The handlers' time without their evaluation (the method's compute on the client).
    compute: dict[int, Clock] = field(default_factory=lambda: defaultdict(Clock))
    # Server side: wall seconds spent waiting for clients, and the seconds per phase
    # (fedkt.infra.timing; "eval" among them) that ran in this process meanwhile (clients that
    # share it), for the server's compute and its own phases.
    wait: Clock = Clock()
    wait_phases: dict[str, Clock] = field(default_factory=dict)
    metrics: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    excluded: dict[int, str] = field(default_factory=dict)
    # Per-example predictions each client sent back (scope -> table), and their bytes,
    # which are counted here and not in ``received``: they are evaluation, not the method.
    predictions: dict[int, dict[str, Predictions]] = field(
        default_factory=lambda: defaultdict(dict))
    eval_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))


def client_view(cfg: RunConfig) -> RunConfig:
    """The config clients receive: without the server's output folder, transport settings
    and experiment trackers, so requests are byte-identical whichever runtime, folder and
    trackers a run uses; ``eval.reuse`` travels as the envelope's fixed-width ``reuse``
    flag instead, so requests are the same size with it on or off."""
    # The class a loaded config's runtime has (the built-in runtimes' sections, defaults).
    runtime = runtime_config_class()(torch_threads=cfg.runtime.torch_threads,
                                     device=cfg.runtime.device,
                                     client_devices=cfg.runtime.client_devices)
    return cfg.model_copy(update={"output_dir": ".", "runtime": runtime,
                                  "tracking": TrackingConfig(),
                                  "eval": cfg.eval.model_copy(update={"reuse": True})})


def sample_clients(cfg: RunConfig, rnd: int) -> list[int]:
    """The clients of round ``rnd``: ``max(1, round(fraction * K))`` of the K participants,
    uniformly without replacement (FedAvg's C), reproducible from ``seed`` and ``rnd``."""
    ids = cfg.client_ids()
    frac = cfg.clients.fraction
    if frac >= 1:
        return ids
    k = max(1, round(frac * len(ids)))
    return sorted(random.Random(derive_seed(cfg.seed, "sample", rnd)).sample(ids, k))


def envelope_config(cfg: RunConfig) -> str:
    """The client view as compact YAML: only the keys that differ from their defaults
    (and the method's name), so every request stays small as the schema grows."""
    data = client_view(cfg).model_dump(mode="json", exclude_defaults=True)
    data["method"] = {"name": cfg.method.name, **data.get("method", {})}
    return yaml.safe_dump(data, sort_keys=False)


class RuntimeClients:
    """Implements :class:`fedkt.methods.base.Clients` on top of a transport."""

    def __init__(self, cfg: RunConfig, transport: Transport) -> None:
        self.cfg = cfg
        self.transport = transport
        self.ids = cfg.client_ids()
        self._config_yaml = envelope_config(cfg)
        self.rnd = 0
        self.step = 0
        self.evaluating = False
        self.traffic = Traffic()
        self.asked = 0

    def start_round(self, rnd: int, evaluate: bool = False) -> None:
        """Begin round ``rnd``; ``evaluate``: clients score their models in this round.

        ``ids`` becomes the round's clients: all participants, or with
        ``clients.fraction < 1`` a sample of them drawn from (seed, round).
        """
        self.rnd, self.step, self.evaluating, self.traffic = rnd, 0, evaluate, Traffic()
        self.ids = sample_clients(self.cfg, rnd)

    def _requests(self, handler: str, messages: dict[int, Payload], evaluate: bool,
                  **extra: object) -> dict[int, bytes]:
        requests: dict[int, bytes] = {}
        for cid, payload in messages.items():
            if cid in self.traffic.excluded:
                continue
            envelope = {"handler": handler, "round": self.rnd, "step": self.step,
                        "cid": cid, "evaluate": evaluate, "config": self._config_yaml,
                        "reuse": int(self.cfg.eval.reuse), **extra}
            with phase("comm"):
                requests[cid] = dumps({**payload, ENVELOPE: envelope})
        self.step += 1
        self.asked = len(requests)  # clients asked in the latest call
        return requests

    def _exclude(self, cid: int, handler: str, exc: BaseException | str) -> None:
        """Exclude ``cid`` from the round with its reason (escaped, bounded); nothing its
        replies reported this round (metrics, predictions) is kept."""
        reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.traffic.metrics.pop(cid, None)
        self.traffic.predictions.pop(cid, None)
        self.traffic.excluded[cid] = error_text(reason)
        log.warning("round %d: client %d excluded from '%s': %s", self.rnd, cid, handler,
                    self.traffic.excluded[cid])

    def _accept(self, cid: int, got: bytes | BaseException, handler: str) -> Payload | None:
        """Parse and check one client's reply (:func:`fedkt.runtime.replies.check_reply`)
        before using any of it; on failure exclude the client and return None."""
        limits = self.cfg.runtime.limits
        try:
            if isinstance(got, BaseException):
                raise got
            if len(got) > limits.reply_bytes:
                raise PayloadError(f"client {cid}: reply of {len(got)} bytes is larger than "
                                   f"runtime.limits.reply_bytes = {limits.reply_bytes}")
            with phase("comm"):
                reply = loads(got, source=f"client {cid}")
            if ERROR in reply:
                raise ClientFailure(error_text(reply[ERROR]))
            checked = check_reply(reply, cid, limits)
        except (ClientFailure, PayloadError, TimeoutError, OSError, RuntimeError,
                ValueError) as exc:
            self._exclude(cid, handler, exc)
            return None
        self.traffic.seconds[cid] += checked.seconds
        self.traffic.compute[cid] += Clock(checked.compute, checked.cpu)
        self._take_predictions(cid, checked.predictions)
        self.traffic.metrics[cid].update(checked.metrics)
        return checked.payload

    def _take_predictions(self, cid: int, blob: Any) -> None:
        """Keep a reply's per-example predictions; a malformed table is logged, never fatal."""
        if blob is None:
            return
        if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8 or blob.dim() != 1:
            log.warning("client %d: ignoring malformed predictions", cid)
            return
        self.traffic.received[cid] -= blob.numel()
        self.traffic.eval_bytes[cid] += blob.numel()
        try:
            self.traffic.predictions[cid].update(predictions.unpack(
                blob.numpy().tobytes(), source=f"client {cid}",
                max_bytes=self.cfg.runtime.limits.predictions_bytes))
        except ValueError as exc:
            log.warning("ignoring client %d's predictions: %s", cid, exc)

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        """Count the block as time the server waits for its clients."""
        start, phases = now(), clocks()
        try:
            yield
        finally:
            self.traffic.wait += now() - start
            for name, spent in clocks().items():
                self.traffic.wait_phases[name] = (self.traffic.wait_phases.get(name, Clock())
                                                  + (spent - phases.get(name, Clock())))

    def _excluded_text(self) -> str:
        return "; ".join(f"client {c}: {r}" for c, r in self.traffic.excluded.items())

    def _check_quorum(self, handler: str, asked: int, replied: int) -> None:
        need = self.cfg.clients.min_replies or asked
        if replied < min(need, asked):
            raise RoundError(
                f"round {self.rnd}, handler '{handler}': {replied} of {asked} clients "
                f"replied, {need} needed (clients.min_replies). {self._excluded_text()}"
            )

    def call(self, handler: str, messages: dict[int, Payload], *, evaluate: bool | None = None
             ) -> dict[int, Payload]:
        evaluate = self.evaluating if evaluate is None else evaluate
        requests = self._requests(handler, messages, evaluate)
        for cid, data in requests.items():
            self.traffic.sent[cid] += len(data)
        with self._waiting():
            raw = self.transport.exchange(requests, self.cfg.runtime.timeout)
        replies: dict[int, Payload] = {}
        for cid in requests:
            got = raw.get(cid, TimeoutError(f"no reply within {self.cfg.runtime.timeout:.0f} s"))
            if not isinstance(got, BaseException):
                self.traffic.received[cid] += len(got)
            reply = self._accept(cid, got, handler)
            if reply is not None:
                replies[cid] = reply
        self._check_quorum(handler, len(requests), len(replies))
        return replies

    def validate(self, replies: dict[int, Payload], check: Callable[[int, Payload], Any],
                 handler: str = "") -> dict[int, Any]:
        """See :meth:`fedkt.methods.base.Clients.validate`."""
        out = {}
        for cid, reply in replies.items():
            try:
                out[cid] = check(cid, reply)
            except (PayloadError, ValueError) as exc:
                self._exclude(cid, handler or "reply check", exc)
        self._check_quorum(handler or "reply check", self.asked, len(out))
        return out

    def aggregate(self, handler: str, messages: dict[int, Payload], *, field: str,
                  like: dict[str, torch.Tensor] | torch.Tensor, weighted: bool = True,
                  decode: Callable[[int, Payload], dict[str, torch.Tensor]] | None = None,
                  evaluate: bool | None = None) -> tuple[dict[int, Payload], Any]:
        """See :meth:`fedkt.methods.base.Clients.aggregate`."""
        if isinstance(like, torch.Tensor):  # a one-tensor field
            ref = like

            def one(cid: int, reply: Payload) -> dict[str, torch.Tensor]:
                return {field: reply.tensor(field, source=f"client {cid}", shape=ref.shape,
                                            dtype=ref.dtype)}

            replies, mean = self.aggregate(handler, messages, field=field, like={field: ref},
                                           weighted=weighted, decode=decode or one,
                                           evaluate=evaluate)
            return replies, mean[field]
        if self.cfg.secure_aggregation.enabled:
            return self._secure_aggregate(handler, messages, field, like, weighted, evaluate)
        replies = self.call(handler, messages, evaluate=evaluate)
        states, weights = [], []
        for cid, reply in list(replies.items()):
            source = f"client {cid}"
            try:
                state = decode(cid, reply) if decode else reply.state(field, like=like,
                                                                     source=source)
                weight = reply.number("num_examples", source=source, low=0) if weighted else 1.0
            except (PayloadError, ValueError) as exc:
                self._exclude(cid, handler, exc)
                del replies[cid]
                continue
            states.append(state)
            weights.append(weight)
        self._check_quorum(handler, self.asked, len(replies))
        if not states:
            raise RoundError(f"round {self.rnd}, handler '{handler}': no client replied")
        return replies, self._bounded_mean(handler, field, replies, states, weights)

    def _bounded_mean(self, handler: str, field: str, replies: dict[int, Payload],
                      states: list[dict[str, torch.Tensor]], weights: list[float]
                      ) -> dict[str, torch.Tensor]:
        """FedAvg (or with ``runtime.aggregation: median`` the coordinate-wise median) of
        ``states`` (in the order of ``replies``), less the clients whose upload
        is far beyond the round's others (``runtime.limits.norm_ratio``) or, if the mean is
        still not finite, the largest uploads until it is: each is excluded, named, so one
        finite but huge upload never poisons the model, a checkpoint or a row."""
        cids = list(replies)
        norms = [state_norm(s) for s in states]
        ratio = self.cfg.runtime.limits.norm_ratio
        beyond, median = far_beyond(norms, ratio)
        drop = {cids[i]: f"client {cids[i]}: field {field!r}: norm {norms[i]:.3g} is more "
                         f"than {ratio:g} times the round's median {median:.3g} "
                         "(runtime.limits.norm_ratio)" for i in beyond}
        while True:
            for cid, reason in drop.items():
                self._exclude(cid, handler, PayloadError(reason))
                del replies[cid]
            self._check_quorum(handler, self.asked, len(replies))
            keep = [i for i, c in enumerate(cids) if c in replies]
            if not keep:
                raise RoundError(f"round {self.rnd}, handler '{handler}': no client replied")
            kept = [weights[i] for i in keep]
            if self.cfg.runtime.aggregation == "median":  # robust, unweighted
                mean = coordinate_median([states[i] for i in keep])
            else:
                mean = fedavg([states[i] for i in keep], kept if sum(kept) > 0 else None)
            if is_finite(mean):
                return mean
            worst = max(keep, key=lambda i: norms[i])
            drop = {cids[worst]: f"client {cids[worst]}: field {field!r}: the mean is not "
                                 f"finite with its upload (norm {norms[worst]:.3g})"}

    def _secure_aggregate(self, handler: str, messages: dict[int, Payload], field: str,
                          like: dict[str, torch.Tensor], weighted: bool, evaluate: bool | None
                          ) -> tuple[dict[int, Payload], dict[str, torch.Tensor]]:
        from fedkt.runtime.secagg import AGGREGATE, SecAggError, secure_mean

        evaluate = self.evaluating if evaluate is None else evaluate
        shapes = {k: tuple(v.shape) for k, v in like.items()}
        spec = {"field": field, "weighted": weighted,
                "max_weight": self.cfg.secure_aggregation.max_weight,
                "shapes": {k: list(s) for k, s in shapes.items()}}
        if not isinstance(self.transport, SecAggTransport):
            raise RoundError(f"secure_aggregation.enabled: the transport "
                             f"{type(self.transport).__name__} cannot run SecAgg+")
        requests = self._requests(handler, messages, evaluate, **{AGGREGATE: spec})
        grid, node_of = self.transport.secagg_grid(sorted(requests))
        missing = [c for c in requests if c not in node_of]
        for cid in missing:
            self._exclude(cid, handler, "no node for this client")
            del requests[cid]
        try:
            with self._waiting():
                result = secure_mean(grid, node_of, requests, shapes,
                                     self.cfg.secure_aggregation, self.rnd,
                                     self.cfg.runtime.timeout)
        except SecAggError as exc:
            raise RoundError(str(exc)) from exc
        for cid in requests:
            self.traffic.sent[cid] += result.sent.get(cid, 0)
            self.traffic.received[cid] += result.received.get(cid, 0)
        for cid, reason in result.failed.items():
            self._exclude(cid, handler, reason)
        replies: dict[int, Payload] = {}
        for cid, data in result.replies.items():
            reply = self._accept(cid, data, handler)
            if reply is not None:
                replies[cid] = reply
        self._check_quorum(handler, self.asked, len(replies))
        assert result.mean is not None
        if not all(torch.isfinite(v).all() for v in result.mean.values()):
            raise RoundError(f"round {self.rnd}, handler '{handler}': every client that took "
                             f"part had weight 0 (no examples, or failed). "
                             f"{self._excluded_text()}")
        mean = {k: (result.mean[k] if v.is_floating_point() else result.mean[k].round()).to(v.dtype)
                for k, v in like.items()}
        return replies, mean


# --------------------------------------------------------------------------- client side


@lru_cache(maxsize=8)
def _config_from_yaml(text: str) -> RunConfig:
    from fedkt.config.load import read_yaml

    # check_installed=False: tracking is the server's; a client needs none of its extras.
    return parse_config(read_yaml(text, "<received config>"), "<received config>",
                        check_installed=False)


def default_state_root(cfg: RunConfig) -> Path:
    """Where clients that share the server's machine keep their state."""
    return cfg.run_dir / "clients"


# A client that is told no state folder keeps its state here (relative to its cwd).
FALLBACK_STATE_ROOT = Path("fedkt-client-state")


def _fixed(seconds: float) -> str:
    """Seconds as fixed-width text: a reply's size must not depend on how long work took."""
    return f"{seconds:015.6f}"


def _phase_timings(before: dict[str, Clock]) -> dict[str, str]:
    """The handler's seconds per phase (``train/<phase>_seconds``: its row of the round), at
    a fixed width.  ``<phase>_saved_seconds`` (what reused results spared, :mod:`fedkt.eval.reuse`)
    is there whenever its phase is, 0 if nothing was reused: a reply's size must not say
    whether a result was reused."""
    spent = phase_seconds(before, clocks())
    for name in SAVED:
        if f"{name.removesuffix('_saved')}_seconds" in spent:
            spent.setdefault(f"{name}_seconds", 0.0)
    return {f"train/{k}": _fixed(v) for k, v in spent.items()}


def _timings(reply: Payload) -> dict[str, str]:
    """A handler's ``*_seconds`` metrics, moved into the envelope at a fixed width: a
    reply's size must not depend on how long the work took."""
    metrics = reply.get("metrics")
    if not isinstance(metrics, dict):
        return {}
    timed = [k for k, v in metrics.items() if k.endswith("_seconds")
             and isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: _fixed(float(metrics.pop(k))) for k in timed}


# A client (SuperNode) that runs model code a job's config asks for (``trust_remote_code``)
# says so itself: this variable set to 1/true, or the node config key below.
ALLOW_REMOTE_CODE_ENV = "FEDKT_ALLOW_REMOTE_CODE"
ALLOW_REMOTE_CODE_KEY = "allow-remote-code"


def truthy(value: object) -> bool:
    """A yes from an environment variable or a node config value."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def remote_code_keys(cfg: RunConfig) -> list[str]:
    """The config keys of every model that sets ``trust_remote_code: true``."""
    from pydantic import BaseModel

    found: list[str] = []

    def walk(value: object, key: str) -> None:
        if isinstance(value, BaseModel):
            if getattr(value, "trust_remote_code", False) is True:
                found.append(f"{key}.trust_remote_code")
            for name in type(value).model_fields:
                walk(getattr(value, name), f"{key}.{name}" if key else name)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(item, f"{key}[{i}]")
        elif isinstance(value, dict):
            for k, item in value.items():
                walk(item, f"{key}.{k}")

    walk(cfg, "")
    return found


class ClientTimeout(TimeoutError):
    """A client handler ran past its ``runtime.timeout`` (the local runtime, in-process)."""


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`ClientTimeout` in this thread once ``seconds`` have passed (SIGALRM:
    at the next Python line the handler runs, or when a sleep or wait is interrupted; a
    call in C that never returns is not interrupted).  Only in the main thread of a
    process that has ``setitimer``; elsewhere, or with ``seconds`` None, nothing."""
    import signal
    import threading

    if (not seconds or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    active = [True]

    def alarm(signum: int, frame: object) -> None:
        if active[0]:
            active[0] = False
            raise ClientTimeout(f"no reply within runtime.timeout ({seconds:g} s); the "
                                "handler was interrupted")

    before = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        active[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def handle_request(data: bytes, state_root: Path | None = None, cid: int | None = None, *,
                   allow_remote_code: bool | None = None, threads: int | None = None,
                   timeout: float | None = None,
                   fatal: Callable[[BaseException], bool] | None = None) -> bytes:
    """Run the handler a request names and return the serialised reply.

    Any exception in the handler becomes an error reply, so the server can name
    the client and the cause.  ``state_root`` is where this machine keeps client
    state (``client_<cid>/`` below it); ``cid`` (from the transport) must match
    the envelope's when given.  ``allow_remote_code``: whether this client runs model
    code when the job's config sets ``trust_remote_code`` (None: only if
    ``$FEDKT_ALLOW_REMOTE_CODE`` says so); refused, the request fails with the keys named.
    ``threads``: torch threads the handler computes with when ``runtime.torch_threads`` is
    not set (None: :func:`~fedkt.infra.precision.default_threads`).  ``timeout``: seconds
    after which the handler is interrupted (:func:`_deadline`; an error reply).  ``fatal``:
    an exception it holds true for is raised, not replied (the process is unusable after
    it, e.g. out of memory: the local runtime replaces its worker).
    """
    start, phases = now(), clocks()
    try:
        with phase("comm"):
            msg = loads(data, source="server")
        env = msg.pop(ENVELOPE)
        if cid is not None and env["cid"] != cid:
            raise PayloadError(f"request for client {env['cid']} delivered to client {cid}")
        cfg = _config_from_yaml(env["config"])
        cfg.eval.reuse = bool(env.get("reuse", 1))  # eval.reuse (client_view)
        if allow_remote_code is None:
            allow_remote_code = truthy(os.environ.get(ALLOW_REMOTE_CODE_ENV, ""))
        risky = [] if allow_remote_code else remote_code_keys(cfg)
        if risky:
            raise PermissionError(
                f"the job's config sets {', '.join(risky)}: this client does not run model "
                f"code a server asks for (allow it on the client: {ALLOW_REMOTE_CODE_ENV}=1, "
                f"or a SuperNode's --node-config \"{ALLOW_REMOTE_CODE_KEY}=true\")")
        method = get_method(cfg.method.name)
        if env["handler"] not in method.handlers:
            raise PayloadError(f"method {method.name!r} has no client handler {env['handler']!r}")
        ctx_cid = int(env["cid"])
        ctx = ClientContext(cfg=cfg, cid=ctx_cid, rnd=int(env["round"]),
                            step=int(env["step"]),
                            state_dir=Path(state_root or FALLBACK_STATE_ROOT) / f"client_{ctx_cid}",
                            evaluate=bool(env["evaluate"]))
        set_threads(cfg.runtime.torch_threads or threads)
        seed_everything(ctx.seed("handler"))
        with (_deadline(timeout), predictions.capture() as tables,
              progress.participant(ctx.name)):
            reply = method.handlers[env["handler"]](ctx, msg)
        if tables and ctx.evaluate and cfg.eval.predictions:
            blob = bytearray(predictions.pack(tables))
            reply[PREDICTIONS] = torch.frombuffer(blob, dtype=torch.uint8).clone()
        # Fixed-width text: reply sizes must not depend on how long the work took.
        took = now() - start
        compute = took - (eval_clock() - phases.get("eval", Clock()))
        timings = {**_timings(reply), **_phase_timings(phases)}
        reply[ENVELOPE] = {"seconds": _fixed(took.wall), "compute": _fixed(compute.wall),
                           "cpu": _fixed(compute.cpu), **({"timings": timings} if timings else {})}
        return dumps(reply)
    except Exception as exc:  # noqa: BLE001 - reported to the server, which decides
        if fatal is not None and fatal(exc):
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})"
        log.error("client handler failed: %s", text)
        return dumps({ERROR: text})
