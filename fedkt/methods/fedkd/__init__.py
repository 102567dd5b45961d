"""FedKD: local teachers, a shared student, adaptive mutual distillation, SVD-compressed
updates (Wu et al., Nature Communications 2022).

``config.py`` (settings), ``models.py`` (teacher, student, W_h), ``losses.py`` (Eqs. 1-7),
``algorithm.py`` (the server's round and the client handlers).
"""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.catalog import register
from fedkt.methods.exchange import client_adopt
from fedkt.methods.uploads import NUMBER, SVD_UPDATE

from .algorithm import FedKDServer, client_train, train_fedkd
from .config import STUDENT_LR_RATIO, FedKDConfig
from .losses import FedKDLosses, check_heads, fedkd_losses, loss_magnitudes
from .models import FedKDModels, layer_pairs

__all__ = ["METHOD", "STUDENT_LR_RATIO", "FedKDConfig", "FedKDLosses", "FedKDModels",
           "FedKDServer", "check_heads", "client_train", "fedkd_losses", "layer_pairs",
           "loss_magnitudes", "train_fedkd"]

METHOD = register(Method(
    name="fedkd", config=FedKDConfig, server=FedKDServer,
    handlers={"train": client_train, "adopt": client_adopt},
    behaviour=Behaviour(aggregates=True),
    docs=Docs(
        summary="local teachers + shared student by adaptive mutual distillation; "
                "SVD-compressed student updates",
        paper="Wu et al., Communication-efficient federated learning via knowledge "
              "distillation, Nature Communications 2022",
        server_sees="SVD-compressed student update",
        clients_see="compressed global student update"),
    conformance=Conformance(
        tiny_config="fedkd/tiny",
        # Eq. 8: SVD factors of the shared student's update; the teacher never leaves.
        uploads={"train": {"update": SVD_UPDATE, "num_examples": NUMBER},
                 "adopt": {}}),
))
