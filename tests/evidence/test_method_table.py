"""The cross-method table (fedkt.evidence.method_table) on hand-made run folders: which
participant each column reads, per-client per-round bytes and compute, paired deltas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedkt.config import ConfigError
from fedkt.evidence.suite import load_suite
from fedkt.evidence.suite_report import report_suite


def _run(folder: Path, method: str, server_acc: float | None, client_acc: float | None,
         up: int, down: int, client_s: float, server_s: float) -> None:
    """Two rounds; client c sends ``up * (c + 1)`` and spends ``client_s * (c + 1)`` s."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"name": folder.parent.name, "seed": 0,
                                                         "method": {"name": method}}))
    rows = []
    for rnd in (1, 2):
        rows.append({"round": rnd, "participant": "server", "split": "train",
                     "compute_cpu": server_s, "wall_time": 99.0})
        for c in range(2):
            rows.append({"round": rnd, "participant": f"client_{c}", "split": "train",
                         "bytes_sent": up * (c + 1), "bytes_received": down,
                         "compute_cpu": client_s * (c + 1), "wall_time": 99.0})
    if server_acc is not None:
        rows.append({"round": 2, "participant": "server", "split": "test",
                     "accuracy": server_acc})
    if client_acc is not None:
        rows += [{"round": 2, "participant": f"client_{c}", "split": "test",
                  "accuracy": client_acc} for c in range(2)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "latest.json").write_text('{"round": 2}')


def _suite(tmp_path: Path, read: dict) -> Path:
    suite = {"name": "cmp", "seeds": [0],
             "base": {"name": "x", "rounds": 2, "method": {"name": "fedavg"},
                      "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
                      "data": {"dataset": {"name": "intent_recognition"}},
                      "eval": {"round0": False}},
             "arms": {"zero_shot": {"method": {"name": "zero_shot"}},
                      "standalone": {"method": {"name": "standalone"}},
                      "fedavg": {}, "fedmkt": {"method": {"name": "fedmkt"}}},
             "metrics": ["accuracy"],
             "comparison": {"server_baseline": "zero_shot", "clients_baseline": "standalone",
                            "read": read}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    return tmp_path / "suite.yaml"


def test_table_reads_columns_where_told_and_counts_per_client_per_round(tmp_path):
    _suite(tmp_path, {"fedavg": {"server": None, "clients": "server"},
                      "standalone": {"server": None}})
    _run(tmp_path / "zero_shot" / "seed_0", "zero_shot", 0.30, 0.10, 50, 50, 1.0, 0.0)
    _run(tmp_path / "standalone" / "seed_0", "standalone", None, 0.40, 100, 200, 2.0, 0.0)
    _run(tmp_path / "fedavg" / "seed_0", "fedavg", 0.55, 0.55, 1000, 1000, 3.0, 0.5)
    _run(tmp_path / "fedmkt" / "seed_0", "fedmkt", 0.80, 0.60, 4000, 3000, 5.0, 7.0)
    text = report_suite(tmp_path)
    rows = {r["arm"]: r for r in json.loads((tmp_path / "comparison.json").read_text())}
    # FedAvg's clients column is its server participant; its server column is empty.
    assert rows["fedavg"]["server"] is None
    assert rows["fedavg"]["clients"]["value"] == pytest.approx(0.55)
    assert rows["fedavg"]["clients"]["delta"]["estimate"] == pytest.approx(0.15)
    assert rows["fedmkt"]["server"]["delta"]["estimate"] == pytest.approx(0.50)
    assert rows["fedmkt"]["clients"]["delta"]["estimate"] == pytest.approx(0.20)
    assert rows["zero_shot"]["server"]["delta"] is None  # the baseline itself
    # Per client and round: clients send up*(1, 2) each round -> mean 1.5 * up.
    assert rows["fedmkt"]["bytes_up"] == pytest.approx(6000)
    assert rows["fedmkt"]["bytes_down"] == pytest.approx(3000)
    assert rows["fedmkt"]["bytes_down_round1"] == pytest.approx(3000)
    assert rows["fedmkt"]["client_compute"] == pytest.approx(7.5)
    assert rows["fedmkt"]["server_compute"] == pytest.approx(7.0)
    assert rows["fedmkt"]["server_sees"] == "SLM top-K logits on public data"
    assert rows["standalone"]["server_sees"] == "nothing"
    section = text.split("## Comparison")[1]
    assert "| fedmkt | 0.800 | +0.500 [+0.500, +0.500] | 0.600 | +0.200" in section
    assert "6.00 kB" in section and "7.5" in section
    for name in ("comparison_bytes.png", "comparison_compute.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 5_000


def test_unknown_arm_or_column_is_refused_naming_the_key(tmp_path):
    path = _suite(tmp_path, {"fedprox": {"clients": "server"}})
    with pytest.raises(ConfigError, match=r"comparison.read: 'fedprox' is not an arm"):
        load_suite(path)
    path = _suite(tmp_path, {"fedavg": {"llm": "server"}})
    with pytest.raises(ConfigError, match=r"comparison.read.fedavg: unknown column 'llm'"):
        load_suite(path)
