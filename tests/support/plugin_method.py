"""A method variant defined outside fedkt that reuses one of fedkt's server classes, as a
plugin would (``tests/runtime/test_plugin_variant.py``): FedAvg's server and handlers
under another name and config.  Importing this module registers it, in the test process
and in every Flower worker that imports it again."""

from __future__ import annotations

from typing import Literal

from fedkt.config.method_settings import AdapterAveragingConfig
from fedkt.methods import register
from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.fedavg.algorithm import FedAvgServer, client_train
from fedkt.methods.handlers import client_evaluate
from fedkt.methods.uploads import ADAPTER, NUMBER

NAME = "fedavg_plugin_variant"


class VariantConfig(AdapterAveragingConfig):
    name: Literal["fedavg_plugin_variant"] = NAME


METHOD = register(Method(
    name=NAME, config=VariantConfig, server=FedAvgServer,  # fedkt's class, not this module's
    handlers={"train": client_train, "evaluate": client_evaluate},
    behaviour=Behaviour(aggregates=True, model_lr=True),
    docs=Docs(summary="FedAvg under a plugin's name (a test)"),
    conformance=Conformance(
        uploads={"train": {"adapter": ADAPTER, "num_examples": NUMBER},
                 "evaluate": {}}),
))
