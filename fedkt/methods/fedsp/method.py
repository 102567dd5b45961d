"""The fedsp package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.uploads import HEX_ID, NUMBER, Tensor

from .algorithm import FedSPServer, client_setup, client_train
from .config import (
    FedPromptConfig,
    FedPromptSingleConfig,
    FedSPConfig,
    check_config,
)

_PAPER = ("Dong, Xie, Ding, Shen, Li, Tunable Soft Prompts are Messengers in Federated "
          "Learning, Findings of EMNLP 2023")
_HANDLERS = {"setup": client_setup, "train": client_train}
_BEHAVIOUR = Behaviour(aggregates=True, check=check_config)
# Sec. 3: "it uploads P_k only" (the auxiliary model stays on the client); 'setup'
# confirms the id of the auxiliary model the client keeps.
_CONFORMANCE = Conformance(
    tiny_config="fedsp/tiny",
    uploads={"setup": {"aux_id": HEX_ID, "num_parameters": NUMBER},
             "train": {"prompts": Tensor(2, "float32"), "num_examples": NUMBER}},
    own_handlers={"setup": "receive the auxiliary model (or the LLM, or its cut) once and "
                           "keep it on the client's disk; confirm its id"})

METHOD = Method(
    name="fedsp", config=FedSPConfig, server=FedSPServer, handlers=_HANDLERS,
    behaviour=_BEHAVIOUR,
    docs=Docs(summary="soft prompts between the server LLM and clients' KD-initialised "
                      "cut-and-shared auxiliary models",
              paper=_PAPER, server_sees="soft prompts",
              clients_see="auxiliary model (once), prompts"),
    conformance=_CONFORMANCE,
)
FEDPROMPT = Method(
    name="fedprompt", config=FedPromptConfig, server=FedSPServer, handlers=_HANDLERS,
    behaviour=_BEHAVIOUR,
    docs=Docs(summary="FedAvg of prefix prompts; clients hold the whole LLM (FedSP baseline)",
              paper=_PAPER, server_sees="soft prompts",
              clients_see="the whole LLM (once), prompts"),
    conformance=_CONFORMANCE,
)
FEDPROMPT_SINGLE = Method(
    name="fedprompt_single", config=FedPromptSingleConfig, server=FedSPServer,
    handlers=_HANDLERS, behaviour=_BEHAVIOUR,
    docs=Docs(summary="prompts trained on a 1-layer model without sharing, KD or alignment, "
                      "repeated up / averaged down (FedSP baseline)",
              paper=_PAPER, server_sees="soft prompts",
              clients_see="a 1-layer cut of the LLM (once), prompts"),
    conformance=_CONFORMANCE,
)
