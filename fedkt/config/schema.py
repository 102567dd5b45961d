"""The run config's schema: :class:`RunConfig`, the root of the tree of pydantic models,
and the checks that read more than one section.

Each section's models live in their own module (``model_schema``, ``data_schema``,
``training_schema``, ``runtime_schema``, ``privacy_schema``, ``eval_schema``,
``tracking_schema``, ``method_schema``; their strict base in ``base``) and are
re-exported here. Every field carries its description (``Field(description=...)``), which
``docs/configuration.md`` and ``fedkt configs explain`` show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from fedkt.config.base import _Strict
from fedkt.config.bounds import Rounds, Seed
from fedkt.config.data_schema import (
    ClassFilterConfig,
    ClassSpec,
    DataConfig,
    DatasetConfig,
    PartitionConfig,
    SplitConfig,
)
from fedkt.config.data_schema import _check_class_spec as _check_class_spec
from fedkt.config.eval_schema import EvalConfig
from fedkt.config.messages import _MethodErrors
from fedkt.config.method_catalog import method_check, method_config_class, method_flag
from fedkt.config.method_schema import MethodConfig
from fedkt.config.model_schema import LoraSettings, ModelConfig, QuantizationSettings
from fedkt.config.model_schema import _check_device as _check_device
from fedkt.config.privacy_schema import DifferentialPrivacyConfig, SecureAggregationConfig
from fedkt.config.runtime_schema import ReplyLimits, RuntimeConfig, runtime_config_class
from fedkt.config.runtime_schema import _runtime_from_dump as _runtime_from_dump
from fedkt.config.tracking_schema import (
    TRACKING_BACKENDS,
    MLflowSettings,
    TensorBoardSettings,
    TrackingConfig,
)
from fedkt.config.training_schema import ClientsConfig, TrainingConfig
from fedkt.errors import ConfigError

__all__ = [
    "TRACKING_BACKENDS", "ClassFilterConfig", "ClassSpec", "ClientsConfig", "DataConfig",
    "DatasetConfig", "DifferentialPrivacyConfig", "EvalConfig", "LoraSettings", "MLflowSettings",
    "MethodConfig", "ModelConfig", "PartitionConfig", "QuantizationSettings", "ReplyLimits",
    "RunConfig", "RuntimeConfig", "SecureAggregationConfig", "SplitConfig",
    "TensorBoardSettings", "TrackingConfig", "TrainingConfig", "runtime_config_class",
]


def _validate_method(method: str | dict[str, Any]) -> MethodConfig:
    """``method`` validated by the config class of the method it names."""
    if isinstance(method, str):
        method = {"name": method}
    if not isinstance(method, dict):
        raise ConfigError(f"method: expected a method name or a mapping with 'name', "
                          f"got {type(method).__name__}")
    if not isinstance(method.get("name"), str):
        raise ConfigError(f"method.name: expected a method name (a string), "
                          f"got {type(method.get('name')).__name__}")
    try:
        return method_config_class(method.get("name")).model_validate(method)
    except ValidationError as err:
        raise _MethodErrors(err) from None


class RunConfig(_Strict):
    name: str = Field("run", description=(
        "The run's name (the {name} of output_dir, and the trackers' run name): a safe file "
        "name, 1 to 128 characters without '/', '\\' or control characters, not '.' or "
        "'..'."))
    seed: Seed = Field(0, description=(
        "Seeds data splits, model initialisation and every round's server and client work: the "
        "same seed and config give the same numbers."))
    rounds: Rounds = Field(3, description="Federated rounds.")
    output_dir: str = Field("runs/{name}", description=(
        "The run folder; {name} is replaced by name."))
    method: SerializeAsAny[MethodConfig] = Field(description=(
        "The method (method.name) and its hyper-parameters, validated by the method's own config "
        "class."))
    server: ModelConfig | None = Field(None, description=(
        "The server's model (the LLM); None for methods without one."))
    clients: ClientsConfig = Field(default_factory=ClientsConfig, description=(
        "The clients: how many, their models, who takes part."))
    data: DataConfig = Field(description=(
        "The dataset and how it becomes public, private and test sets."))
    training: TrainingConfig = Field(default_factory=TrainingConfig, description=(
        "Local optimisation: learning rate, batches, PEFT, precision."))
    runtime: SerializeAsAny[RuntimeConfig] = Field(
        default_factory=lambda: runtime_config_class()(), description=(
        "The transport (runtime.name), the settings every runtime reads, and each runtime's own "
        "section."))
    eval: EvalConfig = Field(default_factory=EvalConfig, description=(
        "When and what to evaluate, and what to keep of it."))
    secure_aggregation: SecureAggregationConfig = Field(
        default_factory=SecureAggregationConfig, description=(
        "Flower's SecAgg+ on every runtime (methods that sum client uploads)."))
    differential_privacy: DifferentialPrivacyConfig = Field(
        default_factory=DifferentialPrivacyConfig, description=(
        "Client-side differential privacy on each upload."))
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description=(
        "Experiment trackers the server mirrors the run to, e.g. [tensorboard, mlflow]."))

    @model_validator(mode="before")
    @classmethod
    def _method_config(cls, values: Any) -> Any:
        """Validate ``method`` with the config class the named method registers."""
        if isinstance(values, dict) and isinstance(values.get("method"), str | dict):
            values = dict(values)
            values["method"] = _validate_method(values["method"])
        return values

    @field_validator("runtime", mode="wrap")
    @classmethod
    def _runtime_sections(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Validate ``runtime`` with the sections of the registered runtimes it uses."""
        if isinstance(value, dict):
            runtime = runtime_config_class(value)
            own = [s for s, name in runtime.sections.items() if name == value.get("name")]
            if own and own[0] not in value:  # its required settings are named if missing
                value = {**value, own[0]: {}}
            return runtime.model_validate(value)
        return handler(value)

    @model_validator(mode="after")
    def _seed_has_a_fold(self) -> RunConfig:
        folds = self.data.split.folds
        if folds is not None and self.data.split.fold is None and not 0 <= self.seed < folds:
            raise ValueError(f"seed: {self.seed} has no fold: data.split.folds is {folds}, and "
                             f"seed k tests on fold k (seeds 0..{folds - 1})")
        return self

    @model_validator(mode="after")
    def _precision_fits_device(self) -> RunConfig:
        if self.training.precision == "fp16" and self.runtime.device.startswith("cpu"):
            raise ValueError("training.precision: fp16 needs a CUDA GPU, runtime.device is "
                             f"{self.runtime.device!r}; use bf16, fp32 or auto")
        return self

    @model_validator(mode="after")
    def _quantization_fits_training(self) -> RunConfig:
        """A quantised base cannot train every weight (``peft: full``)."""
        models = [("server", self.server)] + [(f"clients.models.{i}", m)
                                              for i, m in enumerate(self.clients.models)]
        for key, model in models:
            if model is not None and model.quantization is not None and \
                    self.training.peft == "full":
                raise ValueError(f"{key}.quantization: training.peft 'full' trains every weight, "
                                 "and quantised weights cannot train; use peft lora (QLoRA) "
                                 "or prefix, or none for a frozen model")
        return self

    @model_validator(mode="after")
    def _privacy_applies(self) -> RunConfig:
        """Secure aggregation and DP need a method whose server only sums client uploads."""
        sampled = max(1, round(self.clients.fraction * len(self.client_ids())))
        if self.secure_aggregation.enabled and sampled < 2:
            raise ValueError("secure_aggregation.enabled: SecAgg+ needs at least 2 clients per "
                             f"round; clients.fraction gives {sampled}")
        if self.secure_aggregation.enabled and self.runtime.aggregation == "median":
            raise ValueError("runtime.aggregation: median needs each client's upload; with "
                             "secure_aggregation.enabled the server sees only their sum")

        dp = self.differential_privacy
        if dp.enabled and dp.noise == "distributed" and not self.secure_aggregation.enabled:
            raise ValueError("differential_privacy.noise: distributed noise needs "
                             "secure_aggregation.enabled: without it the server sees each "
                             "upload with only 1/sqrt(clients) of the noise")
        for key in ("secure_aggregation", "differential_privacy"):
            if getattr(self, key).enabled and not method_flag(self.method.name, "aggregates"):
                raise ValueError(
                    f"{key}.enabled: method {self.method.name!r} uses each client's upload "
                    "on its own (not only their sum), so this does not apply (see "
                    "docs/security.md for the methods it applies to)")
        return self

    @model_validator(mode="after")
    def _public_labels_withheld(self) -> RunConfig:
        """``data.public_labels: false``: refuse what would read a public label."""
        if not self.data.public_labels and self.training.prefix_from_text:
            raise ValueError("training.prefix_init: text starts the prefix from the public set's "
                             "(prompt, answer) pairs, but data.public_labels is false; use "
                             "prefix_init: random")
        return self

    @model_validator(mode="after")
    def _kd_micro_batch_applies(self) -> RunConfig:
        """``training.kd_micro_batch`` splits choice-posterior distillation only (FedMKT's
        and FedCoLLM's ``knowledge: choices``); elsewhere it would be silently ignored."""
        if self.training.kd_micro_batch is None:
            return self
        knowledge = getattr(self.method, "knowledge", None)
        if knowledge is None:
            raise ValueError(f"training.kd_micro_batch: method {self.method.name!r} has no "
                             "choice-posterior distillation (method.knowledge: choices of "
                             "FedMKT or FedCoLLM) for it to split; remove it")
        if knowledge != "choices":
            raise ValueError(f"training.kd_micro_batch: splits the distillation of choice "
                             f"posteriors, and method.knowledge is {knowledge!r}; set "
                             "method.knowledge: choices or remove it")
        # method.teacher: none keeps it: the no-exchange control shares its suite's settings
        return self

    @model_validator(mode="after")
    def _model_lr_applies(self) -> RunConfig:
        """A per-model ``lr`` needs a method that reads it (see ``Behaviour.model_lr``); the
        method's own ``check`` of the whole config."""
        keys = (["server.lr"] if self.server is not None and self.server.lr is not None else [])
        keys += [f"clients.models[{i}].lr" for i, m in enumerate(self.clients.models)
                 if m.lr is not None]
        check = method_check(self.method.name)  # imports the method's config module only
        if check is not None:
            check(self)
        if keys and not method_flag(self.method.name, "model_lr"):
            first = keys[0].replace("[", ".").replace("]", "")  # a key path the error names
            raise ValueError(f"{first}: method {self.method.name!r} does not read per-model "
                             f"learning rates (set: {', '.join(keys)}); use training.lr (or "
                             "the method's own lr keys)")
        return self

    @field_validator("name")
    @classmethod
    def _name_is_a_file_name(cls, value: str) -> str:
        """``name`` becomes a folder (``output_dir``'s ``{name}``): it may not leave it."""
        if (not value or len(value) > 128 or value in (".", "..")
                or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in value)):
            raise ValueError("not a safe file name: give 1 to 128 characters without '/', "
                             "'\\' or control characters, not '.' or '..'")
        return value

    @field_validator("output_dir")
    @classmethod
    def _output_dir_placeholders(cls, value: str) -> str:
        try:
            value.format(name="run")
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"the only placeholder allowed is {{name}} ({exc!r})") from None
        return value

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir.format(name=self.name))

    def client_ids(self) -> list[int]:
        """The clients that take part: ``clients.participants`` (sorted), else all."""
        if self.clients.participants is not None:
            return sorted(self.clients.participants)
        return list(range(self.clients.num_clients))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
