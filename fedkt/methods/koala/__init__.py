"""KOALA: small models on resource-constrained clients, reverse and forward distillation
through the server's large model (Chen et al., arXiv:2407.05268).

``config.py`` (settings), ``losses.py`` (Eqs. 2-17), ``reductions.py`` (Table 2),
``algorithm.py`` (the server's round and the client handlers).
"""

from __future__ import annotations

from fedkt.methods.base import Conformance, Docs, Method
from fedkt.methods.catalog import register
from fedkt.methods.uploads import NUMBER, Tensors

from .algorithm import KoalaServer, client_adopt, client_train
from .config import KoalaConfig
from .losses import (
    BridgingMatrix,
    forward_distillation_loss,
    hete_soft_labels,
    homo_soft_labels,
)
from .reductions import client_reductions

__all__ = ["METHOD", "BridgingMatrix", "KoalaConfig", "KoalaServer", "client_adopt",
           "client_reductions", "client_train", "forward_distillation_loss", "hete_soft_labels",
           "homo_soft_labels"]

METHOD = register(Method(
    name="koala", config=KoalaConfig, server=KoalaServer,
    handlers={"train": client_train, "adopt": client_adopt},
    docs=Docs(
        summary="small models -> large model's adapter (reverse KD) -> small models (forward "
                "KD); homo or hete",
        paper="Chen et al., Federated Knowledge Transfer Fine-tuning Large Server Model with "
              "Resource-Constrained IoT Clients (KOALA), arXiv:2407.05268",
        server_sees="whole small model", clients_see="updated small model"),
    conformance=Conformance(
        tiny_config="koala/tiny",
        # Algorithm 1 step 1: "uploads it [the small model] with its sample count n_k".
        uploads={"train": {"model": Tensors(), "num_examples": NUMBER},
                 "adopt": {}}),
))
