"""The fedavg package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.handlers import client_evaluate
from fedkt.methods.uploads import ADAPTER, NUMBER

from .algorithm import FedAvgServer, client_train
from .config import FedAvgConfig

METHOD = Method(
    name="fedavg", config=FedAvgConfig, server=FedAvgServer,
    handlers={"train": client_train, "evaluate": client_evaluate},
    behaviour=Behaviour(aggregates=True, model_lr=True),
    docs=Docs(
        summary="FedAvg of LoRA/prefix adapters on a shared client model",
        paper="McMahan et al., Communication-Efficient Learning of Deep Networks from "
              "Decentralized Data, AISTATS 2017",
        server_sees="adapter", clients_see="global adapter"),
    conformance=Conformance(
        tiny_config="fedavg/tiny",
        # McMahan et al.: the locally trained adapter theta_k and n_k.
        uploads={"train": {"adapter": ADAPTER, "num_examples": NUMBER},
                 "evaluate": {}}),
)
