"""Where each participant's model runs: a device per participant, accelerate device maps.

* :func:`server_device` / :func:`client_device`: the device of the server's model and of
  client ``cid``'s (``server.device``; ``clients.models[i].device``, else round-robin over
  ``runtime.client_devices`` in the local runtime, else ``runtime.device``);
* :func:`loader_kwargs`: what ``from_pretrained`` is given so that a model lands where it
  runs: bitsandbytes quantisation (``model.quantization``) and accelerate's
  ``device_map`` (``model.device_map: auto`` spreads a model over every visible GPU);
* :func:`placed_by_loader`: whether the loader placed the model itself (then nobody may
  ``.to()`` it: a quantised or device-mapped model stays where it was put);
* :func:`pick_device`: ``runtime.device`` (``auto``: the GPU when there is one) -> a
  torch device;
* :func:`plan_device_map`: the device map accelerate would give a model config under a
  memory budget, computed on the meta device (no weights), for planning and tests.

Every other ``.to(device)`` in fedkt moves inputs to the device of the model they go
into (``next(model.parameters()).device``) or results to the CPU, so it follows these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from fedkt.config import ModelConfig, RunConfig

__all__ = ["client_device", "loader_kwargs", "pick_device", "placed_by_loader",
           "plan_device_map", "server_device"]


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: the GPU when there is one, else the CPU; otherwise the device named."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def server_device(cfg: RunConfig) -> str:
    """The server model's device: ``server.device``, else ``runtime.device``."""
    if cfg.server is not None and cfg.server.device is not None:
        return cfg.server.device
    return cfg.runtime.device


def client_device(cfg: RunConfig, cid: int) -> str:
    """Client ``cid``'s device: its model's ``device``, else ``runtime.client_devices[cid %
    len]`` (round-robin), else ``runtime.device``."""
    models = cfg.clients.models
    if models:
        own = cfg.clients.model_for(cid).device
        if own is not None:
            return own
    devices = cfg.runtime.client_devices
    if devices:
        return devices[cid % len(devices)]
    return cfg.runtime.device


def bnb_config(model_cfg: ModelConfig) -> Any:
    """transformers' ``BitsAndBytesConfig`` for ``model_cfg.quantization``."""
    import torch
    from transformers import BitsAndBytesConfig

    q = model_cfg.quantization
    assert q is not None
    if q.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.quant_type,
                              bnb_4bit_use_double_quant=q.double_quant,
                              bnb_4bit_compute_dtype=getattr(torch, q.compute_dtype or model_cfg.dtype))


def loader_kwargs(model_cfg: ModelConfig, device: str | torch.device | None) -> dict[str, Any]:
    """``from_pretrained`` keywords that quantise and place the model (empty: load as
    before, on the CPU, and let the caller move it)."""
    kwargs: dict[str, Any] = {}
    if model_cfg.quantization is not None:
        kwargs["quantization_config"] = bnb_config(model_cfg)
    if model_cfg.device_map is not None:
        kwargs["device_map"] = model_cfg.device_map
    elif kwargs:  # a quantised model is created on its device (it cannot move afterwards)
        kwargs["device_map"] = {"": str(pick_device(str(device or "auto")))}
    return kwargs


def placed_by_loader(model: Any) -> bool:
    """Whether ``model`` (peft-wrapped or not) was quantised or device-mapped on load."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return bool(getattr(base, "is_quantized", False) or getattr(base, "hf_device_map", None))


def plan_device_map(model_cfg: ModelConfig, max_memory: dict[int | str, int | str],
                    config: Any = None) -> dict[str, int | str]:
    """accelerate's device map for ``model_cfg`` (or a transformers ``config``) under
    ``max_memory`` ({0: "20GiB", 1: "20GiB", "cpu": "60GiB"}), from an empty (meta-device)
    model: which decoder layers would go on which device, without loading a weight."""
    import torch
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype: torch.dtype = getattr(torch, model_cfg.dtype)
    if config is None:
        config = AutoConfig.from_pretrained(model_cfg.name, revision=model_cfg.revision,
                                            trust_remote_code=model_cfg.trust_remote_code)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    no_split = getattr(model, "_no_split_modules", None) or []
    return dict(infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split,
                                      dtype=dtype))
