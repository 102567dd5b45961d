"""The fedkd package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.exchange import client_adopt
from fedkt.methods.uploads import NUMBER, SVD_UPDATE

from .algorithm import FedKDServer, client_train
from .config import FedKDConfig

METHOD = Method(
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
)
