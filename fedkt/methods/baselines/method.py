"""The baselines package's :class:`~fedkt.methods.base.Method` objects, as the catalog names them
(:data:`fedkt.config.method_catalog.BUILT_IN`); importing this module imports the algorithm."""

from __future__ import annotations

from fedkt.methods.base import Behaviour, Conformance, Docs, Method
from fedkt.methods.exchange import client_adopt
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

# No collaboration (zero-shot, standalone, centralized): only metrics travel, if anything.
ZERO_SHOT = Method(
    name="zero_shot", config=ZeroShotConfig, server=ZeroShotServer,
    handlers={"evaluate": client_evaluate},
    behaviour=Behaviour(model_lr=True, client_model=untouched_client_model),
    docs=Docs(summary="evaluate models without training"),
    conformance=Conformance(tiny_config="fedcollm/tiny", uploads={"evaluate": {}}),
)
STANDALONE = Method(
    name="standalone", config=StandaloneConfig, server=StandaloneServer,
    handlers={"train": client_train_alone, "evaluate": client_evaluate},
    behaviour=Behaviour(model_lr=True, client_model=saved_client_lm),
    docs=Docs(summary="each client trains alone on its private data"),
    conformance=Conformance(tiny_config="fedavg/tiny", uploads={"train": {}, "evaluate": {}}),
)
CENTRALIZED = Method(
    name="centralized", config=CentralizedConfig, server=CentralizedServer,
    behaviour=Behaviour(model_lr=True, check=check_centralized),
    docs=Docs(summary="one model trained on all data pooled (upper bound)",
              server_sees="all raw data", clients_see="-"),
    conformance=Conformance(tiny_config="fedavg/tiny"),
)
STANDALONE_ENCODER = Method(
    name="standalone_encoder", config=StandaloneEncoderConfig, server=StandaloneServer,
    handlers={"train": client_train_alone, "evaluate": client_evaluate},
    docs=Docs(summary="each client fine-tunes its own encoder classifier alone"),
    conformance=Conformance(tiny_config="fedkd/tiny", uploads={"train": {}, "evaluate": {}}),
)
CENTRALIZED_ENCODER = Method(
    name="centralized_encoder", config=CentralizedEncoderConfig, server=CentralizedServer,
    behaviour=Behaviour(check=check_centralized),
    docs=Docs(summary="one encoder classifier on all data pooled (upper bound)",
              server_sees="all raw data", clients_see="-"),
    conformance=Conformance(tiny_config="fedkd/tiny"),
)
# FedAvg baselines of FedKD and KOALA.
FEDAVG_ENCODER = Method(
    name="fedavg_encoder", config=FedAvgEncoderConfig, server=fedavg_encoder.FedAvgEncoderServer,
    handlers={"train": fedavg_encoder.client_train, "adopt": client_adopt,
              "evaluate": client_evaluate},
    behaviour=Behaviour(aggregates=True),
    docs=Docs(
        summary="FedAvg of an encoder classifier, teacher or student size (FedKD's baselines)",
        paper="McMahan et al. 2017; as the 'UniLM (Fed)' / 'UniLM_N' rows of Wu et al. 2022",
        server_sees="model update", clients_see="global model"),
    conformance=Conformance(
        tiny_config="fedkd/tiny",
        # FedAvg of the whole (small) encoder: its update, uncompressed by default.
        uploads={"train": {"update": SVD_UPDATE, "num_examples": NUMBER},
                 "adopt": {}, "evaluate": {}}),
)
FEDAVG_VISION = Method(
    name="fedavg_vision", config=FedAvgVisionConfig, server=fedavg_vision.FedAvgVisionServer,
    handlers={"train": fedavg_vision.client_train},
    behaviour=Behaviour(aggregates=True),
    docs=Docs(
        summary="FedAvg of an image classifier's head or whole model (KOALA's baseline)",
        paper="McMahan et al. 2017; the baseline of Chen et al. (KOALA), arXiv:2407.05268",
        server_sees="trainable weights", clients_see="global weights"),
    conformance=Conformance(
        tiny_config="koala/tiny",
        # KOALA's baseline: FedAvg of the large model's head (the backbone is frozen).
        uploads={"train": {"trainable": Tensors(), "num_examples": NUMBER}}),
)
