"""The run config's schema: a tree of pydantic models, one per section.

Unknown keys are rejected, NaN and inf too; every field carries its description
(``Field(description=...)``), which ``docs/configuration.md`` and ``fedkt configs explain``
show. A method's own hyper-parameters live under ``method:`` and are validated by the
config class the method registers (:func:`fedkt.methods.registry.method_config_class`).
"""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
    model_validator,
)

from fedkt.config.messages import _MethodErrors
from fedkt.errors import ConfigError
from fedkt.methods.registry import method_check, method_config_class, method_flag
from fedkt.runtime.settings import STRICT
from fedkt.templates import HARD_MAX_WIDTH, check_template


class _Strict(BaseModel):
    model_config = STRICT  # unknown keys, NaN and inf are refused

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A field a subclass declares again (another default) without a description keeps
        its parent's (``FedPromptConfig.distill``, every method's ``name``)."""
        super().__pydantic_init_subclass__(**kwargs)
        for name, info in cls.model_fields.items():
            if info.description:
                continue
            for base in cls.__mro__[1:]:
                parent = getattr(base, "__pydantic_fields__", {}).get(name)
                if parent is not None and parent.description:
                    info.description = parent.description
                    break


class LoraSettings(_Strict):
    """LoRA through ``peft`` (FedMKT paper defaults: r=8, alpha=16, dropout 0.05)."""

    r: int = Field(8, ge=1, description="LoRA rank (the inner dimension of each low-rank update).")
    alpha: int = Field(16, ge=1, description=(
        "LoRA scaling numerator: each update is scaled by alpha / r."))
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description=(
        "Dropout on the LoRA branch's input during training."))
    target_modules: list[str] | str | None = Field(None, description=(
        "The modules LoRA adapts (names or a regex); None: peft's per-architecture default (q/v "
        "projections)."))
    modules_to_save: list[str] | None = Field(None, description=(
        "Extra modules trained fully and shipped with the adapter (e.g. a classifier head)."))


class QuantizationSettings(_Strict):
    """Load a model's base weights quantised by bitsandbytes (``model.quantization``).

    A model that trains (LoRA or prefix: a student) is prepared with peft's
    ``prepare_model_for_kbit_training`` (QLoRA: norms and head in fp32, the quantised
    weights frozen); a frozen one (``peft: none``: a teacher) only runs quantised. Adapters
    and everything that travels stay in full precision. Needs the ``quantization`` extra.
    """

    bits: Literal[4, 8] = Field(description="4: NF4/FP4 weights (QLoRA); 8: LLM.int8() weights.")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description=(
        "4-bit only: the 4-bit data type (nf4: QLoRA's normal float)."))
    double_quant: bool = Field(True, description=(
        "4-bit only: quantise the quantisation constants too (QLoRA; about 0.4 bits/weight less)."))
    compute_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(None, description=(
        "4-bit only: the dtype the matmuls run in; None: the model's ``dtype``."))


def _check_device(value: str | None, where: str = "") -> str | None:
    """A torch device string (``cpu``, ``cuda``, ``cuda:1``, ``mps``) or ``auto``."""
    if value is None or value == "auto":
        return value
    import torch

    try:
        torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{where}{value!r} is not a device; use auto, cpu, cuda or cuda:N"
                         ) from None
    return value


class ModelConfig(_Strict):
    """A model: a hub id, a local path, an offline alias, or a ``tiny-*`` preset."""

    name: str = Field(..., min_length=1, description=(
        "A Hugging Face hub id, a local folder or file, an offline alias (`fedkt models list`) or "
        "a `tiny-*` preset."))
    gguf_file: str | None = Field(None, description=(
        "A GGUF file in that repo or folder, loaded and cached once as float safetensors "
        "(docs/models.md)."))
    revision: str | None = Field(None, description=(
        "A hub revision (branch, tag or commit) to load; None: the default branch."))
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description=(
        "The dtype the weights are loaded in."))
    tiny: dict[str, Any] = Field(default_factory=dict, description=(
        "Overrides for tiny presets (hidden size, layers, vocab size, ...)."))
    trust_remote_code: bool = Field(False, description=(
        "Run the model repo's own Python code (transformers' trust_remote_code); a client refuses "
        "a job that asks for it (docs/security.md)."))
    num_layers: int | None = Field(None, ge=1, description=(
        "Keep only the first N decoder layers of the loaded model (pruned, not retrained): a "
        "smaller model derived from a pretrained one. None keeps every layer."))
    lr: float | None = Field(None, gt=0, description=(
        "This model's learning rate (FedMKT D.1 sets the LLM's and each SLM's apart); None: "
        "training.lr. Read by the methods that train through the shared LM trainer."))
    quantization: QuantizationSettings | None = Field(None, description=(
        "Load the base weights quantised by bitsandbytes, e.g. {bits: 4} (QLoRA); None: in dtype. "
        "See QuantizationSettings and docs/models.md (bringing a 7B model)."))
    device: str | None = Field(None, description=(
        "The device this model runs on (cpu, cuda, cuda:1); None: runtime.device for the server's "
        "model, runtime.client_devices / runtime.device for a client's."))
    device_map: Literal["auto", "balanced", "sequential"] | None = Field(None, description=(
        "accelerate's device_map: auto/balanced/sequential spread a model too big for one GPU "
        "over every visible GPU (then the CPU); None: the whole model on its device."))

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str | None) -> str | None:
        return _check_device(value)

    @field_validator("device_map")
    @classmethod
    def _accelerate_installed(cls, value: str | None) -> str | None:
        import importlib.util

        if value is not None and importlib.util.find_spec("accelerate") is None:
            raise ValueError("needs accelerate, which is not installed: pip install "
                             "'fedkt[placement]'; or remove device_map")
        return value

    @field_validator("quantization")
    @classmethod
    def _bitsandbytes_installed(cls, value: QuantizationSettings | None
                                ) -> QuantizationSettings | None:
        import importlib.util

        if value is not None and importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError("needs bitsandbytes, which is not installed: pip install "
                             "'fedkt[quantization]' (bitsandbytes>=0.46 runs 4/8-bit on CPUs "
                             "and CUDA GPUs); or remove quantization")
        return value


class DatasetConfig(_Strict):
    """Where records come from and how their fields map onto fedkt's."""

    name: str | None = Field(None, description=(
        "A built-in vendored dataset (`fedkt list` shows them); give one of name, path or "
        "hf_name."))
    path: str | None = Field(None, description=(
        "A local file of records (jsonl/json/csv, or a suffix register_reader adds) or a folder "
        "of them."))
    hf_name: str | None = Field(None, description=(
        "A Hugging Face `datasets` id (loaded with datasets.load_dataset)."))
    hf_subset: str | None = Field(None, description=(
        "The Hugging Face dataset's subset (configuration) name."))
    hf_split: str = Field("train", description="The Hugging Face dataset's split to read.")
    task: Literal["multiple_choice", "classification", "generation",
                  "image_classification"] | None = Field(
        None, description=(
        "What the records are for; None: the built-in dataset's own task, else inferred from the "
        "fields."))
    fields: dict[str, str] = Field(default_factory=dict, description=(
        'fedkt field -> field in the records, e.g. {"text": "tweet", "label": "y"}.'))
    label_names: list[str] | None = Field(None, description=(
        "Classification: the class names, in label order (prompts and choices read them); None: "
        "the dataset's own."))
    template: str | None = Field(None, description=(
        "Optional prompt template, with {field} placeholders."))
    max_records: int | None = Field(None, ge=1, description=(
        "Read at most this many records (None: all)."))

    @field_validator("template")
    @classmethod
    def _safe_template(cls, value: str | None) -> str | None:
        if value is not None:
            check_template(value)  # plain {field} names; widths within the hard limit
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        given = [k for k in ("name", "path", "hf_name") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of 'name' (built-in dataset), 'path' (local file) or "
                f"'hf_name' (Hugging Face dataset); got {given or 'none'}"
            )
        return self


