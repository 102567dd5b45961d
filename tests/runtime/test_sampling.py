"""clients.fraction: a seeded sample of the clients takes part in each round."""

from __future__ import annotations

import pytest

from fedkt.config import ConfigError
from fedkt.runtime.base import default_state_root, sample_clients
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport


def _trained(rows):
    return {(r["round"], r["participant"]) for r in rows
            if r["split"] == "train" and r["participant"] != "server"}


def test_each_round_trains_a_reproducible_sample(make_config):
    cfg = make_config("clients.num_clients=5", "clients.fraction=0.4", "rounds=3")
    samples = [sample_clients(cfg, rnd) for rnd in (1, 2, 3)]
    assert all(len(s) == 2 and len(set(s)) == 2 for s in samples)  # round(0.4 * 5) = 2
    assert len({tuple(s) for s in samples}) > 1  # rounds differ
    assert samples == [sample_clients(cfg, rnd) for rnd in (1, 2, 3)]  # same seed, same draw
    assert samples != [sample_clients(make_config("clients.num_clients=5", "clients.fraction=0.4",
                                                  "rounds=3", "seed=1"), rnd) for rnd in (1, 2, 3)]
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    assert _trained(rows) == {(rnd, f"client_{c}") for rnd, s in enumerate(samples, 1) for c in s}
    server = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
    assert [r["clients_replied"] for r in server] == [2, 2, 2]


def test_sample_is_drawn_from_the_participants_and_at_least_one(make_config):
    cfg = make_config("clients.num_clients=6", "clients.participants=[1, 3, 5]",
                      "clients.fraction=0.1")
    assert all(len(sample_clients(cfg, r)) == 1 and sample_clients(cfg, r)[0] in (1, 3, 5)
               for r in range(1, 10))
    assert sample_clients(make_config("clients.num_clients=3"), 1) == [0, 1, 2]


def test_secure_aggregation_needs_two_clients_per_round(make_config):
    with pytest.raises(ConfigError, match="secure_aggregation.enabled: SecAgg\\+ needs at least 2"):
        make_config("clients.num_clients=3", "clients.fraction=0.3",
                    "secure_aggregation.enabled=true")
