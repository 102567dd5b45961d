"""The koala package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Conformance, Docs, Method
from fedkt.methods.uploads import NUMBER, Tensors

from .algorithm import KoalaServer, client_adopt, client_train
from .config import KoalaConfig

METHOD = Method(
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
)