class SplitConfig(_Strict):
    """How records become public / private / test sets.

    ``fedmkt``: the train part is cut into ``num_clients + 1`` equal parts, one
    public and the rest private (FedMKT paper, Sec. 5.1).  ``holdout``: a
    ``public_fraction`` of the train part is public, the rest private.
    """

    scheme: Literal["fedmkt", "holdout"] = Field("holdout", description=(
        "fedmkt: the train part cut into num_clients + 1 equal parts, the first public; holdout: "
        "public_fraction of it public, the rest private."))
    test_size: int | float = Field(0.2, gt=0, description=(
        "The test holdout: a count of records, or a fraction (< 1) of them (ignored with "
        "test_dataset)."))
    public_fraction: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "scheme holdout: the share of the training records that is the public set."))
    server_size: int | float = Field(0, ge=0, description=(
        "The server's own labelled records (FederatedData.server): a count, or a fraction in (0, "
        "1) of the training records (what the test holdout leaves), cut after the test set and "
        "before the scheme's public / private parts (0: none; the splits are then unchanged)."))
    test_dataset: DatasetConfig | None = Field(None, description=(
        "Optional: the test set comes from another dataset (e.g. a dedicated test file)."))
    folds: int | None = Field(None, ge=2, description=(
        "Cross-fitted folds: the records are cut once into this many folds (fold_seed), and a "
        "run with seed k tests on fold k and trains on the rest, so over seeds 0..folds-1 "
        "every record is tested exactly once and never in the training part of its own fold "
        "(test_size is then not used; seeds must be 0..folds-1). None: a seeded holdout."))
    fold_seed: int = Field(0, description=(
        "folds: the seed of the one cut into folds, shared by every seed (fold) of a suite."))

    @model_validator(mode="after")
    def _folds_or_test_dataset(self) -> SplitConfig:
        if self.folds is not None and self.test_dataset is not None:
            raise ValueError("folds: the test set comes from split.test_dataset, so there is "
                             "nothing to cut into test folds; set one of folds or test_dataset")
        return self


