"""Wire format and validation of payloads."""

import math

import pytest
import torch

from fedkt.federated.payload import Payload, PayloadError, dumps, loads, nbytes


def test_round_trip_keeps_tensors_dtypes_and_meta():
    state = {"a.weight": torch.randn(3, 4), "b.bias": torch.arange(5, dtype=torch.int32)}
    p = {"adapter": state, "logits": torch.randn(2, 3).half(), "n": 7, "tag": "x",
         "metrics": {"train/loss": 1.5}}
    q = loads(dumps(p))
    assert q["n"] == 7 and q["tag"] == "x" and q["metrics"] == {"train/loss": 1.5}
    assert q["logits"].dtype == torch.float16 and torch.equal(q["logits"], p["logits"])
    assert set(q["adapter"]) == set(state)
    for k, v in state.items():
        assert q["adapter"][k].dtype == v.dtype and torch.equal(q["adapter"][k], v)


def test_size_is_tensor_bytes_plus_small_header():
    t = torch.zeros(1000, dtype=torch.float16)
    size = nbytes({"t": t})
    assert 2000 <= size < 2000 + 400  # 2 bytes per fp16 value + headers


def test_malformed_bytes_name_the_source():
    with pytest.raises(PayloadError, match="client 3"):
        loads(b"garbage bytes here", source="client 3")
    data = dumps({"t": torch.ones(4)})
    with pytest.raises(PayloadError, match="client 1: malformed"):
        loads(data[:-3], source="client 1")


def test_non_finite_meta_is_refused():
    with pytest.raises(PayloadError, match="not finite"):
        dumps({"loss": math.nan})


def test_tensor_checks_name_field_and_problem():
    p = Payload(x=torch.tensor([1.0, float("nan")]), ids=torch.tensor([[0, 5]]))
    with pytest.raises(PayloadError, match=r"client 2: field 'x': 1 non-finite"):
        p.tensor("x", source="client 2")
    with pytest.raises(PayloadError, match=r"shape \(1, 2\), expected \(1, 3\)"):
        p.tensor("ids", shape=(1, 3))
    with pytest.raises(PayloadError, match="dtype torch.int64"):
        p.tensor("ids", dtype=torch.int32)
    with pytest.raises(PayloadError, match=r"allowed \[0, 4\]"):
        p.tensor("ids", low=0, high=4)
    with pytest.raises(PayloadError, match="no field 'y'"):
        p.tensor("y")
    assert p.tensor("ids", shape=(None, 2), high=5).shape == (1, 2)


def test_state_like_checks_keys_and_shapes():
    ref = {"w": torch.zeros(2, 2)}
    good = Payload(adapter={"w": torch.ones(2, 2)})
    assert torch.equal(good.state("adapter", like=ref)["w"], torch.ones(2, 2))
    with pytest.raises(PayloadError, match="missing keys"):
        Payload(adapter={"v": torch.ones(2, 2)}).state("adapter", like=ref, source="client 0")
    with pytest.raises(PayloadError, match=r"\['w'\]: shape \(3, 2\)"):
        Payload(adapter={"w": torch.ones(3, 2)}).state("adapter", like=ref)
    with pytest.raises(PayloadError, match="non-finite"):
        Payload(adapter={"w": torch.full((2, 2), float("inf"))}).state("adapter", like=ref)


def test_number_checks():
    p = Payload(n=3, bad=float("inf"), s="3")
    assert p.number("n", low=0) == 3.0
    for key in ("bad", "s", "missing"):
        with pytest.raises(PayloadError, match=key):
            p.number(key)


def test_a_received_state_comes_in_one_order_every_time():
    """safetensors returns tensors in an order that changes from call to call; a received
    state is in name order, so sums over its tensors are the same in every run."""
    state = {f"layer.{i}.weight": torch.full((2,), float(i)) for i in (3, 10, 1, 7, 22, 5)}
    data = dumps({"adapter": state, "scale": torch.ones(1)})
    orders = {tuple(loads(data)["adapter"]) for _ in range(50)}
    assert orders == {tuple(sorted(state))}
