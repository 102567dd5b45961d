"""Summed metrics (bytes, wall time) in comparisons and claims: ``bytes_total`` and
clients that were not evaluated (FedKD's "bytes per client <= 0.2 x teacher FedAvg")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.evidence.claims import parse_claim, verdict
from fedkt.evidence.runs import Group, compare, measure, open_run


def _run(folder: Path, seed: int, up: int, down: int, evaluated_clients: bool) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"name: {folder.name}\nseed: {seed}\n")
    rows = [{"round": 0, "participant": "server", "split": "test", "accuracy": 0.5}]
    for rnd in (1, 2):
        rows.append({"round": rnd, "participant": "server", "split": "test", "accuracy": 0.6})
        for c in range(3):
            rows.append({"round": rnd, "participant": f"client_{c}", "split": "train",
                         "bytes_sent": up * (c + 1), "bytes_received": down})
            if evaluated_clients:
                rows.append({"round": rnd, "participant": f"client_{c}", "split": "test",
                             "accuracy": 0.7})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_bytes_total_counts_every_logged_client(tmp_path):
    small = open_run(_run(tmp_path / "fedkd", 0, 10, 5, evaluated_clients=True))
    big = open_run(_run(tmp_path / "fedavg", 0, 100, 100, evaluated_clients=False))
    # per client summed over 2 rounds: up 10/20/30 x 2, down 5 x 2 -> mean 40 + 10
    assert measure(small, "clients", "bytes_total") == pytest.approx(50.0)
    assert measure(small, "clients", "bytes_sent") == pytest.approx(40.0)
    assert measure(big, "clients", "bytes_total") == pytest.approx(400.0 + 200.0)
    assert measure(big, "client_2", "bytes_received") == pytest.approx(200.0)
    claim = parse_claim("fedkd.clients.bytes_total <= 0.2 * fedavg.clients.bytes_total")
    d, _ = compare(Group([small]), Group([big]), "clients", "bytes_total",
                   factor=claim.factor, offset=claim.offset)
    assert d.estimate == pytest.approx(50 - 0.2 * 600)
    assert verdict(claim, d.low, d.high) == "reproduced"
    claim = parse_claim("fedkd.clients.bytes_total <= 0.05 * fedavg.clients.bytes_total")
    d, _ = compare(Group([small]), Group([big]), "clients", "bytes_total", factor=claim.factor)
    assert verdict(claim, d.low, d.high) == "contradicted"


def test_suite_report_without_round0(tmp_path):
    # eval.round0: false (the FedKD suite) leaves no round-0 row; the report skips it.
    import yaml

    from fedkt.evidence.suite_report import report_suite

    # Two seeds: a run-level number (bytes) with a zero-width interval is decided only when
    # at least 2 seeds gave it identically (docs/evidence.md, "How verdicts are decided").
    suite = {"name": "noround0", "seeds": [0, 1], "baseline": "fedavg",
             "base": {"name": "x", "rounds": 2, "method": {"name": "fedavg"},
                      "clients": {"num_clients": 3, "models": [{"name": "tiny-llama"}]},
                      "data": {"dataset": {"name": "intent_recognition"}},
                      "eval": {"round0": False}},
             "arms": {"fedkd": {}, "fedavg": {}}, "metrics": ["accuracy", "bytes_total"],
             "claims": ["fedkd.clients.bytes_total <= 0.2 * fedavg.clients.bytes_total"]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    for (arm, (up, down)), seed in [(a, s) for a in {"fedkd": (10, 5), "fedavg": (100, 100)}
                                    .items() for s in (0, 1)]:
        run = _run(tmp_path / arm / f"seed_{seed}", seed, up, down, evaluated_clients=True)
        rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if r["round"] != 0]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "latest.json").write_text('{"round": 2}')
    text = report_suite(tmp_path)
    assert "round 0" not in text and "| fedkd |" in text
    assert "| reproduced |" in text.split("## Claims")[1]
