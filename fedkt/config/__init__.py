"""Run configuration: one YAML file describes a run, validated on load.

The package, one job per module:

* :mod:`~fedkt.config.schema`: ``RunConfig``, the root of the pydantic models, with its
  cross-section checks; each section's models, every field with its description, are in
  their own module (:mod:`~fedkt.config.model_schema`, :mod:`~fedkt.config.data_schema`,
  :mod:`~fedkt.config.training_schema`, :mod:`~fedkt.config.runtime_schema`,
  :mod:`~fedkt.config.privacy_schema`, :mod:`~fedkt.config.eval_schema`,
  :mod:`~fedkt.config.tracking_schema`, :mod:`~fedkt.config.method_schema` with
  ``MethodConfig``), on :mod:`~fedkt.config.base`'s strict base;
* :mod:`~fedkt.config.load`: YAML, ``--set`` overrides, validation (``load_config``,
  ``parse_config``, ``apply_overrides``); :mod:`~fedkt.config.bounded_yaml`: the YAML
  loader with bounds (aliases, nesting, duplicate keys);
* :mod:`~fedkt.config.messages`: the text of a bad key's error;
* :mod:`~fedkt.config.reference`: docs/configuration.md (``python -m fedkt.config --write``);
* :mod:`~fedkt.config.explain`: one key's type, default, allowed values and description
  (``fedkt configs explain KEY``).

Every name is importable from ``fedkt.config`` as before the split; each is imported on
first use, so that reading the method and runtime catalogs (``fedkt list``) does not
import the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedkt.errors import ConfigError
from fedkt.infra.lazy import lazy_exports

# name -> the module under fedkt.config that defines it, imported on first use.
_EXPORTS: dict[str, str] = {
    "_Strict": "base",
    "ClassFilterConfig": "data_schema",
    "ClassSpec": "data_schema",
    "DataConfig": "data_schema",
    "DatasetConfig": "data_schema",
    "PartitionConfig": "data_schema",
    "SplitConfig": "data_schema",
    "_check_class_spec": "data_schema",
    "EvalConfig": "eval_schema",
    "_set_dotted": "load",
    "apply_overrides": "load",
    "load_config": "load",
    "parse_config": "load",
    "_format_error": "messages",
    "_short": "messages",
    "MethodConfig": "method_schema",
    "LoraSettings": "model_schema",
    "ModelConfig": "model_schema",
    "QuantizationSettings": "model_schema",
    "_check_device": "model_schema",
    "DifferentialPrivacyConfig": "privacy_schema",
    "SecureAggregationConfig": "privacy_schema",
    "REFERENCE_HEADER": "reference",
    "config_reference": "reference",
    "write_reference": "reference",
    "ReplyLimits": "runtime_schema",
    "RuntimeConfig": "runtime_schema",
    "runtime_config_class": "runtime_schema",
    "FlowerSettings": "runtime_settings",
    "FlowerSimSettings": "runtime_settings",
    "RunConfig": "schema",
    "_validate_method": "schema",
    "TRACKING_BACKENDS": "tracking_schema",
    "MLflowSettings": "tracking_schema",
    "TensorBoardSettings": "tracking_schema",
    "TrackingConfig": "tracking_schema",
    "ClientsConfig": "training_schema",
    "TrainingConfig": "training_schema",
}

if TYPE_CHECKING:
    from fedkt.config.base import (
        _Strict as _Strict,
    )
    from fedkt.config.data_schema import (
        ClassFilterConfig,
        ClassSpec,
        DataConfig,
        DatasetConfig,
        PartitionConfig,
        SplitConfig,
    )
    from fedkt.config.data_schema import (
        _check_class_spec as _check_class_spec,
    )
    from fedkt.config.eval_schema import (
        EvalConfig,
    )
    from fedkt.config.load import (
        _set_dotted as _set_dotted,
    )
    from fedkt.config.load import (
        apply_overrides,
        load_config,
        parse_config,
    )
    from fedkt.config.messages import (
        _format_error as _format_error,
    )
    from fedkt.config.messages import (
        _short as _short,
    )
    from fedkt.config.method_schema import (
        MethodConfig,
    )
    from fedkt.config.model_schema import (
        LoraSettings,
        ModelConfig,
        QuantizationSettings,
    )
    from fedkt.config.model_schema import (
        _check_device as _check_device,
    )
    from fedkt.config.privacy_schema import (
        DifferentialPrivacyConfig,
        SecureAggregationConfig,
    )
    from fedkt.config.reference import (
        REFERENCE_HEADER,
        config_reference,
        write_reference,
    )
    from fedkt.config.runtime_schema import (
        ReplyLimits,
        RuntimeConfig,
        runtime_config_class,
    )
    from fedkt.config.runtime_settings import (
        FlowerSettings,
        FlowerSimSettings,
    )
    from fedkt.config.schema import (
        RunConfig,
    )
    from fedkt.config.schema import (
        _validate_method as _validate_method,
    )
    from fedkt.config.tracking_schema import (
        TRACKING_BACKENDS,
        MLflowSettings,
        TensorBoardSettings,
        TrackingConfig,
    )
    from fedkt.config.training_schema import (
        ClientsConfig,
        TrainingConfig,
    )

__all__ = [
    "REFERENCE_HEADER", "TRACKING_BACKENDS", "ClassFilterConfig", "ClassSpec", "ClientsConfig",
    "ConfigError", "DataConfig", "DatasetConfig", "DifferentialPrivacyConfig", "EvalConfig",
    "FlowerSettings", "FlowerSimSettings", "LoraSettings", "MLflowSettings", "MethodConfig",
    "ModelConfig", "PartitionConfig", "QuantizationSettings", "ReplyLimits", "RunConfig",
    "RuntimeConfig", "SecureAggregationConfig", "SplitConfig", "TensorBoardSettings",
    "TrackingConfig", "TrainingConfig", "apply_overrides", "config_reference", "load_config",
    "parse_config", "runtime_config_class", "write_reference",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
