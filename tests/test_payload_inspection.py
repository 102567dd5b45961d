"""What leaves a client: every reply of a real 1-round job, as the exact bytes that travel.

For each registered method a tiny real job runs through a transport that records the
bytes every client sends back (:class:`tests.trust_helpers.RecordingTransport`). Each
reply is parsed with :func:`fedkt.payload.loads` and checked against an explicit
allow-list of what the method's paper says a client uploads, then searched for the
clients' private data and for the client model's base weights.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from fedkt.data.splits import run_data
from fedkt.methods import available
from fedkt.payload import loads
from tests.trust_helpers import RecordedRun, flat_tensors, recorded_run

# --------------------------------------------------------------------------- allow-lists

NUMBER = "number"  # a finite int/float (bool counts as a flag, see FLAG)
FLAG = "flag"
ENVELOPE = "envelope"  # the runtime's own field: {"seconds": "<fixed-width text>"}
METRICS = "metrics"  # {"train/...": number, "test/...": number}
# The runtime's own field on evaluation replies: per-example predictions on the *test* split
# (gzipped tables; see check_predictions), never anything of the private data.
PREDICTIONS = "predictions"
PREDICTION_COLUMNS = {"id", "gold", "pred", "pred_norm", "scores", "rougeL"}


class Tensors:
    """A tensor dict whose keys all match ``pattern`` (and, with ``exact``, are that set)."""

    def __init__(self, pattern: str, exact: set[str] | None = None) -> None:
        self.pattern = re.compile(pattern)
        self.exact = exact


class OneTensor:
    def __init__(self, ndim: int, dtype: torch.dtype) -> None:
        self.ndim, self.dtype = ndim, dtype


LORA = Tensors(r"^base_model\.model\.(.+\.)?lora_[AB]\.weight$")  # LoRA adapters only
TOPK = Tensors(r"^(values|indices|lengths|sample_ids|losses)$",
               exact={"values", "indices", "lengths", "sample_ids", "losses"})
# FedKD: per-parameter SVD factors (or raw for 1-D / incompressible) of the student's
# update, plus each parameter's shape; the embeddings are frozen and never travel. The
# head's pooling weights (attentive pooling) and dense layer are part of the student.
SVD_UPDATE = Tensors(r"^(bert\.encoder\.layer\.\d+\.|bert\.pooler\.|pooling\.|classifier\.)"
                     r"[\w.]+::(U|S|Vh|raw|shape)$")
RAW_UPDATE = Tensors(r"^(bert\.encoder\.layer\.\d+\.|bert\.pooler\.|pooling\.|classifier\.)"
                     r"[\w.]+::(raw|shape)$")
COMMON = {"metrics": METRICS, "_fedkt": ENVELOPE, "_predictions": PREDICTIONS}
EVALUATE = {"evaluate": COMMON}  # round 0: the client's initial model on the test split
ONLY_METRICS = {"train": COMMON}

# handler -> field -> what it may hold. Anything not listed must not be in a reply.
ALLOW: dict[str, dict[str, dict[str, Any]]] = {
    # McMahan et al.: the locally trained adapter theta_k and n_k.
    "fedavg": {**EVALUATE, "train": {**COMMON, "num_examples": NUMBER, "train_loss": NUMBER,
                         "adapter": LORA}},
    # FedCoLLM Alg. 1 steps 2-3: the SLM's LoRA theta_k (co-tuning happens on the server).
    "fedcollm": {**EVALUATE, "train": {**COMMON, "num_examples": NUMBER, "train_loss": NUMBER,
                           "adapter": LORA}},
    # FedMKT Alg. 1: S_k = top-K logits (ids, values) of every position on the public set
    # and the per-sample losses, named by public index; the SLM's LoRA never leaves.
    "fedmkt": {**EVALUATE, "train_and_share": {**COMMON, "train_loss": NUMBER, "has_s0": FLAG,
                                   "vocab_size": NUMBER, "k": NUMBER, "topk": TOPK},
               "distill": {**COMMON, "kd_loss": NUMBER}},
    # LLM2SLM: knowledge only flows LLM -> SLM, so clients send losses and flags only.
    "llm2slm": {**EVALUATE, "train_and_share": {**COMMON, "train_loss": NUMBER, "has_s0": FLAG},
                "distill": {**COMMON, "kd_loss": NUMBER}},
    # FedKD Eq. 8: SVD factors of the shared student's update; the teacher never leaves.
    "fedkd": {"train": {**COMMON, "num_examples": NUMBER, "train_loss": NUMBER,
                        "update": SVD_UPDATE},
              "sync": {**COMMON}},
    # KOALA Alg. 1 step 1: "uploads it [the small model] with its sample count n_k".
    "koala": {"train": {**COMMON, "num_examples": NUMBER, "train_loss": NUMBER,
                        "model": Tensors(r".")},
              "update": {**COMMON}},
    # FedSP Sec. 3: "it uploads P_k only" (the auxiliary model stays on the client).
    "fedsp": {"setup": {**COMMON, "aux_id": "hex", "num_parameters": NUMBER},
              "train": {**COMMON, "num_examples": NUMBER, "loss": NUMBER, "align_loss": NUMBER,
                        "prompts": OneTensor(2, torch.float32)}},
    "fedprompt": {"train": {**COMMON, "num_examples": NUMBER, "loss": NUMBER,
                            "prompts": OneTensor(2, torch.float32)}},
    "fedprompt_single": {"setup": {**COMMON, "aux_id": "hex", "num_parameters": NUMBER},
                         "train": {**COMMON, "num_examples": NUMBER, "loss": NUMBER,
                                   "prompts": OneTensor(2, torch.float32)}},
    # FedAvg of the whole (small) encoder: its update, uncompressed by default.
    "fedavg_encoder": {**EVALUATE, "train": {**COMMON, "num_examples": NUMBER, "train_loss": NUMBER,
                                 "update": RAW_UPDATE},
                       "sync": {**COMMON}},
    # KOALA's baseline: FedAvg of the large model's head (the backbone is frozen).
    "fedavg_vision": {"train": {**COMMON, "num_examples": NUMBER, "train_loss": NUMBER,
                                "trainable": Tensors(r".")}},
    # No collaboration: only metrics travel.
    "standalone": {**ONLY_METRICS, **EVALUATE},
    "standalone_encoder": {**ONLY_METRICS, **EVALUATE},
    "zero_shot": {"evaluate": COMMON},
    # Everything on the server: clients are never called.
    "centralized": {},
    "centralized_encoder": {},
}

SLOW = {"standalone_encoder", "centralized_encoder"}


def test_every_registered_method_has_an_allow_list():
    assert set(ALLOW) == set(available())


def _check_field(method: str, handler: str, name: str, value: Any, spec: Any) -> None:
    where = f"{method} '{handler}' reply field {name!r}"
    if spec == NUMBER:
        assert isinstance(value, int | float) and not isinstance(value, bool), where
        assert math.isfinite(value), where
    elif spec == FLAG:
        assert isinstance(value, bool), where
    elif spec == "hex":
        assert isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value), where
    elif spec == ENVELOPE:
        # the handler's seconds, its compute seconds (no evaluation) and CPU seconds, at a
        # fixed width so that a reply's size never depends on how long the work took
        # (and the handler's own *_seconds metrics, FedKD's step and SVD times)
        assert isinstance(value, dict), where
        assert set(value) - {"timings"} == {"seconds", "compute", "cpu"}, where
        timings = value.get("timings", {})
        assert all(re.fullmatch(r"(train|test)/[a-z0-9_]+_seconds", k) for k in timings), where
        for text in (value["seconds"], value["compute"], value["cpu"], *timings.values()):
            assert re.fullmatch(r"\d{8}\.\d{6}", text), where
    elif spec == METRICS:
        assert isinstance(value, dict), where
        for key, v in value.items():
            assert re.fullmatch(r"(train|test)/[a-z0-9_]+", key), f"{where}: metric {key!r}"
            assert isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v), \
                f"{where}: metric {key!r} should be a finite number, got {v!r}"
    elif spec == PREDICTIONS:
        assert isinstance(value, torch.Tensor) and value.dtype == torch.uint8 \
            and value.dim() == 1, where
    elif isinstance(spec, OneTensor):
        assert isinstance(value, torch.Tensor), where
        assert value.dim() == spec.ndim and value.dtype == spec.dtype, where
    elif isinstance(spec, Tensors):
        assert isinstance(value, dict) and value, where
        assert all(isinstance(t, torch.Tensor) for t in value.values()), where
        bad = [k for k in value if not spec.pattern.search(k)]
        assert not bad, f"{where}: keys outside the allow-list: {bad[:5]}"
        if spec.exact is not None:
            assert set(value) == spec.exact, where
    else:  # pragma: no cover - a typo in ALLOW
        raise AssertionError(f"unknown spec {spec!r}")


# --------------------------------------------------------------------------- what to look for


def private_needles(run: RecordedRun) -> list[bytes]:
    """Every client's private records as bytes: texts of >= 24 characters (UTF-8), or
    each image's float32 pixels."""
    fd = run_data(run.cfg.data, run.cfg.clients.num_clients, run.cfg.seed)
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


