"""FedSP's auxiliary model: an LLM cut down to N layers that are reused L times.

Dong et al., "Tunable Soft Prompts are Messengers in Federated Learning", EMNLP
Findings 2023, Sec. 3.  The server keeps its LLM (L decoder layers) and builds a
small model of the *same class* from

* N of the LLM's decoder layers, taken from the bottom, middle or top of the stack
  (:func:`choose_layers`),
* the LLM's embeddings, final norm and LM head,

and, with cross-layer parameter sharing, a decoder layer list of L *virtual* layers
that refer to the N real ones cyclically (virtual layer i runs real layer ``i mod N``,
as the reference implementation repeats its block of N layers).  The auxiliary
model therefore has the LLM's depth: peft's prefix tuning gives it L prefixes of the
LLM's shape (``num_virtual_tokens x L * 2 * kv_dim``), and the same soft prompts plug
into both models.  Without sharing the auxiliary model has depth N and only the
prefixes of the LLM layers it was cut from (:attr:`AuxSpec.slots`).

Each virtual layer keeps its own KV-cache slot: before it runs, :class:`VirtualLayer`
sets ``layer_idx`` of the shared layer's attention to its own index, so the cache
(and thus peft's prefix of that layer) is read and written at the virtual position.
This works with any architecture whose attention indexes the cache by ``layer_idx``
(Llama, Qwen2, SmolLM2 with grouped-query attention; GPT-2; OPT), without patching
attention.

What a client receives is :func:`cut_state` (only the chosen layers, embeddings,
final norm and head, tied weights once), the LLM's config and the
:class:`AuxSpec`; :func:`build_auxiliary` rebuilds the model from them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from fedkt.models.offline import ModelError

__all__ = [
    "AuxSpec",
    "VirtualLayer",
    "aux_param_groups",
    "aux_state",
    "build_auxiliary",
    "choose_layers",
    "config_dict",
    "cut_state",
    "layer_list_path",
    "make_spec",
    "prompts_for_aux",
    "prompts_into_llm",
    "prompts_repeated",
    "prompts_averaged",
    "unwrap",
]

Position = Literal["bot", "mid", "top"]

# Where causal LMs keep their decoder layer list, tried in this order.
LAYER_PATHS: tuple[str, ...] = (
    "model.layers",            # Llama, Qwen2, Mistral, Gemma, SmolLM2
    "transformer.h",           # GPT-2, BLOOM, GPT-J
    "model.decoder.layers",    # OPT
    "gpt_neox.layers",         # GPT-NeoX / Pythia
)
SHARED = "shared_layers"  # attribute that holds the N real layers of a shared model


@dataclass(frozen=True)
class AuxSpec:
    """How an auxiliary model relates to its LLM.

    ``source_layers``: the LLM indices of the N real layers; ``llm_depth``: L;
    ``shared``: cross-layer parameter sharing (depth L) or not (depth N).
    """

    source_layers: tuple[int, ...]
    llm_depth: int
    shared: bool = True

    @property
    def num_real(self) -> int:
        return len(self.source_layers)

    @property
    def depth(self) -> int:
        """Number of (virtual) decoder layers the auxiliary model runs."""
        return self.llm_depth if self.shared else self.num_real

    @property
    def mapping(self) -> tuple[int, ...]:
        """Virtual layer i -> index of the real layer it runs (cyclic: ``i mod N``)."""
        return tuple(i % self.num_real for i in range(self.depth))

    @property
    def slots(self) -> tuple[int, ...]:
        """Virtual layer i -> the LLM layer whose prefix it uses."""
        return tuple(range(self.llm_depth)) if self.shared else self.source_layers

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "source_layers": list(self.source_layers)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuxSpec:
        try:
            spec = cls(tuple(int(i) for i in data["source_layers"]), int(data["llm_depth"]),
                       bool(data["shared"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"malformed auxiliary-model spec {data!r}: {exc}") from None
        if not spec.source_layers or not all(0 <= i < spec.llm_depth for i in spec.source_layers):
            raise ModelError(f"auxiliary-model spec {data!r}: layers outside 0..{spec.llm_depth - 1}")
        return spec


def choose_layers(llm_depth: int, n: int, position: Position) -> tuple[int, ...]:
    """N consecutive LLM layers from the bottom, middle or top of the stack."""
    if not 1 <= n <= llm_depth:
        raise ModelError(f"aux_layers = {n}: must be between 1 and the LLM's {llm_depth} layers")
    start = {"bot": 0, "mid": (llm_depth - n) // 2, "top": llm_depth - n}.get(position)
    if start is None:
        raise ModelError(f"layer_position {position!r}: allowed bot, mid, top")
    return tuple(range(start, start + n))


def make_spec(llm_depth: int, n: int, position: Position, shared: bool = True) -> AuxSpec:
    return AuxSpec(choose_layers(llm_depth, n, position), llm_depth, shared)


# --------------------------------------------------------------------------- modules


def unwrap(model: nn.Module) -> PreTrainedModel:
    """The Hugging Face model inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _get(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def layer_list_path(model: nn.Module) -> str:
    """Dotted path of the decoder layer list (``model.layers``, ``transformer.h``, ...)."""
    model = unwrap(model)
    for path in LAYER_PATHS:
        if isinstance(_get(model, path), nn.ModuleList):
            return path
    raise ModelError(f"{type(model).__name__}: no decoder layer list at any of {LAYER_PATHS}; "
                     "FedSP's auxiliary model supports Llama/Qwen2/GPT-2/OPT-style models")


class VirtualLayer(nn.Module):
    """One of the L positions of a shared model: runs a real layer under its own index.

    The real layer is a plain reference (not a sub-module), so its parameters are
    registered once, under ``shared_layers``.  Attributes the model's forward reads
    from a layer (``attention_type``, ...) are looked up on the real layer.
    """

    def __init__(self, layer: nn.Module, index: int) -> None:
        super().__init__()
        self.__dict__["_layer"] = layer
        self.__dict__["_indexed"] = [m for m in layer.modules() if hasattr(m, "layer_idx")]
        self.index = index

    @property
    def layer(self) -> nn.Module:
        return self.__dict__["_layer"]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        for module in self.__dict__["_indexed"]:
            module.layer_idx = self.index  # this position's KV-cache slot (and prefix)
        return self.layer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_layer"], name)

    def extra_repr(self) -> str:
        return f"index={self.index}, runs={type(self.layer).__name__}@{id(self.layer):#x}"


def config_dict(model: nn.Module) -> dict[str, Any]:
    """The model's config as JSON-able data (what a client needs to rebuild the class)."""
    return json.loads(unwrap(model).config.to_json_string(use_diff=False))


def _dedup(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop tied duplicates (the same storage under two names); the first name stays."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = {}
    for key, value in state.items():
        tag = (value.untyped_storage().data_ptr(), tuple(value.shape)) if value.numel() else None
        if tag is not None and tag in seen:
            continue
        if tag is not None:
            seen.add(tag)
        out[key] = value
    return out


def cut_state(llm: nn.Module, spec: AuxSpec) -> dict[str, torch.Tensor]:
    """The LLM's weights a client may see: the chosen layers (renumbered 0..N-1),
    embeddings, final norm and head; tied weights once.  Copies, on the CPU."""
    base = unwrap(llm)
    path = layer_list_path(base)
    if len(_get(base, path)) != spec.llm_depth:
        raise ModelError(f"spec is for {spec.llm_depth} layers, the LLM has {len(_get(base, path))}")
    out: dict[str, torch.Tensor] = {}
    for key, value in _dedup(base.state_dict()).items():
        if key.startswith(path + "."):
            idx, rest = key[len(path) + 1:].split(".", 1)
            if int(idx) not in spec.source_layers:
                continue
            key = f"{path}.{spec.source_layers.index(int(idx))}.{rest}"
        out[key] = value.detach().to("cpu").clone().contiguous()
    return out


def build_auxiliary(config: dict[str, Any], state: dict[str, torch.Tensor], spec: AuxSpec,
                    dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Rebuild the auxiliary model from the LLM's config, :func:`cut_state` and the spec.

    The result is a model of the LLM's class with ``config.num_hidden_layers ==
    spec.depth``; with sharing its layer list holds :class:`VirtualLayer` s over the
    N real layers in ``<layers' parent>.shared_layers``.
    """
    cfg = AutoConfig.for_model(**config)
    layer_types = getattr(cfg, "layer_types", None)
    cfg.num_hidden_layers = spec.num_real
    if isinstance(layer_types, list) and len(layer_types) == spec.llm_depth:
        cfg.layer_types = [layer_types[i] for i in spec.source_layers]
    with torch.random.fork_rng(devices=[]):  # random init is overwritten; keep callers' RNG
        model = AutoModelForCausalLM.from_config(cfg)
    if dtype is None:
        dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    model = model.to(dtype)
    result = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    untied = [k for k in result.missing_keys
              if not any(params.get(k) is params.get(j) for j in state if j in params)]
    if untied or result.unexpected_keys:
        raise ModelError(f"auxiliary-model weights do not match the config: missing {untied[:5]}, "
                         f"unexpected {list(result.unexpected_keys)[:5]}")
    path = layer_list_path(model)
    parent_path, _, attr = path.rpartition(".")
    parent = _get(model, parent_path) if parent_path else model
    if spec.shared:
        real = getattr(parent, attr)
        setattr(parent, SHARED, real)
        setattr(parent, attr, nn.ModuleList(VirtualLayer(real[j], i)
                                            for i, j in enumerate(spec.mapping)))
        model.config.num_hidden_layers = spec.depth
        if isinstance(layer_types, list) and len(layer_types) == spec.llm_depth:
            model.config.layer_types = [layer_types[spec.source_layers[j]] for j in spec.mapping]
    model.fedsp_spec = spec
    model.eval()
    return model


def aux_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The auxiliary model's weights under :func:`cut_state` names (CPU copies)."""
    base = unwrap(model)
    path = layer_list_path(base)
    shared = path.rpartition(".")[0] + ("." if "." in path else "") + SHARED + "."
    out = {}
    for key, value in _dedup(base.state_dict()).items():
        if key.startswith(shared):
            key = path + "." + key[len(shared):]
        out[key] = value.detach().to("cpu").clone().contiguous()
    return out


def aux_param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """``layers``: the N real layers and the final norm; ``embeddings``: token/position
    embeddings and the head (tied weights once)."""
    base = unwrap(model)
    emb_ids: set[int] = set()
    out_emb = base.get_output_embeddings()
    for module in [*base.modules(), out_emb]:
        if isinstance(module, nn.Embedding) or (module is not None and module is out_emb):
            emb_ids.update(id(p) for p in module.parameters())
    groups: dict[str, list[nn.Parameter]] = {"layers": [], "embeddings": []}
    for param in base.parameters():  # deduplicated: shared layers and tied weights once
        groups["embeddings" if id(param) in emb_ids else "layers"].append(param)
    return groups


def count(params: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


# --------------------------------------------------------------------------- prompts


def _per_layer(prompts: torch.Tensor, depth: int) -> int:
    if prompts.dim() != 2 or prompts.shape[1] % depth:
        raise ModelError(f"prompts of shape {tuple(prompts.shape)} do not split into {depth} layers")
    return prompts.shape[1] // depth


def prompts_for_aux(llm_prompts: torch.Tensor, spec: AuxSpec) -> torch.Tensor:
    """The LLM's prompts ``[T, L * 2 * kv_dim]`` as the auxiliary model's (same with sharing)."""
    per = _per_layer(llm_prompts, spec.llm_depth)
    if spec.slots == tuple(range(spec.llm_depth)):
        return llm_prompts.detach().clone()
    view = llm_prompts.detach().reshape(llm_prompts.shape[0], spec.llm_depth, per)
    return view[:, list(spec.slots)].reshape(llm_prompts.shape[0], -1).clone()


def prompts_into_llm(llm_prompts: torch.Tensor, aux_prompts: torch.Tensor, spec: AuxSpec
                     ) -> torch.Tensor:
    """Write the auxiliary model's prompts into the LLM's (the slots it covers)."""
    per = _per_layer(llm_prompts, spec.llm_depth)
    if tuple(aux_prompts.shape) != (llm_prompts.shape[0], per * spec.depth):
        raise ModelError(f"auxiliary prompts of shape {tuple(aux_prompts.shape)}, expected "
                         f"{(llm_prompts.shape[0], per * spec.depth)}")
    out = llm_prompts.detach().clone().reshape(llm_prompts.shape[0], spec.llm_depth, per)
    out[:, list(spec.slots)] = aux_prompts.detach().reshape(aux_prompts.shape[0], spec.depth, per
                                                            ).to(out.dtype)
    return out.reshape(llm_prompts.shape)


# The reference implementation's rule for prompts of different widths (FederatedScope
# ``fedsp`` branch, ``trainer/utils.py: merge_param_dict``): a client model with fewer
# layers than the LLM holds prompts ``[T, n * 2 * kv_dim]``; on upload the server tiles
# them along the width until they cover its L layers, on download it averages the L / n
# blocks of its own prompts.


def _blocks(wide: int, narrow: int) -> int:
    if narrow <= 0 or wide % narrow:
        raise ModelError(f"prompt widths {wide} and {narrow}: the LLM's must be a multiple of "
                         "the client model's (its depth must divide the LLM's)")
    return wide // narrow


def prompts_repeated(client_prompts: torch.Tensor, llm_width: int) -> torch.Tensor:
    """Upload: the client model's prompts repeated along the width to the LLM's."""
    return client_prompts.detach().repeat(1, _blocks(llm_width, client_prompts.shape[1])).clone()


def prompts_averaged(llm_prompts: torch.Tensor, client_width: int) -> torch.Tensor:
    """Download: the mean of the LLM prompts' ``client_width``-wide blocks."""
    _blocks(llm_prompts.shape[1], client_width)
    return torch.stack(llm_prompts.detach().split(client_width, dim=-1)).mean(0)
