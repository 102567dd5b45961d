"""FedAvg of PEFT adapters on one shared client model (McMahan et al., 2017).

The template of a method package: ``config.py`` (its settings), ``algorithm.py`` (the
server's round and the client handlers, read top to bottom), and this file, which
registers it.  Copy the folder, rename, register: nothing else lists a method.
"""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.catalog import register
from fedkt.methods.handlers import client_evaluate
from fedkt.methods.uploads import ADAPTER, NUMBER

from .algorithm import Adapter, FedAvgServer, average_client_adapters, client_train
from .config import AdapterAveragingConfig, FedAvgConfig

__all__ = ["METHOD", "Adapter", "AdapterAveragingConfig", "FedAvgConfig", "FedAvgServer",
           "average_client_adapters", "client_train"]

METHOD = register(Method(
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
))
