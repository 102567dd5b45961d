"""Non-collaborative baselines: zero-shot, standalone and centralized.

* ``zero_shot``: evaluate the server's and clients' models untouched (1 round).
* ``standalone``: each client trains its own adapter on its private data only;
  nothing but metrics leaves a client.
* ``centralized``: one model trained on all private + public data pooled (the
  upper bound that federated methods approach); one round is one pass of
  ``training.local_epochs``.
"""

from __future__ import annotations

from typing import Literal

from fedkt.config import MethodConfig
from fedkt.methods import register
from fedkt.methods.base import ClientContext, Method, Server, broadcast
from fedkt.payload import Payload
from fedkt.train.lm import (
    LM,
    client_evaluate,
    client_lm,
    client_test_metrics,
    evaluate_lm,
    saved_client_lm,
    server_lm,
    train_lm,
)

# ------------------------------------------------------------------------- zero-shot


class ZeroShotConfig(MethodConfig):
    name: Literal["zero_shot"] = "zero_shot"


class ZeroShotServer(Server[ZeroShotConfig]):
    """Evaluates the server model (if any); clients evaluate their own models."""

    def setup(self) -> None:
        self.lm = server_lm(self.cfg) if self.cfg.server else None

    def round(self, rnd: int, clients) -> dict[str, float]:
        if self.cfg.clients.models and self.cfg.eval.clients:
            broadcast(clients, "evaluate", evaluate=True)
        return {}

    def evaluate(self, rnd: int) -> dict[str, float] | None:
        return evaluate_lm(self.cfg, self.lm, self.data().test) if self.lm else None

    def server_model(self) -> LM | None:
        return self.lm


def untouched_client_model(ctx: ClientContext) -> LM:
    """A zero-shot client's model: its initial one."""
    return client_lm(ctx.cfg, ctx.cid)


# ------------------------------------------------------------------------ standalone


class StandaloneConfig(MethodConfig):
    name: Literal["standalone"] = "standalone"


class StandaloneServer(Server[StandaloneConfig]):
    """Only asks clients to train; their adapters stay on their disks."""

    def round(self, rnd: int, clients) -> dict[str, float]:
        broadcast(clients, "train")
        return {}


def client_train_alone(ctx: ClientContext, msg: Payload) -> Payload:
    lm = client_lm(ctx.cfg, ctx.cid)
    lm.reset(ctx.load_state("adapter"))  # None in round 1: the initial adapter
    stats = train_lm(ctx.cfg, lm, ctx.private, seed=ctx.seed("train"), desc=f"{ctx.name} train")
    ctx.save_state("adapter", lm.trainable())
    return Payload(metrics={"train/loss": stats["loss"], "train/steps": stats["steps"],
                            **client_test_metrics(ctx, lm)})


# ----------------------------------------------------------------------- centralized


class CentralizedConfig(MethodConfig):
    name: Literal["centralized"] = "centralized"
    include_public: bool = True


class CentralizedServer(Server[CentralizedConfig]):
    """Pools the private data of every client taking part (and the public set) on the server."""

    def setup(self) -> None:
        self.lm = server_lm(self.cfg) if self.cfg.server else client_lm(self.cfg, 0)
        self.state = self.lm.trainable()
        data = self.data()
        self.records = [r for cid in self.cfg.client_ids() for r in data.private[cid]]
        if self.method.include_public:
            self.records += data.public

    def round(self, rnd: int, clients) -> dict[str, float]:
        self.lm.reset(self.state)
        model = self.cfg.server or self.cfg.clients.model_for(0)
        stats = train_lm(self.cfg, self.lm, self.records, seed=self.seed(rnd, "train"),
                         lr=model.lr, desc="centralized")
        self.state = self.lm.trainable()
        return {"train/loss": stats["loss"]}

    def evaluate(self, rnd: int) -> dict[str, float]:
        return evaluate_lm(self.cfg, self.lm.reset(self.state), self.data().test)

    def server_model(self) -> LM:
        return self.lm.reset(self.state)

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state) -> None:
        self.state = dict(state)


register(Method("zero_shot", ZeroShotConfig, ZeroShotServer, {"evaluate": client_evaluate},
                server_sees="nothing", clients_see="nothing",
                summary="evaluate models without training", client_model=untouched_client_model,
                model_lr=True))
register(Method("standalone", StandaloneConfig, StandaloneServer, {"train": client_train_alone,
                                                                "evaluate": client_evaluate},
                server_sees="nothing", clients_see="nothing",
                summary="each client trains alone on its private data",
                client_model=saved_client_lm, model_lr=True))
register(Method("centralized", CentralizedConfig, CentralizedServer, {},
                server_sees="all raw data", clients_see="-",
                summary="one model trained on all data pooled (upper bound)", model_lr=True))