class PartitionConfig(_Strict):
    """How the private pool is divided among clients.

    ``iid``: equal random parts.  ``dirichlet``: label shares per client drawn from
    Dirichlet(``alpha``).  ``by_field``: by a natural key such as a user or speaker,
    flwr-datasets' ``NaturalIdPartitioner``: one client per value of ``field``, or, with
    more values than clients, the values (in a seeded order) dealt into ``num_clients``
    groups of as equal a number of values as can be.
    """

    scheme: Literal["iid", "dirichlet", "by_field"] = Field("iid", description=(
        "iid: equal random parts; dirichlet: label shares per client from Dirichlet(alpha); "
        "by_field: one client (or group) per value of field."))
    alpha: float = Field(1.0, gt=0, description=(
        "scheme dirichlet: the concentration; smaller is more skewed."))
    min_size: int = Field(1, ge=0, description=(
        "The fewest private records a client may get (dirichlet redraws, others refuse to run "
        "below it)."))
    field: str | None = Field(None, min_length=1, description=(
        "scheme by_field: the record field whose values name the clients (a fedkt field such as "
        "``label``, or a source field kept in the record's ``extra``, e.g. ``topic``)."))

    @model_validator(mode="after")
    def _field_for_by_field(self) -> PartitionConfig:
        if self.scheme == "by_field" and self.field is None:
            raise ValueError("field: scheme by_field needs the record field to partition "
                             "by (e.g. field: topic)")
        if self.scheme != "by_field" and self.field is not None:
            raise ValueError(f"field: only scheme by_field reads it (scheme is "
                             f"{self.scheme!r})")
        return self


# A class filter: "0-2", "3,4,5,6", "0-2,7", a list of class indices, or one index.
ClassSpec = int | str | list[int]
_CLASS_SPEC = re.compile(r"\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*")


def _check_class_spec(spec: ClassSpec | None, key: str) -> None:
    """Syntax of a class filter (the range is checked against the task's classes on load)."""
    if spec is None:
        return
    if isinstance(spec, str):
        if not _CLASS_SPEC.fullmatch(spec):
            raise ValueError(f"{key}: expected class indices like '0-2', '3,4,5,6' or a list "
                             f"of integers, got {spec!r}")
        return
    items = [spec] if isinstance(spec, int) else spec
    if not items or any(c < 0 for c in items) or len(set(items)) != len(items):
        raise ValueError(f"{key}: expected distinct class indices >= 0, got {spec!r}")


class ClassFilterConfig(_Strict):
    """Text (and image) classification: the classes each part keeps (None: all).

    Applied after the split and partition, in order: every part keeps its records of
    the listed classes (labels are not renumbered), then the caps apply.
    """

    server: ClassSpec | None = Field(None, description=(
        "The server's own labelled records (data.split.server_size)."))
    private: ClassSpec | None = Field(None, description="Each client's private records.")
    public: ClassSpec | None = Field(None, description=(
        "The public set (before its labels are withheld; not with data.public_dataset)."))
    test: ClassSpec | None = Field(None, description="The test set.")

    @model_validator(mode="after")
    def _specs(self) -> ClassFilterConfig:
        for key in ("server", "private", "public", "test"):
            _check_class_spec(getattr(self, key), key)
        return self


class DataConfig(_Strict):
    dataset: DatasetConfig = Field(description=(
        "The task's records: a built-in dataset, a local file or a Hugging Face dataset, and its "
        "field mapping."))
    split: SplitConfig = Field(default_factory=SplitConfig, description=(
        "How the records become the public, private and test sets."))
    partition: PartitionConfig = Field(default_factory=PartitionConfig, description=(
        "How the private records are divided among the clients."))
    max_length: int = Field(256, ge=8, description=(
        "The most tokens of one example (prompt and answer); longer ones are cut."))
    max_private_per_client: int | None = Field(None, ge=1, description=(
        "Cap on each client's private records, for quick runs (None: all)."))
    max_public: int | None = Field(None, ge=1, description=(
        "Cap on the public set's records (None: all)."))
    max_test: int | None = Field(None, ge=1, description=(
        "Cap on the test set's records (None: all)."))
    oversample: bool = Field(False, description=(
        "Classification: repeat each client's minority-class records (seeded) until its classes "
        "are as frequent as its largest one, after the cap (FedKD's positive oversampling on "
        "SMM4H). Examples per round grow accordingly."))
    public_labels: bool = Field(True, description=(
        "false: the public records reach every side without their gold fields (label; target and "
        "references), FederatedData.public_labels is false; test and private records keep theirs. "
        "Methods refuse the steps that would read a public label."))
    public_dataset: DatasetConfig | None = Field(None, description=(
        "An off-distribution public set: unlabelled text from another dataset, its fields mapped "
        "onto the task's input fields (fields: {text: prompt} puts DialogSum's dialogues in an "
        "intent task's text), shuffled (seeded) and capped by max_public. Needs public_labels: "
        "false. The task's own public part (split.public_fraction, scheme fedmkt's first fifth) "
        "is still cut, and goes unused."))
    classes: ClassFilterConfig = Field(default_factory=ClassFilterConfig, description=(
        "Classification: the classes each part keeps (None: all), applied after the split and "
        "partition."))
    template_max_width: int = Field(1000, ge=1, le=HARD_MAX_WIDTH, description=(
        "The widest a template may pad a field, and its largest precision ({text:>80} is 80): a "
        "template cannot make one prompt of millions of characters."))

    chat_template: str = Field("none", min_length=1, description=(
        "Chat models: none (plain prompts), auto (each model's own chat template wraps the prompt "
        "as a user turn, for training and scoring; plain for a model without one), or a Jinja "
        "chat template used for every model (docs/data.md, chat templates)."))

    @model_validator(mode="after")
    def _public_source(self) -> DataConfig:
        if self.public_dataset is not None and self.public_labels:
            raise ValueError("public_dataset: an off-distribution public set has no labels; "
                             "set data.public_labels: false")
        if self.public_dataset is not None and self.classes.public is not None:
            raise ValueError("classes.public: data.public_dataset has no labels to filter by; "
                             "remove classes.public")
        return self

    @model_validator(mode="after")
    def _template_widths(self) -> DataConfig:
        for key, ds in (("dataset", self.dataset), ("split.test_dataset", self.split.test_dataset)):
            if ds is not None and ds.template is not None:
                try:
                    check_template(ds.template, self.template_max_width)
                except ValueError as exc:
                    raise ValueError(f"{key}.template: {exc}") from None
        return self

    @field_validator("chat_template")
    @classmethod
    def _jinja_compiles(cls, value: str) -> str:
        if value in ("auto", "none"):
            return value
        if "{{" not in value and "{%" not in value:
            raise ValueError("expected auto, none or a Jinja chat template (with {{ }} or "
                             f"{{% %}}), got {value[:40]!r}")
        from jinja2 import Environment, TemplateSyntaxError

        try:
            Environment().parse(value)
        except TemplateSyntaxError as exc:
            raise ValueError(f"the Jinja template does not compile: {exc}") from None
        return value