def base_weights(run: RecordedRun, cid: int) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The client's model weights that must never travel, and the names allowed to travel
    although a base model has them (the shared model that the paper uploads)."""
    cfg, name = run.cfg, run.cfg.method.name
    if name in ("fedavg", "fedcollm", "fedmkt", "llm2slm", "standalone", "zero_shot"):
        from fedkt.train.lm import client_lm

        model = client_lm(cfg, cid).model
        return {k: v for k, v in model.state_dict().items() if "lora_" not in k}, set()
    if name in ("fedsp", "fedprompt", "fedprompt_single"):
        # The clients' models are (cut from) the server LLM: none of its weights go back.
        from fedkt.models.causal_lm import load_causal_lm

        model, _ = load_causal_lm(cfg.server, seed=cfg.seed)
        aux = {} if name == "fedprompt" else {  # FedPrompt's clients hold the LLM itself
            f"aux:{k}": v for k, v in _disk_state(run, cid, "aux_model").items()
            if v.is_floating_point()}
        return {**model.state_dict(), **aux}, set()
    if name in ("fedkd", "fedavg_encoder", "standalone_encoder"):
        # The teacher (FedKD) / whole encoder stays; only the student's trainable update
        # travels, under the student's parameter names (which the teacher shares).
        from fedkt.methods.fedkd import teacher_config
        from fedkt.train.encoder import build_encoder, check_text_classification, trainable_state

        labels = check_text_classification(run_data(cfg.data, cfg.clients.num_clients,
                                                    cfg.seed), name)
        teacher, _ = build_encoder(teacher_config(cfg), labels, cfg.seed,
                                   pooling=cfg.method.pooling, device="cpu")
        layers = cfg.method.student_layers if name == "fedkd" else cfg.method.layers
        student, _ = build_encoder(teacher_config(cfg), labels, cfg.seed, layers=layers,
                                   freeze_embeddings=True, pooling=cfg.method.pooling,
                                   device="cpu")
        trained = {} if name != "fedkd" else {
            f"trained:{k}": v for k, v in _disk_state(run, cid, "teacher").items()}
        return {**teacher.state_dict(), **trained}, set(trainable_state(student))
    if name in ("koala", "fedavg_vision"):
        from fedkt.data.images import data_spec
        from fedkt.models.vision import build_model, head_module

        fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
        if name == "koala":
            # KOALA uploads the whole small model (its paper's step 1); the server's large
            # model is not on the client at all: nothing is "base" here.
            return {}, set()
        # The client holds the server's pretrained model ("base", on its disk); only the
        # head trains and travels.
        model = build_model(cfg.server, data_spec(fd), 0)
        head = {f"head.{k}" for k in head_module(model).state_dict()}
        base = _disk_state(run, cid, "base")
        assert set(base) == set(model.state_dict())
        return {k: v for k, v in base.items() if k not in head}, head
    return {}, set()


def _disk_state(run: RecordedRun, cid: int, name: str) -> dict[str, torch.Tensor]:
    """The latest tensors the client kept on its own disk under ``name``."""
    from safetensors.torch import load_file

    from fedkt.runtime.base import default_state_root

    files = sorted((default_state_root(run.cfg) / f"client_{cid}").glob(f"{name}.r*.safetensors"))
    assert files, f"client {cid} keeps no {name!r} on its disk"
    return load_file(str(files[-1]))


def _norm(name: str) -> str:
    """A tensor's parameter name without payload, peft and compression decorations."""
    name = name.split("/", 1)[-1].rsplit("::", 1)[0]
    name = name.split(":", 1)[-1] if name.startswith(("aux:", "trained:")) else name
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


