"""Faults: one client's reply is malformed, undecodable or never arrives.

A tampering transport edits ONE client's reply to a chosen handler (parse, edit,
re-serialise with :func:`fedkt.federated.payload.dumps`, or raw bytes, or no reply at all). With
3 clients and ``clients.min_replies=2`` the run must complete with that client
excluded and the reason (naming the client and the field) in ``metrics.jsonl``; with
``min_replies`` = all clients the run must fail with a :class:`RoundError` naming both.

The clients' real replies come from one real recorded run per method
(:func:`tests.support.trust_helpers.recorded_run`); the server side (setup, validation,
aggregation, evaluation, metrics) runs for real on every tampered run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedkt.federated.payload import Payload, dumps
from fedkt.runtime.base import RoundError, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from tests.support.trust_helpers import (
    ReplayTransport,
    TamperingTransport,
    recorded_run,
    tiny_config,
)

BAD = 1  # the client whose reply is corrupted


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# --------------------------------------------------------------------------- tampering


def edit_tensor(field: str, fn: Callable[[torch.Tensor], torch.Tensor], key: str | None = None
                ) -> Callable[[Payload], Payload]:
    """Replace one tensor of ``field`` (a tensor, or the first / given key of a dict)."""

    def tamper(p: Payload) -> Payload:
        value = p[field]
        if isinstance(value, torch.Tensor):
            p[field] = fn(value.clone())
        else:
            name = key or sorted(value)[0]
            value[name] = fn(value[name].clone())
        return p

    return tamper


def poison(x: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(t: torch.Tensor) -> torch.Tensor:
        t.view(-1)[0] = x
        return t

    return fn


def drop(field: str) -> Callable[[Payload], Payload]:
    def tamper(p: Payload) -> Payload:
        del p[field]
        return p

    return tamper


def add_key(field: str, key: str) -> Callable[[Payload], Payload]:
    def tamper(p: Payload) -> Payload:
        p[field][key] = torch.zeros(4, 4)
        return p

    return tamper


def raw_bytes(data: bytes) -> Callable[[Payload], bytes]:
    return lambda p: data


def truncated(p: Payload) -> bytes:
    data = dumps(p)
    return data[: len(data) - 100]


def never(p: Payload) -> None:
    return None


# --------------------------------------------------------------------------- runs


def tampered_run(tmp_path: Path, method: str, handler: str, tamper, *overrides: str,
                 name: str = "bad") -> list[dict]:
    recorded = recorded_run(method)
    cfg = tiny_config(method, tmp_path, *overrides, name=name)
    transport = TamperingTransport(ReplayTransport(recorded.calls), BAD, handler, tamper)
    rows = run_job(cfg, transport, quiet=True)
    assert transport.tampered == 1
    return rows


def metrics_file_rows(tmp_path: Path, name: str = "bad") -> list[dict]:
    path = tmp_path / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_excluded(tmp_path: Path, rows: list[dict], reason: str) -> None:
    """The round completed, only client ``BAD`` was excluded, for ``reason`` (a regex)."""
    import re

    for got in (rows, metrics_file_rows(tmp_path)):
        excluded = {r["participant"]: r["excluded"] for r in got if r.get("excluded")}
        assert list(excluded) == [f"client_{BAD}"], excluded
        assert re.search(reason, excluded[f"client_{BAD}"]), excluded[f"client_{BAD}"]
        server = [r for r in got if r["participant"] == "server" and r["split"] == "train"]
        assert server and server[-1]["clients_replied"] == 2
        assert [r for r in got if r["participant"] == "server" and r["split"] == "test"], \
            "the round (and the evaluation) completed"


# (method, handler, tamper, regex the reason must match: client and field)
FEDAVG_CASES = {
    "wrong_shape": ("fedavg", "train", edit_tensor("adapter", lambda t: t[..., :-1]),
                    r"client 1: field 'adapter'\[.*lora_A.*\]: shape"),
    "wrong_dtype": ("fedavg", "train", edit_tensor("adapter", lambda t: t.double()),
                    r"client 1: field 'adapter'\[.*\]: dtype torch.float64"),
    "nan": ("fedavg", "train", edit_tensor("adapter", poison(math.nan)),
            r"client 1: field 'adapter'\[.*\]: 1 non-finite"),
    "inf": ("fedavg", "train", edit_tensor("adapter", poison(math.inf)),
            r"client 1: field 'adapter'\[.*\]: 1 non-finite"),
    "missing_field": ("fedavg", "train", drop("adapter"),
                      r"client 1: payload has no field 'adapter'"),
    "missing_count": ("fedavg", "train", drop("num_examples"),
                      r"client 1: field 'num_examples' should be a finite number"),
    "extra_key": ("fedavg", "train",
                  add_key("adapter", "base_model.model.model.embed_tokens.weight"),
                  r"client 1: field 'adapter': .*unexpected keys \['base_model.model.model"
                  r".embed_tokens.weight'\]"),
    "undecodable": ("fedavg", "train", raw_bytes(b"\x00 not a payload \xff" * 4),
                    r"PayloadError: client 1: not a fedkt payload"),
    "truncated": ("fedavg", "train", truncated, r"PayloadError: client 1: malformed payload"),
    "timeout": ("fedavg", "train", never, r"TimeoutError: no reply within"),
}
OTHER_CASES = {
    # FedSP / FedPrompt: the prompts must have the shape of the prompts sent.
    "fedsp_prompt_length": ("fedsp", "train", edit_tensor("prompts", lambda t: t[:-1]),
                            r"client 1: field 'prompts': shape \(3, 256\), expected \(4, 256\)"),
    "fedprompt_layers": ("fedprompt", "train", edit_tensor("prompts", lambda t: t[:, :192]),
                         r"client 1: field 'prompts': shape \(4, 192\), expected \(4, 256\)"),
    "fedprompt_nan": ("fedprompt", "train", edit_tensor("prompts", poison(math.nan)),
                      r"client 1: field 'prompts': 1 non-finite"),
    # FedKD: SVD factors whose ranks disagree, a raw part of the wrong size, NaN.
    "fedkd_svd_ranks": ("fedkd", "train", lambda p: _svd_rank_mismatch(p),
                        r"client 1: field 'update': payload factors for '.*' do not fit"),
    "fedkd_raw_shape": ("fedkd", "train", lambda p: _raw_wrong_size(p),
                        r"client 1: field 'update'\['.*bias'\]: .*shape"),
    "fedkd_nan": ("fedkd", "train", lambda p: _first_factor(p, poison(math.nan)),
                  r"client 1: field 'update'\['.*::U'\]: 1 non-finite"),
    # fedavg_vision (KOALA's baseline): a head of the wrong shape, a count that is no number.
    "fedavg_vision_shape": ("fedavg_vision", "train",
                            edit_tensor("trainable", lambda t: t[:-1]),
                            r"client 1: field 'trainable'\[.*\]: shape"),
    "fedavg_vision_count": ("fedavg_vision", "train", lambda p: {**p, "num_examples": "many"},
                            r"client 1: field 'num_examples' should be a finite number"),
    # KOALA: each uploaded small model is checked (keys, shapes, dtypes, finite).
    "koala_nan": ("koala", "train", edit_tensor("model", poison(math.nan)),
                  r"client 1: field 'model'\[.*\]: 1 non-finite"),
}


def _svd_keys(p: Payload, part: str) -> list[str]:
    return sorted(k for k in p["update"] if k.endswith(f"::{part}"))


def _svd_rank_mismatch(p: Payload) -> Payload:
    key = _svd_keys(p, "S")[0]
    p["update"][key] = p["update"][key][:-1].clone()  # U and Vh keep the old rank
    return p


def _raw_wrong_size(p: Payload) -> Payload:
    key = next(k for k in _svd_keys(p, "raw") if k.endswith("bias::raw"))
    p["update"][key] = torch.cat([p["update"][key], p["update"][key][:1]])
    return p


def _first_factor(p: Payload, fn) -> Payload:
    key = _svd_keys(p, "U")[0]
    p["update"][key] = fn(p["update"][key].clone())
    return p


CASES = {**FEDAVG_CASES, **OTHER_CASES}
# Default runs keep one case of each kind per method; the rest are marked slow.
FAST = {"wrong_shape", "nan", "missing_field", "extra_key", "undecodable", "timeout",
        "fedprompt_layers", "fedkd_svd_ranks", "fedavg_vision_count", "koala_nan"}


def _cases(names):
    return [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in names]


@pytest.mark.parametrize("case", _cases(CASES))
def test_bad_client_is_excluded_and_the_run_completes(tmp_path, case):
    method, handler, tamper, reason = CASES[case]
    rows = tampered_run(tmp_path, method, handler, tamper, "clients.min_replies=2")
    assert_excluded(tmp_path, rows, reason)


@pytest.mark.parametrize("case", [
    "wrong_shape", "timeout", "fedkd_svd_ranks", "fedavg_vision_count",
    *(pytest.param(c, marks=pytest.mark.slow)
      for c in ("nan", "extra_key", "undecodable", "fedsp_prompt_length", "fedprompt_nan"))])
def test_without_enough_clients_the_round_error_names_client_and_field(tmp_path, case):
    method, handler, tamper, reason = CASES[case]
    with pytest.raises(RoundError, match=r"round 1, handler 'train': 2 of 3 clients replied, 3 "
                                         r"needed") as info:
        tampered_run(tmp_path, method, handler, tamper)
    import re

    assert re.search(reason, str(info.value)), str(info.value)


def test_a_live_client_that_never_replies_is_excluded(tmp_path):
    """The timeout case on live clients (no replay): client 1 trains, its reply is lost."""
    cfg = tiny_config("fedavg", tmp_path, "clients.min_replies=2", name="bad")
    transport = TamperingTransport(LocalTransport(default_state_root(cfg)), BAD, "train", never)
    rows = run_job(cfg, transport, quiet=True)
    assert_excluded(tmp_path, rows, r"^TimeoutError: no reply within 3600 s$")


# --------------------------------------------------------------------------- FedMKT


# FedMKT's server checks each S_k on receipt and excludes a client whose S_k is malformed:
# the round goes on without that client (if clients.min_replies allows), the reason names
# the client and the field and the server counts it in ``rejected_clients``.
def _ids_outside_vocab(p: Payload) -> Payload:
    p["topk"]["indices"] = p["topk"]["indices"].clone()
    p["topk"]["indices"][0, 0] = p["vocab_size"] + 5
    return p


def _unsorted(p: Payload) -> Payload:
    p["topk"]["values"] = p["topk"]["values"].flip(-1).contiguous()
    return p


MKT_CASES = {
    "ids_outside_vocab": (_ids_outside_vocab,
                          r"client 1: top-K field 'indices' holds id \d+ outside \[0, \d+\)"),
    "unsorted_values": (_unsorted, r"client 1: top-K field 'values' is not sorted"),
    "nan_values": (edit_tensor("topk", poison(math.nan), "values"),
                   r"client 1: top-K field 'values' holds non-finite"),
    "wrong_dtype": (edit_tensor("topk", lambda t: t.float(), "values"),
                    r"client 1: top-K field 'values': dtype torch.float32"),
    "extra_key": (add_key("topk", "hidden_states"),
                  r"client 1: top-K payload has unexpected field\(s\) \['hidden_states'\]"),
    "missing_field": (drop("topk"), r"client 1: payload has no field 'topk'"),
}


@pytest.mark.parametrize("case", ["ids_outside_vocab", *(
    pytest.param(c, marks=pytest.mark.slow) for c in MKT_CASES if c != "ids_outside_vocab")])
def test_fedmkt_excludes_malformed_knowledge_and_names_client_and_field(tmp_path, case):
    tamper, reason = MKT_CASES[case]
    rows = tampered_run(tmp_path, "fedmkt", "train_and_share", tamper, "clients.min_replies=2")
    assert_excluded(tmp_path, rows, reason)
    server = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
    assert server[-1]["rejected_clients"] == 1
    assert server[-1]["clients_replied"] == 2


def test_fedmkt_receipt_check_catches_every_malformed_knowledge_set():
    """Every tampering above, on client 1's real S_k bytes, fails the server's receipt
    check (:func:`fedkt.alignment.knowledge.unpack_topk`) with the client and the field."""
    import re

    from fedkt.alignment.knowledge import unpack_topk, vocab_size
    from fedkt.federated.payload import PayloadError, loads
    from fedkt.models import load_tokenizer

    run = recorded_run("fedmkt")
    reply = next(c.reply for c in run.calls if c.handler == "train_and_share" and c.cid == BAD)
    vocab = vocab_size(load_tokenizer(run.cfg.clients.model_for(BAD)))
    k = run.cfg.method.top_k
    clean = loads(reply, source=f"client {BAD}")
    unpack_topk(clean.state("topk"), vocab, k, f"client {BAD}")  # the real one passes
    for case, (tamper, reason) in MKT_CASES.items():
        bad = tamper(loads(reply, source=f"client {BAD}"))
        with pytest.raises(PayloadError) as info:
            packed = bad.state("topk", source=f"client {BAD}", finite=False)
            unpack_topk(packed, vocab, k, f"client {BAD}")
        assert re.search(reason, str(info.value)), (case, str(info.value))
