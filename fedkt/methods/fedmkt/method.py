"""The fedmkt package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.handlers import client_evaluate
from fedkt.methods.uploads import ADAPTER, CHOICES, NUMBER, TOPK
from fedkt.train.lm import saved_client_lm

from .algorithm import (
    FedMKTServer,
    client_adopt,
    client_distill,
    client_train_and_share,
)
from .config import FedMKTConfig, LLM2SLMConfig, check_config

_HANDLERS = {"train_and_share": client_train_and_share, "distill": client_distill,
             "adopt": client_adopt, "evaluate": client_evaluate}
_OWN_HANDLERS = {
    "train_and_share": "steps 1-2: train the SLM's LoRA on the private data (Eq. 4), then "
                       "compute S_k on the public set and upload it if asked",
    "distill": "step 7: align S_0 to the client's tokens, DualMinCE against its own loss, "
               "train on L3 (Eqs. 6, 8, 10)"}
# Algorithm 1: S_k = the top-K logits of every position on the public set and the
# per-sample losses, named by public index; the SLM's LoRA never leaves (but with
# post_fedavg, an extension, which averages the SLM adapters after step 7).  With
# knowledge: choices (an extension) S_k is the [N, C] choice posteriors instead.
_UPLOADS = {"train_and_share": {"vocab_size": NUMBER, "k": NUMBER,
                                "topk": TOPK, "choices": CHOICES},
            "distill": {"adapter": ADAPTER, "num_examples": NUMBER},
            "adopt": {}, "evaluate": {}}
_PAPER = ("Fan et al., FedMKT: Federated Mutual Knowledge Transfer for Large and Small "
          "Language Models, COLING 2025 (arXiv:2406.02224)")

METHOD = Method(
    name="fedmkt", config=FedMKTConfig, server=FedMKTServer, handlers=_HANDLERS,
    behaviour=Behaviour(model_lr=True, check=check_config, client_model=saved_client_lm),
    docs=Docs(
        summary="mutual top-K logit distillation between a server LLM and heterogeneous "
                "client SLMs (token alignment, DualMinCE)",
        paper=_PAPER, server_sees="SLM top-K logits on public data",
        clients_see="LLM top-K logits on public data"),
    conformance=Conformance(tiny_config="fedmkt/tiny", uploads=_UPLOADS,
                            own_handlers=_OWN_HANDLERS),
)
LLM2SLM = Method(
    name="llm2slm", config=LLM2SLMConfig, server=FedMKTServer, handlers=_HANDLERS,
    behaviour=Behaviour(model_lr=True, check=check_config, client_model=saved_client_lm),
    docs=Docs(
        summary="FedMKT baseline: the server LLM stays frozen and only teaches the client SLMs",
        paper=_PAPER, server_sees="nothing", clients_see="LLM top-K logits on public data"),
    conformance=Conformance(
        tiny_config="fedmkt/tiny",
        # Knowledge only flows LLM -> SLM: clients send their metrics only.
        uploads={**_UPLOADS, "train_and_share": {}},
        own_handlers=_OWN_HANDLERS),
)
