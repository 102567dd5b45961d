"""Payload inspection: what one reply of a real run holds, as the exact bytes that travel.

:func:`check_reply` parses a client's reply with :func:`fedkt.federated.payload.loads` and asserts

(a) no private training text (or image) of any client appears in its bytes, nor in the
    decompressed per-example predictions;
(b) every field is the runtime's own or declared by the method (``Method.conformance.uploads``,
    :func:`fedkt.methods.uploads.undeclared`), of its declared kind;
(c) no base-model weight travels, by name or by value (:func:`base_weights`), and a method
    that uploads a whole (small) model uploads exactly that model.

Used by the conformance test (every registered method) and by
``tests/federated/test_payload_inspection.py`` (the checks catch what they should).
"""

from __future__ import annotations

import gzip
import math
import re
from typing import Any

import torch

from fedkt.federated.payload import loads
from fedkt.methods import get_method
from fedkt.methods.uploads import undeclared
from tests.support.trust_helpers import RecordedRun, flat_tensors

PREDICTION_COLUMNS = {"id", "gold", "pred", "pred_norm", "scores", "rougeL"}

Bases = dict[int, tuple[dict[str, torch.Tensor], set[str]]]


def private_needles(run: RecordedRun) -> list[bytes]:
    """Every client's private records as bytes: texts of >= 24 characters (UTF-8), or
    each image's float32 pixels."""
    fd = run.data()
    needles = []
    for part in fd.private:
        for record in part:
            text = record.get("text")
            if isinstance(text, str) and len(text) >= 24:
                needles.append(text.encode())
            image = record.get("image")
            if isinstance(image, torch.Tensor):
                needles.append(image.to(torch.float32).contiguous().numpy().tobytes())
    return needles


def disk_state(run: RecordedRun, cid: int, name: str) -> dict[str, torch.Tensor]:
    """The latest tensors the client kept on its own disk under ``name``."""
    from safetensors.torch import load_file

    from fedkt.runtime.base import default_state_root

    files = sorted((default_state_root(run.cfg) / f"client_{cid}").glob(f"{name}.r*.safetensors"))
    assert files, f"client {cid} keeps no {name!r} on its disk"
    return load_file(str(files[-1]))


def base_weights(run: RecordedRun, cid: int) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The client's model weights that must never travel, and the names allowed to travel
    although a base model has them (the shared model that the paper uploads).

    The built-in methods whose clients hold something else than ``clients.models``' causal
    LM are named; any other method (a new one) whose clients run causal LMs is checked
    against those LMs' base weights."""
    cfg, name = run.cfg, run.cfg.method.name
    if name in ("fedsp", "fedprompt", "fedprompt_single"):
        # The clients' models are (cut from) the server LLM: none of its weights go back.
        from fedkt.models.causal_lm import load_causal_lm

        model, _ = load_causal_lm(cfg.server, seed=cfg.seed)
        aux = {} if name == "fedprompt" else {  # FedPrompt's clients hold the LLM itself
            f"aux:{k}": v for k, v in disk_state(run, cid, "aux").items()
            if v.is_floating_point()}
        return {**model.state_dict(), **aux}, set()
    if name in ("fedkd", "fedavg_encoder", "standalone_encoder", "centralized_encoder"):
        # The teacher (FedKD) / whole encoder stays; only the student's trainable update
        # travels, under the student's parameter names (which the teacher shares).
        from fedkt.train.encoder import (
            build_encoder,
            check_text_classification,
            encoder_config,
            trainable_state,
        )

        labels = check_text_classification(run.data(), name)
        teacher, _ = build_encoder(encoder_config(cfg), labels, cfg.seed,
                                   pooling=cfg.method.pooling, device="cpu")
        layers = cfg.method.student_layers if name == "fedkd" else cfg.method.layers
        student, _ = build_encoder(encoder_config(cfg), labels, cfg.seed, layers=layers,
                                   freeze_embeddings=True, pooling=cfg.method.pooling,
                                   device="cpu")
        trained = {} if name != "fedkd" else {
            f"trained:{k}": v for k, v in disk_state(run, cid, "teacher").items()}
        return {**teacher.state_dict(), **trained}, set(trainable_state(student))
    if name == "koala":
        # KOALA uploads the whole small model (its paper's step 1); the server's large
        # model is not on the client at all: nothing is "base" here.
        return {}, set()
    if name == "fedavg_vision":
        # The client holds the server's pretrained model ("base", on its disk); only the
        # head trains and travels.
        from fedkt.data.images import data_spec
        from fedkt.models.vision import build_model, head_module

        fd = run.data()
        model = build_model(cfg.server, data_spec(fd), 0)
        head = {f"head.{k}" for k in head_module(model).state_dict()}
        base = disk_state(run, cid, "base")
        base.pop("__version__", None)
        assert set(base) == set(model.state_dict())
        return {k: v for k, v in base.items() if k not in head}, head
    if cfg.clients.models:  # causal LMs with adapters (FedAvg, FedCoLLM, FedMKT, a new one)
        from fedkt.train.lm import client_lm

        model = client_lm(cfg, cid).model
        return {k: v for k, v in model.state_dict().items() if "lora_" not in k}, set()
    return {}, set()