class TrainingConfig(_Strict):
    """Local optimisation (FedMKT paper defaults)."""

    lr: float = Field(3e-4, gt=0, description=(
        "Learning rate of local training (AdamW), unless a model's own lr or a method's stage lr "
        "sets one."))
    batch_size: int = Field(4, ge=1, description="Examples per optimiser step.")
    local_epochs: float = Field(1.0, gt=0, description=(
        "Passes over a client's private data per round (a fraction runs part of one)."))
    max_steps: int | None = Field(None, ge=1, description=(
        "Cap on optimiser steps per local training (None: local_epochs decides)."))
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW's (beta1, beta2).")
    weight_decay: float = Field(0.1, ge=0, description="AdamW's decoupled weight decay.")
    warmup_ratio: float = Field(0.008, ge=0, lt=1, description=(
        "Share of a training's steps with a linear learning-rate warm-up."))
    max_grad_norm: float | None = Field(1.0, gt=0, description=(
        "Clip the gradient's L2 norm to this (None: no clipping)."))
    reuse: bool = Field(True, description=(
        "Reuse a plain local training that starts from a model's initial adapter (a client's "
        "local epochs, an LLM's own-data epochs before any exchange) when the model, tokenizer, "
        "batches, training settings, learning rate, seed, precision and fedkt code were all "
        "seen before: the suite arms of one seed then compute it once (stored in "
        "$FEDKT_CACHE/reuse/train). Rows equal those of a run with reuse: false, but for "
        "timings (train_saved_seconds)."))
    peft: Literal["lora", "prefix", "full", "none"] = Field("lora", description=(
        "What trains: a LoRA adapter, a prefix (prefix tuning), every weight (full), or nothing "
        "(none: a frozen model)."))
    lora: LoraSettings = Field(default_factory=LoraSettings, description=(
        "LoRA's settings (with peft: lora)."))
    prefix_tokens: int = Field(40, ge=1, description=(
        "Prefix tuning: the number of virtual tokens (the prompt length)."))
    prefix_init: Literal["random", "text"] = Field("random", description=(
        "peft: prefix only. random: peft's random prefix; text: the model's own keys/values of "
        "the first prefix_tokens tokens of the public split (the same on server and clients), so "
        "the model starts as if that text preceded every input (FedSP: method.prompt_init)."))
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field("auto", description=(
        "Mixed precision of training, scoring and generation (torch.autocast; weights, adapters "
        "and optimiser state stay fp32). auto: bf16 on a CPU with native bf16 (AVX512-BF16/AMX) "
        "or a CUDA GPU that supports it, else fp32. fp16 needs CUDA (see fedkt/precision.py)."))
    gradient_checkpointing: bool = Field(False, description=(
        "Recompute each decoder layer's activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing, non-reentrant): activation memory of training "
        "falls from all layers' to about one layer's, for about a third more compute per step; "
        "the numbers stay the same (docs/performance.md, memory). Causal LMs only."))

    @model_validator(mode="after")
    def _checkpointing_fits_peft(self) -> TrainingConfig:
        if self.gradient_checkpointing and self.peft == "prefix":
            raise ValueError("gradient_checkpointing: prefix tuning passes its virtual tokens "
                             "as a key/value cache, which transformers drops under gradient "
                             "checkpointing; use peft: lora, or turn it off")
        return self

    @property
    def prefix_from_text(self) -> bool:
        """Prefix tuning that starts from text (``peft: prefix``, ``prefix_init: text``)."""
        return self.peft == "prefix" and self.prefix_init == "text"