# --------------------------------------------------------------------------- the test


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m
                                    for m in available()])
def test_replies_hold_only_what_the_paper_says_leaves_a_client(method):
    run = recorded_run(method)
    allow = ALLOW[method]
    replies = run.replies()
    if not allow:
        assert run.calls == [], f"{method}: clients must never be called"
        return
    handlers = {c.handler for c in replies}
    assert handlers == set(allow), f"{method}: handlers called {handlers}, expected {set(allow)}"
    assert {c.cid for c in replies} == set(run.cfg.client_ids())
    needles = private_needles(run)
    assert needles, "the run's private data has records to look for"
    bases: dict[int, tuple[dict[str, torch.Tensor], set[str]]] = {}
    for call in replies:
        check_reply(run, call.cid, call.handler, call.reply, needles, bases)


def check_reply(run: RecordedRun, cid: int, handler: str, data: bytes, needles: list[bytes],
                bases: dict[int, tuple[dict[str, torch.Tensor], set[str]]]) -> None:
    """Assert that one reply's bytes hold only what the method's allow-list permits."""
    method = run.cfg.method.name
    # (a) no private training text (or image) appears anywhere in the bytes
    leaked = [n[:40] for n in needles if n in data]
    assert not leaked, f"{method} client {cid} '{handler}' leaks {leaked[:3]}"
    payload = loads(data, source=f"client {cid}")
    spec = ALLOW[method][handler]
    extra = sorted(set(payload) - set(spec))
    assert not extra, f"{method} '{handler}': fields beyond the allow-list: {extra}"
    for name, value in payload.items():
        _check_field(method, handler, name, value, spec[name])
    if "_predictions" in payload:
        check_predictions(run, cid, handler, payload.pop("_predictions"), needles)
    # (b) no base-model weight travels, by name or by value
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
    import gzip

    from fedkt.eval.predictions import unpack

    where = f"{run.cfg.method.name} client {cid} '{handler}' predictions"
    raw = blob.numpy().tobytes()
    text = gzip.decompress(raw)
    leaked = [n[:40] for n in needles if n in text]
    assert not leaked, f"{where} leak {leaked[:3]}"
    test_ids = {r["id"] for r in run_data(run.cfg.data, run.cfg.clients.num_clients,
                                          run.cfg.seed).test}
    for scope, table in unpack(raw).items():
        assert set(table.columns) <= PREDICTION_COLUMNS, f"{where} ({scope!r}): columns"
        assert set(table.ids) <= test_ids, f"{where} ({scope!r}): ids outside the test split"


