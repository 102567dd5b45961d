"""Client-side differential privacy in real runs: what leaves a client, and the budget reported."""

from __future__ import annotations

import math

import pytest
import torch

from fedkt.config import ConfigError
from fedkt.federated.payload import loads
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport


class Capture(LocalTransport):
    """The local transport, keeping every (request, reply) pair per client."""

    def __init__(self, root):
        super().__init__(root)
        self.pairs = []

    def exchange(self, requests, timeout):
        replies = super().exchange(requests, timeout)
        self.pairs += [(cid, loads(requests[cid]), loads(replies[cid])) for cid in requests]
        return replies


def _changes(transport):
    """Per training reply: the L2 norm of (uploaded adapter - adapter received)."""
    out = []
    for _, req, rep in transport.pairs:
        if "adapter" in rep:
            sq = sum(((rep["adapter"][k].double() - req["adapter"][k].double()) ** 2).sum()
                     for k in rep["adapter"])
            out.append(math.sqrt(sq))
    return out


def test_uploads_are_clipped_and_noised(make_config):
    plain = make_config(name="plain")
    cap = Capture(default_state_root(plain))
    run_job(plain, cap, quiet=True)
    free = _changes(cap)
    assert min(free) > 0.05  # the clients' changes are far above the clip norm below

    clip = 0.01
    cfg = make_config("differential_privacy.enabled=true", f"differential_privacy.clip_norm={clip}",
                      "differential_privacy.noise_multiplier=1e-6", name="clip")
    cap = Capture(default_state_root(cfg))
    run_job(cfg, cap, quiet=True)
    assert all(abs(n - clip) < 1e-4 for n in _changes(cap))  # clipped to C (noise ~1e-8 * sqrt d)

    z = 2.0
    cfg = make_config("differential_privacy.enabled=true", f"differential_privacy.clip_norm={clip}",
                      f"differential_privacy.noise_multiplier={z}", name="noise")
    cap = Capture(default_state_root(cfg))
    run_job(cfg, cap, quiet=True)
    d = sum(v.numel() for v in next(rep for _, _, rep in cap.pairs
                                    if "adapter" in rep)["adapter"].values())
    # ||clipped change + N(0, (zC)^2 I_d)|| ~ zC sqrt(d) for large d
    for n in _changes(cap):
        assert abs(n / (z * clip * math.sqrt(d)) - 1) < 0.05


def test_budget_is_reported_every_round(make_config):
    cfg = make_config("differential_privacy.enabled=true", "differential_privacy.noise_multiplier=1",
                      "differential_privacy.delta=1e-5", "rounds=2")
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    eps = [r["dp_epsilon"] for r in rows if r["participant"] == "server" and r["split"] == "train"]
    # Replace-adjacency: sensitivity 2C, std zC -> RDP(a) = a / (2 (z/2)^2) = 2a per round.
    # Round 1: min_a 2a + ln(1e5)/(a-1) on the order grid is at a = 3.5: 7 + ln(1e5)/2.5.
    # Round 2: 4a + ln(1e5)/(a-1), best a = 2.5: 10 + ln(1e5)/1.5.
    assert eps[0] == pytest.approx(7 + math.log(1e5) / 2.5, abs=1e-9)
    assert eps[1] == pytest.approx(10 + math.log(1e5) / 1.5, abs=1e-9)


def test_dp_composes_with_secure_aggregation(make_config):
    cfg = make_config("clients.num_clients=3", "rounds=1", "differential_privacy.enabled=true",
                      "differential_privacy.clip_norm=0.05", "differential_privacy.noise_multiplier=0.5",
                      "secure_aggregation.enabled=true", "secure_aggregation.max_weight=64")
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    server = next(r for r in rows if r["participant"] == "server" and r["split"] == "train")
    assert server["clients_replied"] == 3 and server["dp_epsilon"] > 0
    assert torch.isfinite(torch.tensor(server["loss"]))


def test_dp_is_refused_where_uploads_are_not_summed(make_config):
    with pytest.raises(ConfigError, match="differential_privacy.enabled: method 'fedmkt'"):
        make_config("differential_privacy.enabled=true", method="fedmkt")


def _noise_of(cfg, cid: int, n: int = 200_000) -> torch.Tensor:
    """What client ``cid`` uploads for a zero change: its DP noise alone."""
    from pathlib import Path

    from fedkt.methods.base import ClientContext

    ctx = ClientContext(cfg=cfg, cid=cid, rnd=1, step=0, state_dir=Path("unused"))
    zero = {"w": torch.zeros(n)}
    return ctx.privatize(zero, zero)["w"]


def test_distributed_noise_gives_the_sum_the_full_noise(make_config):
    z, clip = 2.0, 0.5
    common = ["clients.num_clients=4", "differential_privacy.enabled=true",
              f"differential_privacy.clip_norm={clip}",
              f"differential_privacy.noise_multiplier={z}", "secure_aggregation.enabled=true"]
    local = make_config(*common, name="local")
    dist = make_config(*common, "differential_privacy.noise=distributed", name="dist")
    sigma = z * clip
    assert _noise_of(local, 0).std().item() == pytest.approx(sigma, rel=0.01)
    each = [_noise_of(dist, cid) for cid in range(4)]
    for noise in each:  # sigma / sqrt(4) per client ...
        assert noise.std().item() == pytest.approx(sigma / 2, rel=0.01)
    # ... independent across clients, so the sum the server unmasks carries sigma
    assert torch.stack(each).sum(0).std().item() == pytest.approx(sigma, rel=0.01)
    # with clients.min_replies: 2, any sum of at least 2 uploads still carries sigma
    two = make_config(*common, "differential_privacy.noise=distributed",
                      "clients.min_replies=2", name="two")
    assert _noise_of(two, 0).std().item() == pytest.approx(sigma / math.sqrt(2), rel=0.01)


def test_distributed_noise_reports_the_sum_and_the_lone_upload(make_config):
    from fedkt.federated.privacy import upload_epsilon

    cfg = make_config("clients.num_clients=3", "rounds=1", "differential_privacy.enabled=true",
                      "differential_privacy.clip_norm=0.05",
                      "differential_privacy.noise_multiplier=2",
                      "differential_privacy.noise=distributed",
                      "secure_aggregation.enabled=true", "secure_aggregation.max_weight=64")
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    server = next(r for r in rows if r["participant"] == "server" and r["split"] == "train")
    assert server["clients_replied"] == 3
    assert server["dp_epsilon"] == upload_epsilon(0.05, 2.0, 1e-5, 1)["dp_epsilon"]
    assert server["dp_epsilon_upload"] == upload_epsilon(0.05, 2 / math.sqrt(3), 1e-5,
                                                         1)["dp_epsilon"]
    assert server["dp_epsilon_upload"] > server["dp_epsilon"]


def test_distributed_noise_is_refused_without_secure_aggregation(make_config):
    with pytest.raises(ConfigError, match="differential_privacy.noise: distributed noise "
                                          "needs secure_aggregation.enabled"):
        make_config("differential_privacy.enabled=true",
                    "differential_privacy.noise=distributed")