class ClientsConfig(_Strict):
    num_clients: int = Field(4, ge=1, description=(
        "How many clients the private data is split among."))
    models: list[ModelConfig] = Field(default_factory=list, description=(
        "One model for all clients, or one per client (heterogeneous settings)."))
    fraction: float = Field(1.0, gt=0, le=1, description=(
        "Share of the clients taking part in each round, sampled uniformly without replacement "
        "from (seed, round), at least one (FedAvg's C; 1.0: all)."))
    min_replies: int | None = Field(None, ge=1, description=(
        "The round fails unless at least this many clients reply."))
    participants: list[int] | None = Field(None, description=(
        "Only these client ids take part (None: all); the data is still split num_clients ways, "
        "so each participant's private data is the same as in the full run."))

    @model_validator(mode="after")
    def _models_match(self) -> ClientsConfig:
        if len(self.models) not in (0, 1, self.num_clients):
            raise ValueError(
                f"'models' has {len(self.models)} entries; give 1 (shared by all clients) "
                f"or num_clients={self.num_clients} (one per client)"
            )
        if self.participants is not None:
            ids = self.participants
            bad = sorted({c for c in ids if not 0 <= c < self.num_clients})
            dup = sorted({c for c in ids if ids.count(c) > 1})
            if not ids or bad or dup:
                raise ValueError(
                    f"'participants' {ids} must list unique client ids in 0..{self.num_clients - 1} "
                    f"(num_clients={self.num_clients}); "
                    + (f"out of range: {bad}" if bad else f"repeated: {dup}" if dup else "empty")
                )
        return self

    def model_for(self, cid: int) -> ModelConfig:
        if not self.models:
            raise ConfigError("clients.models: this method needs a client model")
        return self.models[0] if len(self.models) == 1 else self.models[cid]


# The built-in runtimes' sections (runtime.flower_sim, runtime.flower) are their settings
# models, registered with their runtimes (fedkt.runtime.registry); the flat keys of before
# the sections (runtime.client_cpus, ...) move into these.
_MOVED_SECTIONS = ("flower_sim", "flower")


class ReplyLimits(_Strict):
    """Bounds on what one client may send back (``runtime.limits``); a reply over a bound
    excludes that client with the bound's key in its reason (docs/security.md)."""

    reply_bytes: int = Field(2**30, ge=1024, description=(
        "Largest reply in bytes, as serialised (tensors included)."))
    predictions_bytes: int = Field(2**24, ge=1024, description=(
        "Largest decompressed size of a reply's per-example predictions (``_predictions``); a "
        "larger table is dropped with a warning (a gzip bomb stops here)."))
    num_examples: int = Field(10**7, ge=1, description=(
        "Largest ``num_examples`` a client may report (its weight in example-weighted means)."))
    metrics: int = Field(256, ge=1, description=(
        "Most metrics (``metrics`` and ``*_seconds`` timings together) in one reply."))
    norm_ratio: float = Field(1000.0, gt=1, description=(
        "An aggregated upload (adapter, update, prompts) whose L2 norm is more than this many "
        "times the median of the round's uploads excludes its client (a finite but huge "
        "upload would poison the mean); not checkable under secure aggregation."))