def _norm(name: str) -> str:
    """A tensor's parameter name without payload, peft and compression decorations."""
    name = name.split("/", 1)[-1].rsplit("::", 1)[0]
    name = name.split(":", 1)[-1] if name.startswith(("aux:", "trained:")) else name
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def _check_runtime_fields(where: str, payload: dict[str, Any]) -> None:
    """The runtime's own fields: the envelope's fixed-width timings and the metrics."""
    env = payload.get("_fedkt")
    # the handler's seconds, its compute seconds (no evaluation) and CPU seconds, at a
    # fixed width so that a reply's size never depends on how long the work took (and
    # the handler's own *_seconds metrics, FedKD's step and SVD times)
    assert isinstance(env, dict), f"{where}: no envelope"
    assert set(env) - {"timings"} == {"seconds", "compute", "cpu"}, where
    timings = env.get("timings", {})
    assert all(re.fullmatch(r"(train|test)/[a-z0-9_]+_seconds", k) for k in timings), where
    for text in (env["seconds"], env["compute"], env["cpu"], *timings.values()):
        assert re.fullmatch(r"\d{8}\.\d{6}", text), where
    metrics = payload.get("metrics", {})
    assert isinstance(metrics, dict), where
    for key, v in metrics.items():
        assert re.fullmatch(r"(train|test)/[a-z0-9_]+", key), f"{where}: metric {key!r}"
        assert isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v), \
            f"{where}: metric {key!r} should be a finite number, got {v!r}"
    blob = payload.get("_predictions")
    if blob is not None:
        assert isinstance(blob, torch.Tensor) and blob.dtype == torch.uint8 \
            and blob.dim() == 1, where


def check_reply(run: RecordedRun, cid: int, handler: str, data: bytes, needles: list[bytes],
                bases: Bases) -> None:
    """Assert that one reply's bytes hold only what the method declares, and nothing
    private or base (see the module docstring)."""
    method = run.cfg.method.name
    where = f"{method} client {cid} '{handler}'"
    # (a) no private training text (or image) appears anywhere in the bytes
    leaked = [n[:40] for n in needles if n in data]
    assert not leaked, f"{where} leaks {leaked[:3]}"
    payload = loads(data, source=f"client {cid}")
    # (b) only the runtime's fields and the method's declared ones, each of its kind
    problems = undeclared(get_method(method).conformance.uploads, handler, payload)
    assert not problems, f"{where}: beyond the declaration: {problems}"
    _check_runtime_fields(where, payload)
    if "_predictions" in payload:
        check_predictions(run, cid, handler, payload.pop("_predictions"), needles)
    # (c) no base-model weight travels, by name or by value
    tensors = flat_tensors(payload)
    if not tensors:
        return
    if cid not in bases:
        bases[cid] = base_weights(run, cid)
    base, shared = bases[cid]
    base_names = {_norm(k) for k in base} - shared
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for t in base.values():
        by_shape.setdefault((tuple(t.shape), t.dtype), []).append(t)
    for key, t in tensors.items():
        assert _norm(key) not in base_names, f"{method}: {key} is a base weight's name"
        same = by_shape.get((tuple(t.shape), t.dtype), [])
        if t.numel() > 1 and t.is_floating_point():
            assert not any(torch.equal(t, b) for b in same), \
                f"{method}: {key} equals a base weight"
    _check_whole_model(method, run, cid, payload)


def check_predictions(run: RecordedRun, cid: int, handler: str, blob: torch.Tensor,
                      needles: list[bytes]) -> None:
    """Per-example predictions: test-split ids and prediction columns only, no private text
    (searched in the decompressed tables, where compression cannot hide it)."""
    from fedkt.eval.predictions import unpack

    where = f"{run.cfg.method.name} client {cid} '{handler}' predictions"
    raw = blob.numpy().tobytes()
    text = gzip.decompress(raw)
    leaked = [n[:40] for n in needles if n in text]
    assert not leaked, f"{where} leak {leaked[:3]}"
    test_ids = {r["id"] for r in run.data().test}
    for scope, table in unpack(raw).items():
        assert set(table.columns) <= PREDICTION_COLUMNS, f"{where} ({scope!r}): columns"
        assert set(table.ids) <= test_ids, f"{where} ({scope!r}): ids outside the test split"


def _check_whole_model(method: str, run: RecordedRun, cid: int, payload: dict) -> None:
    """Methods whose paper uploads a whole (small) model: exactly its state, nothing else."""
    cfg = run.cfg
    if method == "koala" and "model" in payload:
        from fedkt.data.images import data_spec
        from fedkt.models.vision import build_model

        fd = run.data()
        ref = build_model(cfg.clients.model_for(cid), data_spec(fd), 0).state_dict()
        got = payload["model"]
        assert set(got) == set(ref)
        assert all(got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype for k in ref)
    elif method == "fedavg_vision" and "trainable" in payload:
        # default trainable: head -> exactly the head's state (KOALA's baseline)
        from fedkt.data.images import data_spec
        from fedkt.models.vision import build_model, head_module

        fd = run.data()
        ref = head_module(build_model(cfg.server, data_spec(fd), 0)).state_dict()
        got = payload["trainable"]
        assert set(got) == set(ref)
        assert all(got[k].shape == ref[k].shape for k in ref)
    elif method in ("fedkd", "fedavg_encoder") and "update" in payload:
        # the student's (fedavg_encoder: the whole small encoder's) trainable state, each
        # parameter once, with its true shape
        _, shared = base_weights(run, cid)
        names = {k.rsplit("::", 1)[0] for k in payload["update"]}
        assert names == shared
