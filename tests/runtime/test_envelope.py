"""The run config every request carries: compact, and the client rebuilds exactly it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedkt.config import load_config, parse_config
from fedkt.runtime.base import client_view, envelope_config

CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").rglob("*.yaml")
                 if "suites" not in p.parts)  # suites are families of run configs


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_client_rebuilds_the_servers_view_from_the_compact_config(path):
    cfg = load_config(path)
    text = envelope_config(cfg)
    assert parse_config(yaml.safe_load(text), "envelope") == client_view(cfg)
    assert len(text) < len(client_view(cfg).to_yaml())


def test_compact_config_lists_only_what_differs(make_config):
    cfg = make_config()
    data = yaml.safe_load(envelope_config(cfg))
    assert "secure_aggregation" not in data and "differential_privacy" not in data
    assert data["method"] == {"name": "fedavg"}
    data = yaml.safe_load(envelope_config(make_config("secure_aggregation.enabled=true")))
    assert data["secure_aggregation"] == {"enabled": True}


def test_timing_metrics_travel_at_a_fixed_width_and_are_logged(make_config, monkeypatch):
    """A handler's ``*_seconds`` metrics (FedKD's step and SVD times) must not make a
    reply's size depend on how long the work took; the server still logs them."""
    from fedkt.config import method_catalog as catalog
    from fedkt.federated.payload import Payload
    from fedkt.methods.base import Method, Server
    from fedkt.methods.fedavg.config import FedAvgConfig
    from fedkt.runtime.base import RuntimeClients
    from fedkt.runtime.local import LocalTransport

    took = iter([0.1, 123.456789012, 7.0])

    def timed(ctx, msg):
        return Payload(metrics={"train/loss": 1.0, "train/step_seconds": next(took)})

    method = Method("timed", FedAvgConfig, Server, {"train": timed})
    monkeypatch.setitem(catalog._REGISTRY, "fedavg", method)  # the config names fedavg
    cfg = make_config()
    clients = RuntimeClients(cfg, LocalTransport(cfg.run_dir / "clients"))
    sizes, logged = [], []
    for rnd in (1, 2, 3):
        clients.start_round(rnd)
        clients.call("train", {0: Payload()})
        sizes.append(clients.traffic.received[0])
        logged.append(clients.traffic.metrics[0])
    assert len(set(sizes)) == 1, sizes
    assert [m["train/step_seconds"] for m in logged] == [0.1, 123.456789, 7.0]
    assert all(m["train/loss"] == 1.0 for m in logged)
