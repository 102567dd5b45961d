"""The auxiliary model as it travels once to each client, and as the client keeps it.

The server sends it with the ``setup`` call to every client that does not hold it (the
held object ``aux`` of :mod:`fedkt.methods.holdings`, version = its content id): the cut's
weights, the LLM's config, the cut's spec and the tokenizer's files
(:func:`pack_auxiliary`).  The client keeps all of it on its disk and builds the model
from it once per process (:func:`client_auxiliary`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedkt.federated.payload import Payload, PayloadError
from fedkt.infra.placement import client_device, pick_device
from fedkt.methods.base import ClientContext
from fedkt.models.auxiliary import AuxSpec, aux_state, build_auxiliary, unwrap
from fedkt.train.lm import LM

from .training import align_params, prefix_training

__all__ = ["AUX", "ClientAux", "client_auxiliary", "keep_auxiliary", "pack_auxiliary",
           "reset_auxiliary", "state_id"]

AUX = "aux"  # the held object
_META = "__fedsp_meta__"  # reserved keys of the client's kept auxiliary model
_TOK = "__fedsp_tok__/"


def state_id(state: dict[str, Tensor], *extra: Any) -> str:
    """A content hash of tensors (names, dtypes, shapes, bytes) and JSON-able extras."""
    digest = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _bytes_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def pack_auxiliary(model: torch.nn.Module, config: dict[str, Any], spec: AuxSpec,
                   tokenizer: Any) -> Payload:
    """The ``setup`` request: the cut model, the LLM's config, the spec, the tokenizer, the id."""
    state = aux_state(model)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        tok = {p.name: _bytes_tensor(p.read_bytes()) for p in sorted(Path(tmp).iterdir())
               if p.is_file()}
    spec_json = spec.to_json()
    return Payload(aux_model=state, aux_config=config, aux_spec=spec_json, aux_tokenizer=tok,
                   aux_id=state_id(state, config, spec_json))


def keep_auxiliary(ctx: ClientContext, msg: Payload) -> tuple[str, int]:
    """Check a ``setup`` request and keep what it carries on this client's disk; its id
    and number of parameters."""
    state = msg.state("aux_model", source="server")
    config, spec = msg.get("aux_config"), msg.get("aux_spec")
    if not isinstance(config, dict) or not isinstance(spec, dict):
        raise PayloadError("server: fields 'aux_config' and 'aux_spec' must be mappings")
    AuxSpec.from_json(spec)
    tok = msg.state("aux_tokenizer", source="server")
    aux_id = state_id(state, config, spec)
    if aux_id != msg.get("aux_id"):
        raise PayloadError(f"server: auxiliary model does not match its id {msg.get('aux_id')!r}")
    meta = json.dumps({"config": config, "spec": spec, "aux_id": aux_id}).encode()
    ctx.keep(AUX, aux_id, {**state, _META: _bytes_tensor(meta),
                           **{_TOK + k: v for k, v in tok.items()}})
    return aux_id, sum(t.numel() for t in state.values())


@dataclass
class ClientAux:
    """A client's auxiliary model, built once per process from its disk copy."""

    lm: LM
    spec: AuxSpec
    aux_id: str
    base: dict[str, Tensor]  # the received values of what phase (i) trains


_AUX_CACHE: dict[str, ClientAux] = {}


def client_auxiliary(ctx: ClientContext, aux_id: str) -> ClientAux:
    """The auxiliary model ``aux_id`` this client keeps, built (once per process)."""
    entry = _AUX_CACHE.get(aux_id)
    if entry is not None:
        return entry
    saved = ctx.cached(AUX, aux_id)
    if saved is None:
        raise PayloadError(f"client {ctx.cid} holds no auxiliary model {aux_id[:12]} on its "
                           "disk; the server sends it with 'setup' before 'train'")
    meta = json.loads(bytes(saved.pop(_META).tolist()).decode())
    tok_files = {k[len(_TOK):]: saved.pop(k) for k in list(saved) if k.startswith(_TOK)}
    from transformers import AutoTokenizer

    from fedkt.models.adapters import apply_peft
    from fedkt.models.tokenizers import ensure_pad_token

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in tok_files.items():
            (Path(tmp) / name).write_bytes(bytes(data.tolist()))
        tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(tmp))
    spec = AuxSpec.from_json(meta["spec"])
    model = build_auxiliary(meta["config"], saved, spec)
    model = apply_peft(model, prefix_training(ctx.cfg), seed=ctx.cfg.seed)
    model.to(pick_device(client_device(ctx.cfg, ctx.cid)))
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    base = {names[id(p)]: p.detach().clone() for p in align_params(model, ctx.method.trainable)}
    entry = ClientAux(LM(model, tokenizer, {}), spec, aux_id, base)
    while len(_AUX_CACHE) >= 2:
        _AUX_CACHE.pop(next(iter(_AUX_CACHE)))
    _AUX_CACHE[aux_id] = entry
    return entry


def reset_auxiliary(entry: ClientAux, own: dict[str, Tensor] | None) -> None:
    """Load this client's aligned weights (or the received ones) into the shared copy."""
    params = dict(unwrap(entry.lm.model).named_parameters())
    values = own if own is not None else entry.base
    if set(values) != set(entry.base):
        raise PayloadError("the client's saved auxiliary weights do not match its model")
    with torch.no_grad():
        for key, value in values.items():
            params[key].copy_(value)
