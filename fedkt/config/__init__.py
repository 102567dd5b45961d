"""Run configuration: one YAML file describes a run, validated on load.

The package, one job per module:

* :mod:`~fedkt.config.schema`: the pydantic models of every section (``RunConfig`` and
  below, ``MethodConfig``), each field with its description;
* :mod:`~fedkt.config.load`: YAML, ``--set`` overrides, validation (``load_config``,
  ``parse_config``, ``apply_overrides``);
* :mod:`~fedkt.config.messages`: the text of a bad key's error;
* :mod:`~fedkt.config.reference`: docs/configuration.md (``python -m fedkt.config --write``);
* :mod:`~fedkt.config.explain`: one key's type, default, allowed values and description
  (``fedkt configs explain KEY``).

Every name is importable from ``fedkt.config`` as before the split.
"""

from __future__ import annotations

from fedkt.config.load import _set_dotted as _set_dotted
from fedkt.config.load import apply_overrides, load_config, parse_config
from fedkt.config.messages import _format_error as _format_error
from fedkt.config.messages import _short as _short
from fedkt.config.reference import REFERENCE_HEADER, config_reference, write_reference
from fedkt.config.schema import (
    TRACKING_BACKENDS,
    ClassFilterConfig,
    ClassSpec,
    ClientsConfig,
    DataConfig,
    DatasetConfig,
    DifferentialPrivacyConfig,
    EvalConfig,
    LoraSettings,
    MethodConfig,
    MLflowSettings,
    ModelConfig,
    PartitionConfig,
    QuantizationSettings,
    ReplyLimits,
    RunConfig,
    RuntimeConfig,
    SecureAggregationConfig,
    SplitConfig,
    TensorBoardSettings,
    TrackingConfig,
    TrainingConfig,
    runtime_config_class,
)
from fedkt.config.schema import _check_class_spec as _check_class_spec
from fedkt.config.schema import _check_device as _check_device
from fedkt.config.schema import _Strict as _Strict
from fedkt.config.schema import _validate_method as _validate_method
from fedkt.errors import ConfigError
from fedkt.runtime.settings import FlowerSettings, FlowerSimSettings

__all__ = [
    "REFERENCE_HEADER", "TRACKING_BACKENDS", "ClassFilterConfig", "ClassSpec", "ClientsConfig",
    "ConfigError", "DataConfig", "DatasetConfig", "DifferentialPrivacyConfig", "EvalConfig",
    "FlowerSettings", "FlowerSimSettings", "LoraSettings", "MLflowSettings", "MethodConfig",
    "ModelConfig", "PartitionConfig", "QuantizationSettings", "ReplyLimits", "RunConfig",
    "RuntimeConfig", "SecureAggregationConfig", "SplitConfig", "TensorBoardSettings",
    "TrackingConfig", "TrainingConfig", "apply_overrides", "config_reference", "load_config",
    "parse_config", "runtime_config_class", "write_reference",
]
