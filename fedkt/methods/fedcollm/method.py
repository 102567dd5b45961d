"""The fedcollm package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.fedavg.method import METHOD as FEDAVG

from .algorithm import FedCoLLMServer
from .config import FedCoLLMConfig, check_config

METHOD = Method(
    name="fedcollm", config=FedCoLLMConfig, server=FedCoLLMServer,
    # Algorithm 1 steps 1-3 are FedAvg's: its client handlers, so its uploads (the SLM's
    # LoRA theta_k and n_k); the co-tuning happens on the server.
    handlers=dict(FEDAVG.handlers),
    behaviour=Behaviour(aggregates=True, check=check_config),
    docs=Docs(
        summary="FedAvg of SLM LoRA adapters + server LLM/SLM mutual distillation on public "
                "data",
        paper="Fan et al., FedCoLLM: A Parameter-Efficient Federated Co-tuning Framework for "
              "Large and Small Language Models, arXiv:2411.11707",
        server_sees="SLM adapter", clients_see="global SLM adapter"),
    conformance=Conformance(tiny_config="fedcollm/tiny", uploads=FEDAVG.conformance.uploads),
)
