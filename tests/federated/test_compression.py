"""FedKD SVD compression (Eqs. 8-9) on constructed spectra and matrices."""

from __future__ import annotations

import pytest
import torch

from fedkt.federated import compression as C
from tests.conftest import load_benchmark

# sigma = [3, 2, 1]: energies 9, 4, 1 (total 14); prefix ratios
#   k=1: 9/14 = 0.642857, k=2: 13/14 = 0.928571, k=3: 14/14 = 1
SIGMA = torch.tensor([3.0, 2.0, 1.0])


@pytest.mark.parametrize(("T", "k"), [(0.6, 1), (0.9, 2), (0.95, 3), (1.0, 3)])
def test_energy_rank_smallest_k_by_hand(T, k):
    assert C.energy_rank(SIGMA, T) == k


def test_energy_rank_uses_squared_sigma_not_sigma():
    # with plain sigma the ratios would be 3/6 = 0.5, 5/6 = 0.833, 1 -> T = 0.9 needs k = 3;
    # with sigma^2 (Eq. 8) 13/14 = 0.93 > 0.9 already at k = 2
    assert C.energy_rank(SIGMA, 0.9) == 2


def test_energy_rank_strict_vs_inclusive_at_exact_tie():
    # T = 9/14 exactly: strict ">" (paper) needs k = 2, ">=" accepts k = 1
    assert C.energy_rank(SIGMA, 9 / 14) == 2
    assert C.energy_rank(SIGMA, 9 / 14, strict=False) == 1
    # T = 0: strict needs one value (ratio 9/14 > 0), inclusive accepts k = 0
    assert C.energy_rank(SIGMA, 0.0) == 1
    assert C.energy_rank(SIGMA, 0.0, strict=False) == 0


def test_energy_rank_order_zero_and_bad_threshold():
    assert C.energy_rank(torch.tensor([1.0, 3.0, 2.0]), 0.9) == 2
    assert C.energy_rank(torch.zeros(4), 0.95) == 0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        C.energy_rank(SIGMA, 1.5)


def test_threshold_schedule_endpoints_and_official():
    # endpoints: fraction t / (R - 1); R = 4 -> 0.95, 0.96, 0.97, 0.98
    assert C.threshold_schedule(0, 4) == pytest.approx(0.95)
    assert C.threshold_schedule(1, 4) == pytest.approx(0.96)
    assert C.threshold_schedule(3, 4) == pytest.approx(0.98)
    assert C.threshold_schedule(0, 1) == pytest.approx(0.98)
    # official code: fraction (t + 1) / R; t = 0 -> 0.95 + 0.03 / 4 = 0.9575
    assert C.threshold_schedule(0, 4, convention="official") == pytest.approx(0.9575)
    assert C.threshold_schedule(3, 4, convention="official") == pytest.approx(0.98)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        C.threshold_schedule(4, 4)


@pytest.mark.parametrize("T", [0.5, 0.8, 0.95, 0.99])
def test_reconstruction_error_bounded_by_one_minus_T(T):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 24, generator=g, dtype=torch.float64)
    c = C.svd_compress(a, T)
    err = (C.svd_reconstruct(c) - a).pow(2).sum() / a.pow(2).sum()
    assert err.item() <= 1 - T + 1e-12
    # and the kept rank is the smallest one: dropping one more value breaks the bound
    k = c.rank
    assert k is not None and 0 < k <= 24
    s = torch.linalg.svdvals(a)
    assert (s[: k - 1].pow(2).sum() / s.pow(2).sum()).item() <= T


def test_conv_weight_round_trip():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 4, 3, 3, generator=g)
    c = C.svd_compress(w, 1.0)  # full energy -> full rank min(8, 36) = 8
    assert c.U is not None and tuple(c.U.shape) == (8, 8) and tuple(c.Vh.shape) == (8, 36)
    back = C.svd_reconstruct(c)
    assert back.shape == w.shape and back.dtype == w.dtype
    torch.testing.assert_close(back, w, atol=1e-5, rtol=1e-5)
    low = C.svd_compress(w, 0.5)
    assert low.rank is not None and low.rank < 8
    assert C.svd_reconstruct(low).shape == (8, 4, 3, 3)


def test_rank_deficient_matrix_keeps_true_rank():
    g = torch.Generator().manual_seed(2)
    u, v = torch.randn(30, 2, generator=g), torch.randn(2, 20, generator=g)
    a = u @ v  # rank 2
    c = C.svd_compress(a, 0.999)
    assert c.rank == 2
    torch.testing.assert_close(C.svd_reconstruct(c), a, atol=1e-4, rtol=1e-4)


def test_zero_matrix_rank_zero_no_nan():
    c = C.svd_compress(torch.zeros(6, 5), 0.95)
    assert c.rank == 0
    out = C.svd_reconstruct(c)
    assert torch.equal(out, torch.zeros(6, 5))


def test_one_d_and_integer_tensors_stay_raw():
    state = {"bias": torch.arange(3.0), "steps": torch.tensor(7)}
    comp = C.compress_state(state, 0.9)
    assert not comp["bias"].is_factored and not comp["steps"].is_factored
    out = C.decompress_state(comp)
    assert torch.equal(out["bias"], state["bias"]) and out["steps"].item() == 7


