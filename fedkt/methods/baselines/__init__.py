"""The baselines the papers compare against, over model families (:mod:`.families`).

``algorithm.py``: zero-shot, standalone and centralized for any family (causal LMs,
encoder classifiers); ``fedavg_encoder.py`` and ``fedavg_vision.py``: FedAvg of an
encoder (FedKD's exchange) and of an image classifier (KOALA's baseline).  FedAvg of a
causal LM's adapter is its own package, :mod:`fedkt.methods.fedavg`.
"""

from __future__ import annotations

from fedkt.exchange import client_sync
from fedkt.methods import register
from fedkt.methods.base import Method
from fedkt.methods.uploads import NUMBER, SVD_UPDATE, Tensors
from fedkt.train.lm import saved_client_lm

from . import fedavg_encoder, fedavg_vision
from .algorithm import (
    CentralizedServer,
    StandaloneServer,
    ZeroShotServer,
    client_evaluate,
    client_train_alone,
    untouched_client_model,
)
from .config import (
    CentralizedConfig,
    CentralizedEncoderConfig,
    FedAvgEncoderConfig,
    FedAvgVisionConfig,
    StandaloneConfig,
    StandaloneEncoderConfig,
    ZeroShotConfig,
    check_centralized,
)
from .families import ENCODER, LM_FAMILY, Classifier, Family, family_of

__all__ = ["ENCODER", "LM_FAMILY", "CentralizedServer", "Classifier", "Family",
           "StandaloneServer", "ZeroShotServer", "family_of"]

# No collaboration (zero-shot, standalone, centralized): only metrics travel, if anything.
register(Method("zero_shot", ZeroShotConfig, ZeroShotServer, {"evaluate": client_evaluate},
                server_sees="nothing", clients_see="nothing", uploads={"evaluate": {}},
                tiny_config="fedcollm/tiny",
                summary="evaluate models without training", client_model=untouched_client_model,
                model_lr=True))
register(Method("standalone", StandaloneConfig, StandaloneServer,
                {"train": client_train_alone, "evaluate": client_evaluate},
                server_sees="nothing", clients_see="nothing",
                uploads={"train": {}, "evaluate": {}}, tiny_config="fedavg/tiny",
                summary="each client trains alone on its private data",
                client_model=saved_client_lm, model_lr=True))
register(Method("centralized", CentralizedConfig, CentralizedServer, {},
                server_sees="all raw data", clients_see="-", tiny_config="fedavg/tiny",
                check=check_centralized,
                summary="one model trained on all data pooled (upper bound)", model_lr=True))
register(Method(
    "standalone_encoder", StandaloneEncoderConfig, StandaloneServer,
    {"train": client_train_alone, "evaluate": client_evaluate},
    uploads={"train": {}, "evaluate": {}}, tiny_config="fedkd/tiny",
    summary="each client fine-tunes its own encoder classifier alone"))
register(Method(
    "centralized_encoder", CentralizedEncoderConfig, CentralizedServer, {},
    server_sees="all raw data", clients_see="-", tiny_config="fedkd/tiny", check=check_centralized,
    summary="one encoder classifier on all data pooled (upper bound)"))
register(Method(
    "fedavg_encoder", FedAvgEncoderConfig, fedavg_encoder.FedAvgEncoderServer,
    {"train": fedavg_encoder.client_train, "sync": client_sync, "evaluate": client_evaluate},
    aggregates=True, server_sees="model update", clients_see="global model",
    # FedAvg of the whole (small) encoder: its update, uncompressed by default.
    uploads={"train": {"update": SVD_UPDATE, "num_examples": NUMBER, "train_loss": NUMBER},
             "sync": {}, "evaluate": {}},
    tiny_config="fedkd/tiny",
    summary="FedAvg of an encoder classifier, teacher or student size (FedKD's baselines)",
    paper="McMahan et al. 2017; as the 'UniLM (Fed)' / 'UniLM_N' rows of Wu et al. 2022"))
register(Method(
    name="fedavg_vision", config=FedAvgVisionConfig, server=fedavg_vision.FedAvgVisionServer,
    handlers={"train": fedavg_vision.client_train}, aggregates=True,
    server_sees="trainable weights", clients_see="global weights",
    # KOALA's baseline: FedAvg of the large model's head (the backbone is frozen).
    uploads={"train": {"trainable": Tensors(), "num_examples": NUMBER, "train_loss": NUMBER}},
    tiny_config="koala/tiny",
    summary="FedAvg of an image classifier's head or whole model (KOALA's baseline)",
    paper="McMahan et al. 2017; the baseline of Chen et al. (KOALA), arXiv:2407.05268",
))
