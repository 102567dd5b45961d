"""What a method is: a server procedure plus client handlers that exchange payloads.

A method module defines

* a config class (subclass of :class:`fedkt.config.MethodConfig`) with the
  paper's hyper-parameters as defaults,
* a :class:`Server` subclass whose :meth:`Server.round` reads like the paper's
  algorithm box and talks to clients only through :class:`Clients`,
* client handlers: plain functions ``handler(ctx: ClientContext, msg: Payload)
  -> Payload`` that run on the client, wherever the runtime puts it,

and gathers them in a :class:`Method` that the method catalog names
(:mod:`fedkt.config.method_catalog`).  Methods never import
Flower: the runtime moves the payloads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import torch
from safetensors.torch import load_file, save_file

from fedkt.config import MethodConfig, RunConfig
from fedkt.federated.payload import Payload, PayloadError
from fedkt.infra.seeds import derive_seed as derive_seed  # re-exported
from fedkt.infra.seeds import seed_everything as seed_everything  # re-exported
from fedkt.methods.errors import RoundError as RoundError  # re-exported: public name
from fedkt.methods.holdings import Holdings, Version, version_field
from fedkt.tracking.folder import atomic_write

log = logging.getLogger("fedkt.methods")

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData
    from fedkt.train.lm import LM


def clients_per_round(cfg: RunConfig) -> int:
    """How many clients each round asks: ``max(1, round(fraction * K))`` of the K
    participants (all of them with ``clients.fraction: 1``)."""
    ids = cfg.client_ids()
    return len(ids) if cfg.clients.fraction >= 1 else max(1, round(cfg.clients.fraction
                                                                     * len(ids)))


def privacy_spent(cfg: RunConfig, rnd: int) -> dict[str, float]:
    """The privacy budget each client has spent after round ``rnd`` (``dp_epsilon``, and
    with distributed noise ``dp_epsilon_upload``: :func:`fedkt.federated.privacy.budget`),
    from the settings its :meth:`ClientContext.privatize` noise comes from; empty with
    ``differential_privacy`` off."""
    dp = cfg.differential_privacy
    if not dp.enabled:
        return {}
    from fedkt.federated.privacy import budget

    return budget(dp, rnd, clients_per_round(cfg), cfg.clients.min_replies)


# --------------------------------------------------------------------------- client side


_STATE_RE = re.compile(r"^(?P<name>.+)\.r(?P<rnd>\d{5})s(?P<step>\d{3})\.safetensors$")
_VERSION = "__version__"  # the version of a kept object (its text as bytes)


@dataclass
class ClientContext:
    """Everything a client handler may use: its id, config, data and its own disk.

    State written with :meth:`save_state` is tagged with (round, step) and read
    back as the latest version *before* the current call, so a round that is
    re-run after a crash never sees what the failed attempt wrote.
    """

    cfg: RunConfig
    cid: int
    rnd: int
    step: int
    state_dir: Path
    evaluate: bool = False

    @property
    def name(self) -> str:
        return f"client_{self.cid}"

    @property
    def method(self) -> MethodConfig:
        return self.cfg.method

    def seed(self, *tags: object) -> int:
        return derive_seed(self.cfg.seed, "client", self.cid, self.rnd, self.step, *tags)

    def data(self) -> FederatedData:
        from fedkt.data.splits import run_data

        return run_data(self.cfg.data, self.cfg.clients.num_clients, self.cfg.seed)

    @property
    def private(self) -> list[dict]:
        return self.data().private[self.cid]

    def test_metrics(self, evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
        """``test/*`` metrics of ``evaluate()`` (the client's model on the test split) when
        this call is an evaluation call and ``eval.clients`` is on; else nothing."""
        if not (self.evaluate and self.cfg.eval.clients):
            return {}
        return {f"test/{k}": v for k, v in evaluate().items()}

    def privatize(self, upload: dict[str, torch.Tensor],
                  reference: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Client-side DP on what this client uploads (identity when it is off).

        The Gaussian mechanism on the change ``upload - reference`` (``reference``
        None: ``upload`` already is a change): clip its L2 norm to
        ``differential_privacy.clip_norm``, add ``N(0, (noise_multiplier * clip_norm)^2)``
        (divided by sqrt(m) with ``noise: distributed``: :func:`fedkt.federated.privacy.client_noise_multiplier`).
        """
        dp = self.cfg.differential_privacy
        if not dp.enabled:
            return upload
        from fedkt.federated.privacy import client_noise_multiplier, privatize

        sigma = client_noise_multiplier(dp, clients_per_round(self.cfg), self.cfg.clients.min_replies)
        noisy, _ = privatize(upload, reference, clip_norm=dp.clip_norm, noise_multiplier=sigma,
                             seed=self.seed("dp"))
        return noisy

    def save_state(self, name: str, tensors: dict[str, torch.Tensor]) -> Path:
        """Keep tensors on this client's disk for later rounds."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / f"{name}.r{self.rnd:05d}s{self.step:03d}.safetensors"
        flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        atomic_write(path, lambda tmp: save_file(flat, str(tmp)), durable=False)
        self._prune(name)
        return path

    def load_state(self, name: str) -> dict[str, torch.Tensor] | None:
        """The latest state saved before this call, or ``None``."""
        best: tuple[int, int, Path] | None = None
        for tag, path in self._versions(name):
            if tag < (self.rnd, self.step) and (best is None or tag > best[:2]):
                best = (*tag, path)
        return None if best is None else load_file(str(best[2]))

    # ------------------------------------------------------------ what the server sent

    def received(self, msg: Payload, name: str, *, start: dict[str, torch.Tensor] | None = None,
                 **check: Any) -> dict[str, torch.Tensor]:
        """The object ``name`` a request refers to (:meth:`Holdings.offer
        <fedkt.methods.holdings.Holdings.offer>`): sent with it, then kept on this client's
        disk at its version, or this client's copy of that version.  ``start``: version 0,
        which every party builds itself from the seed (never sent).  ``check``: what
        :meth:`Payload.state` checks of a sent one (``like=``, ``finite=``).  A client
        holding no such version raises :class:`~fedkt.federated.payload.PayloadError` (it is excluded
        from the round and sent the object next time)."""
        version = msg.get(version_field(name))
        if isinstance(version, bool) or not isinstance(version, int | str):
            raise PayloadError(f"server: field {version_field(name)!r} should be a version "
                               f"(int or str), got {type(version).__name__}")
        if name in msg:
            value = msg.state(name, source="server", **check)
        elif version == 0 and start is not None:
            value = start
        else:
            kept = self.cached(name, version)
            if kept is None:
                raise PayloadError(f"server: sent no {name!r} but {self.name} holds no "
                                   f"{name!r} of version {version}")
            return kept
        self.keep(name, version, value)
        return value

    def cached(self, name: str, version: Version) -> dict[str, torch.Tensor] | None:
        """This client's kept copy of ``name`` at ``version`` (saved before this call), or None."""
        want = list(str(version).encode())
        for tag, path in sorted(self._versions(name), reverse=True):
            if tag < (self.rnd, self.step):
                saved = load_file(str(path))
                if _VERSION in saved and saved.pop(_VERSION).tolist() == want:
                    return saved
        return None

    def keep(self, name: str, version: Version, value: dict[str, torch.Tensor]) -> None:
        """Keep ``value`` as this client's copy of ``name`` at ``version``."""
        tag = torch.tensor(list(str(version).encode()), dtype=torch.uint8)
        self.save_state(name, {**value, _VERSION: tag})

    def _versions(self, name: str) -> list[tuple[tuple[int, int], Path]]:
        out = []
        if self.state_dir.is_dir():
            for p in self.state_dir.iterdir():
                m = _STATE_RE.match(p.name)
                if m and m["name"] == name:
                    out.append(((int(m["rnd"]), int(m["step"])), p))
        return out

    def _prune(self, name: str) -> None:
        # Keep what a resume from the previous round could still need.
        for (rnd, _), path in self._versions(name):
            if rnd < self.rnd - 1:
                path.unlink(missing_ok=True)


Handler = Callable[[ClientContext, Payload], Payload]


# --------------------------------------------------------------------------- server side


class Clients(Protocol):
    """The server's view of its clients; the runtime implements it."""

    ids: list[int]

    def call(self, handler: str, messages: dict[int, Payload], *, evaluate: bool | None = None
             ) -> dict[int, Payload]:
        """Run ``handler`` on each client in ``messages``; return the replies that arrived.

        ``evaluate`` (default: whether this is an evaluation round) tells the clients
        to score their models on the test split in this call.
        """
        ...

    def aggregate(self, handler: str, messages: dict[int, Payload], *, field: str,
                  like: dict[str, torch.Tensor] | torch.Tensor, weighted: bool = True,
                  decode: Callable[[int, Payload], dict[str, torch.Tensor]] | None = None
                  ) -> tuple[dict[int, Payload], Any]:
        """Run ``handler`` and return the replies and the weighted mean of their ``field``.

        Each reply's ``field`` is a dict of tensors shaped like ``like`` (or one tensor
        when ``like`` is one, and the mean is then a tensor); weights are
        the replies' ``num_examples`` (or 1 when ``weighted`` is off).  With
        ``secure_aggregation`` on the runtime uses SecAgg+: the server never sees a
        single client's ``field`` (it is absent from the returned replies) and
        clients must send it dense, shaped like ``like``.  Without it ``decode``
        (client id, reply) -> tensors may turn an encoded field into those tensors.
        """
        ...

    def validate(self, replies: dict[int, Payload], check: Callable[[int, Payload], Any],
                 handler: str = "") -> dict[int, Any]:
        """The server's own checks of replies it uses one by one.

        Returns ``{cid: check(cid, reply)}``; a client whose reply fails the check
        (``PayloadError`` / ``ValueError``) is excluded from the round with the reason,
        and the round fails if fewer than ``clients.min_replies`` pass.
        """
        ...


def mean_metric(replies: dict[int, Payload], key: str, cids: Iterable[int] | None = None
                ) -> float | None:
    """Mean of a metric the clients reported (``"train/loss"``) over the replies that hold
    it, or None when none does.

    A reply's ``metrics`` reach the method checked by the runtime (finite, plausible; an
    implausible one excluded its client), so the number the server averages is the one
    its client's row shows: it travels once.  ``cids``: only these replies (default all).
    """
    values = []
    for cid in (replies if cids is None else cids):
        metrics = replies[cid].get("metrics")
        value = metrics.get(key) if isinstance(metrics, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(float(value))
    return sum(values) / len(values) if values else None


def broadcast(clients: Clients, handler: str, payload: Payload | None = None,
              ids: list[int] | None = None, *, evaluate: bool | None = None
              ) -> dict[int, Payload]:
    """Send the same payload to several clients (all by default)."""
    payload = payload if payload is not None else Payload()
    return clients.call(handler, {cid: payload for cid in (ids or clients.ids)}, evaluate=evaluate)


C = TypeVar("C", bound=MethodConfig)


class Server(Generic[C]):
    """Base of a method's server procedure.  Subclasses implement :meth:`round`.

    Generic over the method's config: ``class FedAvgServer(Server[FedAvgConfig])`` makes
    ``self.method`` a ``FedAvgConfig`` for the type checker and the reader."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        # What each client holds of what this server sends it (checkpointed by the runner).
        self.holdings = Holdings()

    @property
    def method(self) -> C:
        """``cfg.method``: this method's validated settings."""
        return cast(C, self.cfg.method)

    def seed(self, rnd: int, *tags: object) -> int:
        return derive_seed(self.cfg.seed, "server", rnd, *tags)

    def data(self) -> FederatedData:
        """Public and test sets (private data stays on the clients)."""
        from fedkt.data.splits import run_data

        return run_data(self.cfg.data, self.cfg.clients.num_clients, self.cfg.seed)

    def setup(self) -> None:
        """Build models and initial state before round 1 (also on resume)."""

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        """One communication round; returns server-side training metrics."""
        raise NotImplementedError

    def evaluate(self, rnd: int) -> dict[str, float] | dict[str, dict[str, float]] | None:
        """Evaluate the server's model on the test split (``None``: no server model).

        A flat dict is the ``server`` participant's metrics.  A server holding several
        models returns ``{participant: metrics}`` and evaluates each non-``server`` one
        inside ``predictions.scope(participant)`` (FedCoLLM's ``global_slm``).
        """
        return None

    def server_model(self) -> LM | None:
        """The server's causal LM with its current weights loaded (what :meth:`evaluate`
        scores), for evaluators outside the round loop (lm-evaluation-harness,
        :mod:`fedkt.eval.harness`); ``None``: this server holds no causal LM."""
        return None

    def participant_model(self, participant: str) -> LM | None:
        """The causal LM of one of the participants :meth:`evaluate` reports (``server``:
        :meth:`server_model`), current weights loaded, for ``fedkt export``; ``None``:
        this server holds no such model."""
        return self.server_model() if participant == "server" else None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to resume after the last completed round."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise NotImplementedError(f"{type(self).__name__} does not restore state")


# --------------------------------------------------------------------------- the registration

# The client handlers' shared names, one per role every method may have; any other handler
# is the method's own and is listed, with what it does, in ``Conformance.own_handlers``
# (the conformance test checks both).
SHARED_HANDLERS: dict[str, str] = {
    "train": "local training on the client's private data; the reply is what it uploads",
    "evaluate": "the client's initial model on the test split (round 0, before training)",
    "adopt": "keep the model the server sends back (averaged, distilled or updated) as the "
             "client's own",
}


@dataclass(frozen=True)
class Behaviour:
    """What a method does that the rest of fedkt (config checks, export, evaluation outside
    the round loop) reads."""

    # The server only needs the (weighted) mean of one upload per client, which it gets
    # through ``Clients.aggregate``: secure aggregation and client-side DP apply.
    aggregates: bool = False
    # Trains through :func:`fedkt.train.lm.train_lm` on ``client_lm`` / ``server_lm``: a
    # per-model ``lr`` (``server.lr``, ``clients.models[i].lr``) applies.
    model_lr: bool = False
    # (cfg) -> None: raises ValueError naming the key when the run config does not suit
    # the method (checked when the config is parsed, before any work).
    check: Callable[[Any], None] | None = None
    # (ctx) -> LM: a client's causal LM as its state folder (``ctx.load_state``) holds it
    # after the round before ``ctx.rnd``, for evaluation outside the round loop
    # (:mod:`fedkt.eval.harness`, ``fedkt export``); None: the clients keep no model.
    client_model: Callable[[ClientContext], LM] | None = None


@dataclass(frozen=True)
class Docs:
    """How a method is described: ``fedkt list``, docs/configuration.md, the cross-method
    table and docs/security.md."""

    # One line: what the method does.
    summary: str = ""
    # The paper it follows (authors, title, venue).
    paper: str = ""
    # What crosses the wire besides metrics, in a few words: what the server sees from
    # each client, and what the clients see from the server.
    server_sees: str = "nothing"
    clients_see: str = "nothing"


@dataclass(frozen=True)
class Conformance:
    """What the conformance test (``tests/support/conformance.py``) runs a method on and holds it to."""

    # The smallest run of this method on tiny models: a shipped config's name
    # (``fedkt configs list``) or a YAML path; the conformance test runs it with
    # ``method.name`` set to this method's.
    tiny_config: str | None = None
    # handler -> field -> kind: what each client handler's reply may hold beyond the
    # runtime's own fields (:mod:`fedkt.methods.uploads`); every handler is declared, and
    # the conformance test checks every reply of a real run against it.
    uploads: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # handler -> what it does, for each handler outside :data:`SHARED_HANDLERS`.
    own_handlers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    """A registered method: who it is (``name``, its ``config`` class, its ``server``
    procedure and client ``handlers``), then what it does (``behaviour``), how it is
    described (``docs``) and what the conformance test holds it to (``conformance``).

    Made once, at module level, in its package's ``method.py``, keywords only, and named
    by its entry in :data:`fedkt.config.method_catalog.BUILT_IN` (a plugin's:
    :func:`fedkt.methods.register_method`)::

        METHOD = Method(name="fedavg", config=FedAvgConfig, server=FedAvgServer,
                        handlers={"train": client_train}, behaviour=Behaviour(...),
                        docs=Docs(...), conformance=Conformance(...))
    """

    name: str
    config: type[MethodConfig]
    server: type[Server]
    # handler name -> handler: :data:`SHARED_HANDLERS` names and the method's own.
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    behaviour: Behaviour = field(default_factory=Behaviour)
    docs: Docs = field(default_factory=Docs)
    conformance: Conformance = field(default_factory=Conformance)
