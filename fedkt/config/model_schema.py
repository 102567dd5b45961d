"""The model sections (``server``, ``clients.models``): :class:`ModelConfig`, LoRA's and
quantisation's settings, and the device check the runtime section shares."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from fedkt.config.base import _Strict
from fedkt.config.bounds import Layers, LearningRate

__all__ = ["LoraSettings", "ModelConfig", "QuantizationSettings"]


class LoraSettings(_Strict):
    """LoRA through ``peft`` (FedMKT paper defaults: r=8, alpha=16, dropout 0.05)."""

    r: int = Field(8, ge=1, le=65_536, description=(
        "LoRA rank (the inner dimension of each low-rank update)."))
    alpha: int = Field(16, ge=1, le=65_536, description=(
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
    num_layers: Layers | None = Field(None, description=(
        "Keep only the first N decoder layers of the loaded model (pruned, not retrained): a "
        "smaller model derived from a pretrained one. None keeps every layer."))
    lr: LearningRate | None = Field(None, description=(
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
