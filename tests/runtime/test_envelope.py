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
