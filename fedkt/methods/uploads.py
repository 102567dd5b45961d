"""What a method's clients send back, declared next to the method and checked by the tests.

Every method registers ``Conformance(uploads={handler: {field: kind}})`` in its
``Method(conformance=...)``: for each client handler, the fields its reply may hold beyond
the runtime's own (``metrics``, the envelope, evaluation predictions) and what each field
is:

* :data:`NUMBER` (a finite int or float), :data:`FLAG` (a bool), :data:`HEX_ID` (a
  64-character content hash);
* :class:`Tensor` (one tensor of a given rank and dtype);
* :class:`Tensors` (a dict of tensors whose names match a pattern, e.g. only LoRA
  weights: :data:`ADAPTER`).

:func:`undeclared` lists what a reply holds beyond its declaration; the conformance
test (``tests/methods/test_conformance.py``) runs every registered method and checks
every reply with it, so a method's paper-level promise ("it uploads P_k only") is
written once, in the method's package.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ADAPTER", "CHOICES", "FLAG", "HEX_ID", "NUMBER", "RUNTIME_FIELDS", "SVD_UPDATE", "Tensor",
           "Tensors", "TOPK", "Uploads", "undeclared"]


@dataclass(frozen=True)
class Kind:
    """A scalar field's kind: ``number``, ``flag`` or ``hex_id``."""

    name: str

    def problem(self, value: Any) -> str | None:
        if self.name == "number":
            ok = isinstance(value, int | float) and not isinstance(value, bool) \
                and math.isfinite(value)
            return None if ok else f"should be a finite number, got {value!r}"[:120]
        if self.name == "flag":
            return None if isinstance(value, bool) else f"should be a bool, got {value!r}"
        ok = isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None
        return None if ok else f"should be a 64-character hex id, got {value!r}"[:120]


NUMBER = Kind("number")
FLAG = Kind("flag")
HEX_ID = Kind("hex_id")


@dataclass(frozen=True)
class Tensor:
    """One tensor of rank ``ndim`` and dtype ``dtype`` (e.g. ``"float32"``)."""

    ndim: int
    dtype: str

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, torch.Tensor):
            return f"should be a tensor, got {type(value).__name__}"
        if value.dim() != self.ndim or str(value.dtype).removeprefix("torch.") != self.dtype:
            return (f"should be a {self.ndim}-d {self.dtype} tensor, got {value.dim()}-d "
                    f"{str(value.dtype).removeprefix('torch.')}")
        return None


@dataclass(frozen=True)
class Tensors:
    """A non-empty dict of tensors whose names all match ``pattern`` (with ``exact``: that
    set of names and no other)."""

    pattern: str = "."
    exact: frozenset[str] | None = None

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, dict) or not value \
                or not all(isinstance(t, torch.Tensor) for t in value.values()):
            return "should be a non-empty dict of tensors"
        bad = [k for k in value if not re.search(self.pattern, k)]
        if bad:
            return f"has tensors outside the declaration: {bad[:5]}"
        if self.exact is not None and set(value) != self.exact:
            return f"should hold exactly {sorted(self.exact)}, got {sorted(value)}"
        return None


# A causal LM's PEFT adapter as :func:`fedkt.models.adapters.adapter_state` names it:
# LoRA's A and B matrices, or a prefix (FedAvg, FedCoLLM).
ADAPTER = Tensors(r"^base_model\.model\.(.+\.)?lora_[AB]\.weight$"
                  r"|^prompt_encoder\.embedding\.weight$")
# A knowledge set on the public set (fedkt.alignment.knowledge.pack_topk; FedMKT).
TOPK = Tensors(r"^(values|indices|lengths|sample_ids|losses)$",
               exact=frozenset({"values", "indices", "lengths", "sample_ids", "losses"}))
# Posteriors over a task's choices on the public set (fedkt.alignment.choices.pack; FedMKT
# with knowledge: choices).
CHOICES = Tensors(r"^posteriors$", exact=frozenset({"posteriors"}))
# A model update, per parameter SVD factors or raw, with its shape
# (fedkt.federated.compression.to_payload; FedKD Eq. 8, encoder FedAvg).
SVD_UPDATE = Tensors(r"^[\w.]+::(U|S|Vh|raw|shape)$")

# The runtime's own reply fields, allowed in every reply: the handler's metrics, the
# envelope (fixed-width timings) and per-example test predictions on evaluation calls.
RUNTIME_FIELDS = frozenset({"metrics", "_fedkt", "_predictions"})

Uploads = Mapping[str, Mapping[str, Any]]  # handler -> field -> kind


def undeclared(uploads: Uploads, handler: str, reply: Mapping[str, Any]) -> list[str]:
    """What ``reply`` (a client's reply to ``handler``) holds beyond ``uploads``: one line
    per field that is not declared or not of its declared kind (empty: within it)."""
    if handler not in uploads:
        return [f"handler {handler!r} has no declaration"]
    declared = uploads[handler]
    out = []
    for name, value in reply.items():
        if name in RUNTIME_FIELDS:
            continue
        if name not in declared:
            out.append(f"{handler!r} field {name!r} is not declared")
        elif (problem := declared[name].problem(value)) is not None:
            out.append(f"{handler!r} field {name!r} {problem}")
    return out
