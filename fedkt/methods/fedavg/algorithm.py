"""FedAvg of PEFT adapters on one shared client model (McMahan et al., 2017).

The baseline every paper compares against, and fedkt's default demo.  The paper's
Algorithm 1 (FederatedAveraging) has no numbered lines: steps are cited by number
only.  Clients share one small model; each round:

1. the server sends the global adapter theta to every client;
2. client k trains theta_k on its private data (task loss) for the local epochs;
3. the server sets theta = sum_k n_k theta_k / sum_k n_k (weighted by examples).

With ``secure_aggregation.enabled`` step 3 runs Flower's SecAgg+
(:mod:`fedkt.runtime.secagg`): the server learns ``sum_k n_k theta_k / sum_k n_k``
but no single ``theta_k``, and clients that drop out after the key exchange are
recovered from their neighbours' key shares.

:func:`average_client_adapters` (steps 1-3, server side) and :func:`client_train`
(client handler) are shared with FedCoLLM.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from fedkt.errors import ConfigError
from fedkt.federated.payload import Payload
from fedkt.methods.base import ClientContext, Clients, Server, mean_metric
from fedkt.train.lm import LM, client_lm, client_test_metrics, evaluate_lm, train_lm

from .config import AdapterAveragingConfig, FedAvgConfig

Adapter = dict[str, torch.Tensor]  # a PEFT adapter's weights by name
A = TypeVar("A", bound=AdapterAveragingConfig)  # the config of a method that averages one


# --------------------------------------------------------------------------- server side


def average_client_adapters(server: Server[A], clients: Clients, adapter: Adapter
                            ) -> tuple[Adapter, dict[str, float]]:
    """Broadcast ``adapter``, let every client train it, return the (weighted) average.

    With ``secure_aggregation`` on the runtime aggregates by SecAgg+ and the server
    never sees a client's adapter.
    """
    msg = Payload(adapter=adapter)
    replies, new = clients.aggregate("train", {cid: msg for cid in clients.ids},
                                     field="adapter", like=adapter,
                                     weighted=server.method.weighted)
    loss = mean_metric(replies, "train/loss")  # clients without data report none
    metrics: dict[str, float] = {"train/loss": loss} if loss is not None else {}
    return new, metrics


# --------------------------------------------------------------------------- client side


def client_train(ctx: ClientContext, msg: Payload) -> Payload:
    """Local training of the received adapter on private data (task loss).

    The adapter goes back as is (with DP on: clipped and noised, see
    :meth:`~fedkt.methods.base.ClientContext.privatize`); under secure aggregation
    the runtime masks it before it leaves the client.
    """
    lm = client_lm(ctx.cfg, ctx.cid, ctx.data())
    received = msg.state("adapter", like=lm.initial, source="server")
    lm.reset(received)
    stats = train_lm(ctx.cfg, lm, ctx.private, data=ctx.data(), seed=ctx.seed("train"),
                     desc=f"{ctx.name} train")
    n = stats["num_examples"]
    metrics: dict[str, float] = {"train/steps": stats["steps"], **client_test_metrics(ctx, lm)}
    if n:  # a client without data has no loss (NaN is not JSON); the server skips it
        metrics["train/loss"] = stats["loss"]
    return Payload(adapter=ctx.privatize(lm.trainable(), received), num_examples=n,
                   metrics=metrics)


# --------------------------------------------------------------------------- FedAvg


class FedAvgServer(Server[FedAvgConfig]):
    """The server's side of FedAvg: it holds the global adapter theta."""

    lm: LM  # the shared client model, which evaluates theta
    adapter: Adapter  # theta

    def setup(self) -> None:
        models = {m.model_dump_json(exclude={"lr"}) for m in self.cfg.clients.models}
        if len(models) > 1:
            raise ConfigError("clients.models: fedavg needs one model shared by all clients")
        self.lm = client_lm(self.cfg, 0, self.data())
        self.adapter = self.lm.trainable()

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        # 1. broadcast theta; 2. clients train locally; 3. (secure) weighted average
        self.adapter, metrics = average_client_adapters(self, clients, self.adapter)
        return metrics

    def evaluate(self, rnd: int) -> dict[str, float]:
        return evaluate_lm(self.cfg, self.lm.reset(self.adapter), self.data().test,
                           data=self.data())

    def server_model(self) -> LM:
        return self.lm.reset(self.adapter)

    def state_dict(self) -> Adapter:
        return dict(self.adapter)

    def load_state_dict(self, state: Adapter) -> None:
        self.adapter = dict(state)
