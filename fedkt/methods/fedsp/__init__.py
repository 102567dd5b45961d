"""FedSP: tunable soft prompts are the messengers (Dong et al., Findings of EMNLP 2023), and
its baselines FedPrompt and FedPrompt-Single.

``config.py`` (settings), ``training.py`` (the client phases, Eq. 2, the paper's
optimiser), ``aux_model.py`` (the auxiliary model on the wire and on a client's disk),
``algorithm.py`` (the server's round and the client handlers).
"""

from __future__ import annotations

from fedkt.methods import register
from fedkt.methods.base import Method
from fedkt.methods.uploads import HEX_ID, NUMBER, Tensor

from .algorithm import PROMPT_KEY, FedSPServer, client_setup, client_train
from .config import (
    FedPromptConfig,
    FedPromptSingleConfig,
    FedSPConfig,
    PromptMessengerConfig,
    check_config,
)
from .training import distill_auxiliary, prefix_training, stage_optimizer

__all__ = ["PROMPT_KEY", "FedPromptConfig", "FedPromptSingleConfig", "FedSPConfig",
           "FedSPServer", "PromptMessengerConfig", "client_setup", "client_train",
           "distill_auxiliary", "prefix_training", "stage_optimizer"]

_PAPER = ("Dong, Xie, Ding, Shen, Li, Tunable Soft Prompts are Messengers in Federated "
          "Learning, Findings of EMNLP 2023")
_HANDLERS = {"setup": client_setup, "train": client_train}
# Sec. 3: "it uploads P_k only" (the auxiliary model stays on the client); 'setup'
# confirms the id of the auxiliary model the client keeps.
_UPLOADS = {"setup": {"aux_id": HEX_ID, "num_parameters": NUMBER},
            "train": {"prompts": Tensor(2, "float32"), "num_examples": NUMBER,
                      "train_loss": NUMBER, "align_loss": NUMBER}}

register(Method("fedsp", FedSPConfig, FedSPServer, _HANDLERS, paper=_PAPER, aggregates=True,
                uploads=_UPLOADS, tiny_config="fedsp/tiny", check=check_config,
                server_sees="soft prompts",
                clients_see="auxiliary model (once), prompts",
                summary="soft prompts between the server LLM and clients' KD-initialised "
                        "cut-and-shared auxiliary models"))
register(Method("fedprompt", FedPromptConfig, FedSPServer, _HANDLERS, paper=_PAPER,
                aggregates=True, uploads=_UPLOADS, tiny_config="fedsp/tiny", check=check_config,
                server_sees="soft prompts",
                clients_see="the whole LLM (once), prompts",
                summary="FedAvg of prefix prompts; clients hold the whole LLM (FedSP baseline)"))
register(Method("fedprompt_single", FedPromptSingleConfig, FedSPServer, _HANDLERS,
                paper=_PAPER, aggregates=True, uploads=_UPLOADS, tiny_config="fedsp/tiny",
                check=check_config, server_sees="soft prompts",
                clients_see="a 1-layer cut of the LLM (once), prompts",
                summary="prompts trained on a 1-layer model without sharing, KD or alignment, "
                        "repeated up / averaged down (FedSP baseline)"))
