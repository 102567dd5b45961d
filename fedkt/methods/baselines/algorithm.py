"""The baselines every paper compares against, for any model family (:mod:`.families`).

* ``zero_shot``: evaluate the server's and the clients' models untouched (1 round);
* ``standalone``: each client trains its own model on its private data only; nothing but
  metrics leaves a client ("local" in FedKD's tables);
* ``centralized``: one model trained on all private data pooled, with the public set
  (``include_public``): the upper bound that federated methods approach; one round is
  one pass of ``training.local_epochs``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedkt.federated.payload import Payload
from fedkt.methods.base import ClientContext, Clients, Server, broadcast
from fedkt.train.lm import LM

from .config import CentralizedConfig, StandaloneConfig, ZeroShotConfig
from .families import family_of, train_metrics

# --------------------------------------------------------------------------- client side


def client_evaluate(ctx: ClientContext, msg: Payload) -> Payload:
    """The client's initial model on the test split (round 0, zero-shot)."""
    family = family_of(ctx.cfg)
    model = family.build(ctx.cfg, ctx.cid, ctx.data())
    return Payload(metrics=ctx.test_metrics(
        lambda: family.evaluate(ctx.cfg, model, ctx.data().test, data=ctx.data())))


def client_train_alone(ctx: ClientContext, msg: Payload) -> Payload:
    """Standalone: continue training this client's own model on its private data."""
    family = family_of(ctx.cfg)
    model = family.build(ctx.cfg, ctx.cid, ctx.data())
    saved = ctx.load_state(family.kept)  # None in round 1: the initial model
    if saved is not None:
        family.load(model, saved)
    stats = family.train(ctx.cfg, model, ctx.private, data=ctx.data(), seed=ctx.seed("train"),
                         desc=f"{ctx.name} train")
    ctx.save_state(family.kept, family.state(model))
    return Payload(metrics={**train_metrics(stats), **ctx.test_metrics(
        lambda: family.evaluate(ctx.cfg, model, ctx.data().test, data=ctx.data()))})


def untouched_client_model(ctx: ClientContext) -> LM:
    """A zero-shot client's model: its initial one (``Behaviour.client_model``)."""
    return family_of(ctx.cfg).build(ctx.cfg, ctx.cid, ctx.data())


# --------------------------------------------------------------------------- servers


class ZeroShotServer(Server[ZeroShotConfig]):
    """Evaluates the server model (if any); clients evaluate their own models."""

    def setup(self) -> None:
        self.family = family_of(self.cfg)
        self.model = self.family.build(self.cfg, None, self.data())

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        if self.cfg.clients.models and self.cfg.eval.clients:
            broadcast(clients, "evaluate", evaluate=True)
        return {}

    def evaluate(self, rnd: int) -> dict[str, float] | None:
        if self.model is None:
            return None
        return self.family.evaluate(self.cfg, self.model, self.data().test, data=self.data())

    def server_model(self) -> LM | None:
        return None if self.model is None else self.family.as_lm(self.model)


class StandaloneServer(Server[StandaloneConfig]):
    """Only asks clients to train; their models stay on their disks."""

    def setup(self) -> None:
        family_of(self.cfg).check(self.cfg)

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        broadcast(clients, "train")
        return {}


class CentralizedServer(Server[CentralizedConfig]):
    """Pools the private data of every client taking part (and the public set) on the
    server, and trains the server's model on it (the clients' when it has none)."""

    def setup(self) -> None:
        self.family = family_of(self.cfg)
        self.model: Any = (self.family.build(self.cfg, None, self.data())
                           or self.family.build(self.cfg, 0, self.data()))
        self.state = self.family.state(self.model)
        data = self.data()
        self.records = [r for cid in self.cfg.client_ids() for r in data.private[cid]]
        if self.method.include_public:
            self.records += data.public

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        self.family.load(self.model, self.state)
        stats = self.family.train(self.cfg, self.model, self.records, data=self.data(),
                                  seed=self.seed(rnd, "train"), desc="centralized")
        self.state = self.family.state(self.model)
        return train_metrics(stats)

    def evaluate(self, rnd: int) -> dict[str, float]:
        model = self.family.load(self.model, self.state)
        return self.family.evaluate(self.cfg, model, self.data().test, data=self.data())

    def server_model(self) -> LM | None:
        return self.family.as_lm(self.family.load(self.model, self.state))

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.state = dict(state)