def test_the_checks_catch_a_leak_an_extra_field_and_a_base_weight():
    """The checker is not vacuous: edits of a real FedAvg reply are caught."""
    from fedkt.payload import dumps

    run = recorded_run("fedavg")
    call = next(c for c in run.replies() if c.cid == 1 and c.handler == "train")
    needles = private_needles(run)
    bases: dict = {}
    check_reply(run, 1, "train", call.reply, needles, bases)  # the real reply passes
    text = next(r["text"] for r in run_data(run.cfg.data, 3, run.cfg.seed).private[1]
                if len(r["text"]) >= 24)
    embed = next(v for k, v in bases[1][0].items() if k.endswith("embed_tokens.weight"))
    test_id = run_data(run.cfg.data, 3, run.cfg.seed).test[0]["id"]

    def _tables(columns: dict) -> torch.Tensor:
        from fedkt.eval.predictions import Predictions, pack

        blob = bytearray(pack({"": Predictions(columns)}))
        return torch.frombuffer(blob, dtype=torch.uint8).clone()

    cases = {
        "leaks": lambda p: {**p, "metrics": {**p["metrics"], "train/loss": 0.0},
                            "note": f"from {text}"},
        "beyond the allow-list": lambda p: {**p, "num_layers": 2},
        "outside the allow-list": lambda p: {**p, "adapter": {
            **p["adapter"], "base_model.model.model.norm.weight": torch.ones(64)}},
        "equals a base weight": lambda p: {**p, "adapter": {
            **p["adapter"], "base_model.model.model.embed_tokens.lora_A.weight": embed}},
        "should be a finite": lambda p: {**p, "metrics": {"train/loss": "high"}},
        "predictions leak": lambda p: {**p, "_predictions": _tables(
            {"id": [test_id], "gold": [0], "pred": [text]})},
        "ids outside the test split": lambda p: {**p, "_predictions": _tables(
            {"id": ["not-a-test-id"], "gold": [0], "pred": [1]})},
    }
    for what, edit in cases.items():
        bad = dumps(edit(loads(call.reply)))
        with pytest.raises(AssertionError, match=what):
            check_reply(run, 1, "train", bad, needles, bases)


def _check_whole_model(method: str, run: RecordedRun, cid: int, payload: dict) -> None:
    """Methods whose paper uploads a whole (small) model: exactly its state, nothing else."""
    cfg = run.cfg
    if method == "koala":
        from fedkt.data.images import data_spec
        from fedkt.models.vision import build_model

        fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
        ref = build_model(cfg.clients.model_for(cid), data_spec(fd), 0).state_dict()
        got = payload["model"]
        assert set(got) == set(ref)
        assert all(got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype for k in ref)
    elif method == "fedavg_vision":
        # default trainable: head -> exactly the head's state (KOALA's baseline)
        from fedkt.data.images import data_spec
        from fedkt.models.vision import build_model, head_module

        fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
        ref = head_module(build_model(cfg.server, data_spec(fd), 0)).state_dict()
        got = payload["trainable"]
        assert set(got) == set(ref)
        assert all(got[k].shape == ref[k].shape for k in ref)
    elif method in ("fedkd", "fedavg_encoder"):
        # the student's (fedavg_encoder: the whole small encoder's) trainable state, each
        # parameter once, with its true shape
        _, shared = base_weights(run, cid)
        names = {k.rsplit("::", 1)[0] for k in payload["update"]}
        assert names == shared