class RuntimeConfig(_Strict):
    """Transport: ``name`` is a registered runtime (``local``, ``flower-sim``, ``flower``,
    or one :func:`~fedkt.runtime.registry.register_runtime` adds).

    ``timeout``, ``torch_threads`` and ``device`` apply to every transport; a runtime's own
    settings are its section, ``runtime.<name with - as _>`` (``flower_sim``, ``flower``),
    validated by the model it registered.  A config's ``runtime`` is an instance of
    :func:`runtime_config_class`: this class with those sections as fields.
    """

    name: str = Field("local", description=(
        "The runtime that runs the job (fedkt.runtime.registry)."))
    timeout: float = Field(3600.0, gt=0, description=(
        "Seconds to wait for a client's reply before excluding it."))
    torch_threads: int | None = Field(None, ge=1, description=(
        "torch intra-op threads for client and server work (None: one per physical core, or "
        "$OMP_NUM_THREADS when set)."))
    device: str = Field("auto", description=(
        "Where the server's work runs: auto (a CUDA GPU if there is one, else the CPU), cpu, cuda "
        "or cuda:N."))
    client_devices: list[str] | None = Field(None, min_length=1, description=(
        "local runtime: client k runs on client_devices[k % len] (round-robin over GPUs, e.g. "
        "[cuda:1, cuda:2]); None: runtime.device. A client model's own `device` wins."))
    limits: ReplyLimits = Field(default_factory=ReplyLimits, description=(
        "What a client's reply may hold at most (server side)."))
    aggregation: Literal["mean", "median"] = Field("mean", description=(
        "How the server combines the clients' uploads (adapters, updates, prompts) after the "
        "norm check (runtime.limits.norm_ratio). mean: FedAvg, weighted as the method says. "
        "median: the coordinate-wise median, unweighted, which no single client can move "
        "far (robust to a minority of poisoned uploads; not with secure_aggregation)."))
    # The runtimes' sections this class holds: section -> runtime name.
    sections: ClassVar[dict[str, str]] = {}

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        from fedkt.runtime.registry import available_runtimes, unknown_runtime

        if value not in available_runtimes():
            raise ValueError(unknown_runtime(value))
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by value: a class made by :func:`runtime_config_class` has no import path."""
        return _runtime_from_dump, (self.model_dump(), type(self) is RuntimeConfig)

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        return _check_device(value) or value

    @field_validator("client_devices")
    @classmethod
    def _client_device_names(cls, value: list[str] | None) -> list[str] | None:
        for i, name in enumerate(value or []):
            _check_device(name, f"entry {i}: ")
        return value

    @model_validator(mode="after")
    def _client_devices_local(self) -> RuntimeConfig:
        if self.client_devices and self.name != "local":
            raise ValueError(f"client_devices: only the local runtime places clients itself; "
                             f"{self.name} runs each client in its own process (flower-sim: "
                             "runtime.flower_sim.client_gpus; flower: each SuperNode's "
                             "runtime.device)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, values: Any) -> Any:
        """The flat keys of before the sections (``runtime.client_cpus``, ...) still work:
        each moves into its section, with a FutureWarning naming the new key."""
        if not isinstance(values, dict):
            return values
        from fedkt.runtime.registry import runtime_sections

        models = {section: model for section, (_, model) in runtime_sections().items()
                  if section in _MOVED_SECTIONS and section in cls.model_fields}
        moved = {key: section for key in values if key not in cls.model_fields
                 for section, model in models.items() if key in model.model_fields}
        if not moved:
            return values
        values = dict(values)
        for key, section in moved.items():
            given = values.get(section)
            if isinstance(given, BaseModel):
                given = given.model_dump(exclude_unset=True)
            if given is None:
                given = {}
            elif not isinstance(given, dict):
                continue  # the section itself is invalid; validation names it
            new = f"runtime.{section}.{key}"
            if key in given:
                raise ValueError(f"{section}.{key}: given twice, as runtime.{key} (the old "
                                 f"key) and as {new}; keep only {new}")
            warnings.warn(f"runtime.{key} is now {new}", FutureWarning, stacklevel=1)
            values[section] = {**given, key: values.pop(key)}
        return values


def _doc(model: type[BaseModel]) -> str:
    """A settings model's description: the first paragraph of its docstring."""
    text = (model.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(text.split()) or f"The settings of {model.__name__}."


@functools.cache
def _runtime_class(sections: tuple[tuple[str, str, type[BaseModel]], ...]
                   ) -> type[RuntimeConfig]:
    if not sections:
        return RuntimeConfig
    taken = [s for s, _, _ in sections if s in RuntimeConfig.model_fields]
    if taken:
        raise ConfigError(f"runtime.{taken[0]}: a runtime's settings section may not be named "
                          "as a key every runtime has; rename the runtime")
    cls = create_model(
        "RuntimeConfig", __base__=RuntimeConfig, __module__=__name__,
        **{section: (model, Field(default_factory=model, description=_doc(model)))
           for section, _, model in sections})
    cls.sections = {section: name for section, name, _ in sections}
    return cls


def runtime_config_class(values: dict[str, Any] | None = None) -> type[RuntimeConfig]:
    """:class:`RuntimeConfig` with the sections of the runtimes registered now: every
    built-in runtime's, and that of the runtime ``values`` names or whose section it gives
    (so a config that does not use a plugin runtime never carries its section)."""
    from fedkt.runtime.registry import BUILT_IN, runtime_sections

    values = values or {}
    wanted = {section for section, (name, _) in runtime_sections().items()
              if name in BUILT_IN or name == values.get("name") or section in values}
    return _runtime_class(tuple((section, name, model) for section, (name, model)
                                in runtime_sections().items() if section in wanted))


def _runtime_from_dump(data: dict[str, Any], plain: bool) -> RuntimeConfig:
    cls = RuntimeConfig if plain else runtime_config_class(data)
    return cls.model_validate(data)


class SecureAggregationConfig(_Strict):
    """Flower's SecAgg+ on every runtime: the server learns only the clients' weighted mean.

    Applies to methods whose server sums client uploads (adapters, updates, prompts).
    """

    enabled: bool = Field(False, description=(
        "Sum the clients' uploads by SecAgg+: the server sees only their (weighted) mean."))
    num_shares: int | float = Field(1.0, gt=0, description=(
        "Neighbours each client shares its secrets with: an int > 2, or a fraction of the clients "
        "in the round (1.0: all, i.e. SecAgg)."))
    reconstruction_threshold: int | float = Field(0.5, gt=0, description=(
        "Shares needed to rebuild a dropped client's mask: an int, or a fraction of num_shares. "
        "Higher: more privacy against colluding clients, less tolerance to dropouts."))
    clipping_range: float = Field(8.0, gt=0, description=(
        "Each value (times weight / max_weight) is clipped to [-clipping_range, clipping_range] "
        "and quantised to quantization_range levels before masking."))
    quantization_range: int = Field(2**22, gt=0, description=(
        "Levels each clipped value is quantised to before masking."))
    modulus_range: int = Field(2**32, gt=0, description=(
        "The modulus of the masked sums: a power of 2 above quantization_range."))
    max_weight: float = Field(1000.0, gt=0, description=(
        "The largest client weight (examples); larger weights overflow."))

    @model_validator(mode="after")
    def _flower_checks(self) -> SecureAggregationConfig:
        if self.modulus_range <= self.quantization_range or self.modulus_range & (
                self.modulus_range - 1):
            raise ValueError("modulus_range must be a power of 2 above quantization_range")
        if isinstance(self.num_shares, int) and self.num_shares != 1 and self.num_shares <= 2:
            raise ValueError("num_shares as an integer must be > 2 (or a fraction of clients)")
        if isinstance(self.num_shares, float) and self.num_shares > 1:
            raise ValueError("num_shares as a fraction must be in (0, 1]")
        if isinstance(self.reconstruction_threshold, float) and self.reconstruction_threshold > 1:
            raise ValueError("reconstruction_threshold as a fraction must be in (0, 1]")
        if (isinstance(self.num_shares, int) and isinstance(self.reconstruction_threshold, int)
                and self.num_shares > 2 and self.reconstruction_threshold >= self.num_shares):
            raise ValueError("reconstruction_threshold must be below num_shares")
        return self


class DifferentialPrivacyConfig(_Strict):
    """Client-side Gaussian mechanism on each upload: clip the change to clip_norm (L2),
    add N(0, (noise_multiplier * clip_norm)^2) noise; epsilon reported per round."""

    enabled: bool = Field(False, description=(
        "Clip each client's upload and add Gaussian noise before it leaves the client."))
    clip_norm: float = Field(1.0, gt=0, description=(
        "The L2 bound each upload's change is clipped to."))
    noise_multiplier: float = Field(1.0, gt=0, description=(
        "The noise's standard deviation, in units of clip_norm."))
    delta: float = Field(1e-5, gt=0, lt=1, description=(
        "The delta of the (epsilon, delta) guarantee reported per round."))
    noise: Literal["local", "distributed"] = Field("local", description=(
        "local: every client adds the full noise (a guarantee for each upload, even against the "
        "server). distributed: each adds it divided by sqrt(m), m = the fewest clients a round's "
        "sum may hold (clients.min_replies, else the clients per round), so the securely "
        "aggregated sum carries the full noise; needs secure_aggregation (docs/security.md says "
        "which guarantee holds against which party)."))


# Group names whose accuracy_<name> is an existing metric (accuracy_norm).
_GROUP_NAMES_TAKEN = ("norm",)


class EvalConfig(_Strict):
    every: int = Field(1, ge=1, description="Evaluate every N rounds (the last round always).")
    batch_size: int = Field(8, ge=1, description="Test examples scored per forward pass.")
    max_new_tokens: int = Field(48, ge=1, description=(
        "Generation tasks: tokens generated per example."))
    positive_label: int = Field(1, description=(
        "Classification metrics: the positive class (binary P/R/F1)."))
    clients: bool = Field(True, description=(
        "Evaluate clients' models too (every evaluation round)."))
    predictions: bool = Field(True, description=(
        "Write each evaluation's per-example predictions (predictions/round_NNNN/*.json.gz), "
        "which `fedkt report --baseline` and suites pair for confidence intervals."))
    reuse: bool = Field(True, description=(
        "Compute nothing twice: an evaluation whose model weights and adapter, test items, scorer "
        "settings, precision and fedkt code were all seen before reuses the stored metrics and "
        "predictions (within a run, across a suite's arms and across suites, through "
        "$FEDKT_CACHE/reuse); so does a model's knowledge on a fixed public set (FedMKT's top-K "
        "logits, choice posteriors, KOALA's teacher logits). The rows are the same either way but "
        "for timings: a reuse reports the seconds it spared as eval_saved_seconds / "
        "knowledge_saved_seconds. docs/performance.md says what the key covers."))
    plots: bool = Field(True, description=(
        "Draw the run's curves (plots/*.png: one figure per metric, about 0.1 s each) when it "
        "ends; off for sweeps and tests that only read metrics.jsonl."))
    round0: bool | None = Field(None, description=(
        "Evaluate every participant before any training, as round 0 (the zero-shot row). None: on "
        "for every method but zero_shot (whose round 1 is that evaluation)."))
    harness: list[str] = Field(default_factory=list, description=(
        "lm-evaluation-harness tasks run on the final models after the last round (extra "
        "fedkt[harness]; results in RUN_DIR/harness/), e.g. [fedkt_intent_recognition]."))
    harness_clients: bool = Field(False, description=(
        "Run the eval.harness tasks on every client's model too (else the server's only)."))
    harness_include: str | None = Field(None, description=(
        "A folder of your own lm-eval task YAMLs."))
    harness_limit: int | float | None = Field(None, gt=0, description=(
        "The first N documents of each harness task (a fraction if < 1); None: all."))
    compare_round0: bool = Field(False, description=(
        "After the run, print each participant's main metric at round 0 and at the end, with the "
        "paired bootstrap 95% CI of the change (needs round0 and predictions)."))
    class_groups: dict[str, ClassSpec] = Field(default_factory=dict, description=(
        'Groups of classes, name -> classes ("0-2", "3,4", a list): every classification and '
        "multiple-choice evaluation also reports accuracy_<name>, the accuracy over the test "
        "items whose gold class is in the group (suites pair it over those items only)."))

    @field_validator("class_groups")
    @classmethod
    def _group_names(cls, groups: dict[str, ClassSpec]) -> dict[str, ClassSpec]:
        for name, spec in groups.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
                raise ValueError(f"group name {name!r} must be a letter then "
                                 "letters, digits or '_' (it names the metric accuracy_<name>)")
            if name in _GROUP_NAMES_TAKEN:
                raise ValueError(f"group name {name!r} would report "
                                 f"accuracy_{name}, which is already a metric; rename it")
            _check_class_spec(spec, name)
        return groups

    @field_validator("compare_round0")
    @classmethod
    def _compare_needs_round0(cls, value: bool, info: ValidationInfo) -> bool:
        off = [k for k in ("round0", "predictions") if value and info.data.get(k) is False]
        if off:
            raise ValueError(f"compares round 0 with the last round from their per-example "
                             f"predictions; it needs eval.{off[0]}: true")
        return value


# Tracking backends: the package each needs and the extra that installs it.
TRACKING_BACKENDS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "fedkt[tensorboard]"),
    "mlflow": ("mlflow", "fedkt[mlflow]"),
}


