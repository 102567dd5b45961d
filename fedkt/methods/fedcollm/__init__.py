"""FedCoLLM: FedAvg of the clients' SLM adapter, then co-tuning of the server's LLM and the
global SLM by mutual distillation (Fan et al., arXiv:2411.11707).

``config.py`` (settings), ``cotune.py`` (Eqs. 4-6, the server's co-tuning), ``algorithm.py``
(the server's round; the clients run FedAvg's ``train`` handler).
"""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.catalog import register
from fedkt.methods.fedavg import METHOD as FEDAVG

from .algorithm import FedCoLLMServer
from .config import FedCoLLMConfig, check_config
from .cotune import CrossTokenizerKL, cotune, cotune_losses, kd_gradient_ratios, kd_mask, mutual_kl

__all__ = ["METHOD", "CrossTokenizerKL", "FedCoLLMConfig", "FedCoLLMServer", "cotune",
           "cotune_losses", "kd_gradient_ratios", "kd_mask", "mutual_kl"]

METHOD = register(Method(
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
))