def test_nan_raises_clear_error_naming_parameter():
    bad = torch.ones(4, 4)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"'layer1\.weight'.*NaN"):
        C.compress_state({"layer1.weight": bad}, 0.9)


def test_float64_fallback_then_lowrank(monkeypatch):
    real_svd = torch.linalg.svd
    calls: list[torch.dtype] = []

    def flaky(mat, full_matrices=True):
        calls.append(mat.dtype)
        if mat.dtype == torch.float32:
            raise torch.linalg.LinAlgError("simulated: the algorithm failed to converge")
        return real_svd(mat, full_matrices=full_matrices)

    monkeypatch.setattr(torch.linalg, "svd", flaky)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(12, 7, generator=g)
    c = C.svd_compress(a, 1.0)
    assert calls == [torch.float32, torch.float64] and c.method == "float64"
    torch.testing.assert_close(C.svd_reconstruct(c), a, atol=1e-5, rtol=1e-5)

    def broken(mat, full_matrices=True):
        # LAPACK fails on the full 12 x 7 matrix in both precisions; svd_lowrank's
        # small projected 7 x 7 problem still goes through
        if tuple(mat.shape) == (12, 7):
            raise torch.linalg.LinAlgError("simulated failure")
        return real_svd(mat, full_matrices=full_matrices)

    monkeypatch.setattr(torch.linalg, "svd", broken)
    c = C.svd_compress(a, 1.0)
    assert c.method == "lowrank"
    torch.testing.assert_close(C.svd_reconstruct(c), a, atol=1e-4, rtol=1e-4)

    def lowrank_broken(*args, **kwargs):
        raise RuntimeError("simulated lowrank failure")

    monkeypatch.setattr(torch, "svd_lowrank", lowrank_broken)
    with pytest.raises(C.SVDError, match="'fc.weight'"):
        C.svd_compress(a, 1.0, name="fc.weight")


def test_payload_round_trip_and_bytes():
    g = torch.Generator().manual_seed(4)
    low = torch.randn(64, 2, generator=g) @ torch.randn(2, 32, generator=g)  # rank 2
    state = {"fc.weight": low, "fc.bias": torch.randn(64, generator=g), "tiny": torch.eye(2)}
    comp = C.compress_state(state, 0.999)
    assert comp["fc.weight"].rank == 2
    # factors: (64 * 2 + 2 + 2 * 32) floats * 4 bytes = 194 * 4 = 776 bytes
    assert comp["fc.weight"].nbytes == 776
    # tiny 2x2 identity: factors 2*2 + 2 + 2*2 = 10 floats > 4 raw floats -> sent raw
    assert not comp["tiny"].is_factored
    # total 776 + 64 * 4 (bias) + 4 * 4 (tiny) = 776 + 256 + 16 = 1048
    assert C.compressed_nbytes(comp) == 1048
    assert C.dense_nbytes(state) == (64 * 32 + 64 + 4) * 4
    payload = C.to_payload(comp)
    assert set(payload) == {
        "fc.weight::shape",
        "fc.weight::U",
        "fc.weight::S",
        "fc.weight::Vh",
        "fc.bias::shape",
        "fc.bias::raw",
        "tiny::shape",
        "tiny::raw",
    }
    back = C.decompress_state(C.from_payload(payload))
    torch.testing.assert_close(back["fc.weight"], low, atol=1e-4, rtol=1e-4)
    assert torch.equal(back["fc.bias"], state["fc.bias"])
    del payload["fc.weight::Vh"]
    with pytest.raises(ValueError, match=r"'fc.weight' lacks \['Vh'\]"):
        C.from_payload(payload)


def test_benchmark_measure_rows_by_hand():
    bench = load_benchmark("svd_compression")
    g = torch.Generator().manual_seed(5)
    rank2 = torch.randn(20, 2, generator=g) @ torch.randn(2, 10, generator=g)
    rounds = [{"w": rank2, "b": torch.ones(10)}, {"w": rank2, "b": torch.ones(10)}]
    rows = bench.measure(rounds, lambda t, n: C.threshold_schedule(t, n))
    assert [r["T"] for r in rows if r["param"] == "__total__"] == pytest.approx([0.95, 0.98])
    w0 = next(r for r in rows if r["round"] == 0 and r["param"] == "w")
    # rank 2 factors: (20 * 2 + 2 + 2 * 10) * 4 bytes = 62 * 4 = 248; dense 200 * 4 = 800
    assert (w0["rank"], w0["full_rank"]) == (2, 10)
    assert (w0["dense_bytes"], w0["compressed_bytes"]) == (800, 248)
    assert w0["ratio"] == pytest.approx(800 / 248)
    assert w0["rel_error"] < 1e-10
    total0 = next(r for r in rows if r["round"] == 0 and r["param"] == "__total__")
    # + bias 10 floats raw = 40 bytes each way: 840 dense, 288 sent
    assert (total0["dense_bytes"], total0["compressed_bytes"]) == (840, 288)
    with pytest.raises(ValueError, match="1 thresholds for 2 rounds"):
        bench.measure(rounds, [0.9])