class MLflowSettings(_Strict):
    uri: str | None = Field(None, description=(
        "Tracking URI (a local folder, file:, sqlite:, http(s)://). None: $MLFLOW_TRACKING_URI, "
        "else a local file store beside the run folder (RUN_DIR/../mlruns; a suite: its folder)."))
    experiment: str | None = Field(None, description=(
        "Experiment the run is logged to. None: the run's name (a suite: the suite's name)."))


class TensorBoardSettings(_Strict):
    dir: str | None = Field(None, description=(
        "Folder of the event files. None: RUN_DIR/tensorboard (a suite: SUITE/tensorboard/ARM/ "
        "seed_N, so `tensorboard --logdir SUITE/tensorboard` shows every run)."))


class TrackingConfig(_Strict):
    """Experiment trackers that mirror the run: every metrics.jsonl row, the resolved
    config and the final summary (``tracking: [tensorboard, mlflow]`` is short for
    ``tracking: {backends: [...]}``; docs/evaluation.md)."""

    backends: list[Literal["tensorboard", "mlflow"]] = Field(default_factory=list, description=(
        'Backends to mirror to, each an optional extra (pip install "fedkt[mlflow]").'))
    run_name: str | None = Field(None, description=(
        "The tracking run's name. None: the run's name (a suite: ARM/seed_N)."))
    tags: dict[str, str] = Field(default_factory=dict, description=(
        "Tags of the tracking run (MLflow tags; a text entry in TensorBoard). A suite adds suite, "
        "arm and seed."))
    mlflow: MLflowSettings = Field(default_factory=MLflowSettings, description=(
        "MLflow's settings (backend mlflow)."))
    tensorboard: TensorBoardSettings = Field(default_factory=TensorBoardSettings, description=(
        "TensorBoard's settings (backend tensorboard)."))

    @model_validator(mode="before")
    @classmethod
    def _list_of_backends(cls, values: Any) -> Any:
        if isinstance(values, list | str):
            return {"backends": [values] if isinstance(values, str) else values}
        return values

    @field_validator("backends")
    @classmethod
    def _installed(cls, backends: list[str], info: ValidationInfo) -> list[str]:
        """Each backend's package must be importable where the run's server starts
        (clients never track: they skip this check)."""
        import importlib.util

        if len(set(backends)) != len(backends):
            raise ValueError(f"{backends} names a backend twice")
        if (info.context or {}).get("check_installed", True):
            for name in backends:
                module, extra = TRACKING_BACKENDS[name]
                if importlib.util.find_spec(module) is None:
                    raise ValueError(f"{name} is not installed: pip install \"{extra}\"")
        return backends


class MethodConfig(_Strict):
    """Base of every method's hyper-parameters; ``name`` selects the method."""

    name: str = Field(description=(
        "The method that runs (`fedkt list` shows the registered ones); the other method.* keys "
        "are its hyper-parameters."))
    # Settings that were renamed, old key -> new key: a config with the old key still
    # loads, with a FutureWarning naming the new one (docs/architecture.md, vocabulary).
    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        for old, new in cls.renamed.items():
            if old not in values:
                continue
            if new in values:
                raise ValueError(f"{old}: it was renamed {new}, which is also given; "
                                 f"keep only {new}")
            warnings.warn(f"method.{old} is now method.{new}", FutureWarning, stacklevel=1)
            values = {k if k != old else new: v for k, v in values.items()}
        return values


def _validate_method(method: str | dict[str, Any]) -> MethodConfig:
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
    seed: int = Field(0, description=(
        "Seeds data splits, model initialisation and every round's server and client work: the "
        "same seed and config give the same numbers."))
    rounds: int = Field(3, ge=1, description="Federated rounds.")
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
        if folds is not None and not 0 <= self.seed < folds:
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

