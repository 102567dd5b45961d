"""FedAvg against hand numbers."""

from __future__ import annotations

import pytest
import torch

from fedkt.federated import aggregation as A


def _states():
    s0 = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    s1 = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    return s0, s1


def test_fedavg_weighted_hand_numbers():
    s0, s1 = _states()
    out = A.fedavg([s0, s1], weights=[1, 3])
    # w: (1 * [1, 2] + 3 * [3, 6]) / 4 = [10/4, 20/4] = [2.5, 5.0]
    torch.testing.assert_close(out["w"], torch.tensor([2.5, 5.0]))
    # n (int64): (1 * 3 + 3 * 5) / 4 = 18 / 4 = 4.5 -> rounds (half to even) to 4
    assert out["n"].dtype == torch.int64 and out["n"].item() == 4
    # equal weights: ([1, 2] + [3, 6]) / 2 = [2, 4]
    torch.testing.assert_close(A.fedavg([s0, s1])["w"], torch.tensor([2.0, 4.0]))


def test_fedavg_keeps_dtype_and_accumulates_in_float64():
    # float32 clients [2**24], [1], [1]: the true mean is (16777216 + 2) / 3 = 5592406.
    # Accumulating in float32 loses the +1s (2**24 + 1 == 2**24 in float32) and gives
    # 16777216 / 3 = 5592405.33 -> 5592405.5 in float32; float64 accumulation gives 5592406.
    states = [{"x": torch.tensor([v], dtype=torch.float32)} for v in (2.0**24, 1.0, 1.0)]
    out = A.fedavg(states)["x"]
    assert out.dtype == torch.float32
    assert out.item() == 5592406.0
    h = [{"x": torch.tensor([0.5], dtype=torch.float16)}] * 3
    out = A.fedavg(h)
    assert out["x"].dtype == torch.float16 and out["x"].item() == 0.5


def test_weighted_sum_hand_numbers():
    s0, s1 = _states()
    # 2 * [1, 2] + 0.5 * [3, 6] = [3.5, 7.0]
    torch.testing.assert_close(A.weighted_sum([s0, s1], [2.0, 0.5])["w"], torch.tensor([3.5, 7.0]))


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"w": torch.tensor([1.0, 2.0])}, r"client 1 keys differ.*missing \['n'\]"),
        ({"w": torch.tensor([1.0, 2.0, 3.0]), "n": torch.tensor(1)}, r"client 1 key 'w' has shape"),
        (
            {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "n": torch.tensor(1)},
            r"client 1 key 'w' has dtype",
        ),
        (
            {"w": torch.tensor([1.0, float("nan")]), "n": torch.tensor(1)},
            r"client 1 key 'w'.*non-finite",
        ),
        (
            {"w": torch.tensor([float("inf"), 1.0]), "n": torch.tensor(1)},
            r"client 1 key 'w'.*non-finite",
        ),
    ],
)
def test_fedavg_errors_name_client_and_key(bad, pattern):
    s0, _ = _states()
    with pytest.raises(A.AggregationError, match=pattern):
        A.fedavg([s0, bad])


def test_fedavg_weight_errors():
    s0, s1 = _states()
    with pytest.raises(A.AggregationError, match="2 weights for 1"):
        A.fedavg([s0], weights=[1, 2])
    with pytest.raises(A.AggregationError, match="client 1 weight"):
        A.fedavg([s0, s1], weights=[1, -1])
    with pytest.raises(A.AggregationError, match="sum to 0"):
        A.fedavg([s0, s1], weights=[0, 0])
    with pytest.raises(A.AggregationError, match="no client"):
        A.fedavg([])


def _client_updates(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        {"a": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g)} for _ in range(n)
    ]


def test_coordinate_median_takes_the_middle_value_and_the_mean_of_the_middle_two():
    from fedkt.federated.aggregation import coordinate_median

    states = [{"w": torch.tensor([1.0, -4.0]), "n": torch.tensor([1])},
              {"w": torch.tensor([2.0, 3.0]), "n": torch.tensor([2])},
              {"w": torch.tensor([1e30, 0.0]), "n": torch.tensor([9])}]
    got = coordinate_median(states)
    assert torch.equal(got["w"], torch.tensor([2.0, 0.0])) and got["n"].item() == 2
    even = coordinate_median([*states, {"w": torch.tensor([4.0, 5.0]), "n": torch.tensor([4])}])
    assert torch.equal(even["w"], torch.tensor([3.0, 1.5])) and even["n"].item() == 3
