"""The commands that made a suite folder: recorded, carried by ``fedkt suite keep``, named
by the report, refused where malformed, and read by docs/results.md where a published
folder's comment states no provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedkt.evidence import results
from fedkt.evidence.across import read_suite_result
from fedkt.evidence.invocations import (
    INVOCATIONS_FILE,
    commands_text,
    keep_invocations,
    read_invocations,
    record_invocation,
)
from fedkt.evidence.suite_report import report_suite

ENV = {"from_round": 1, "torch": "2.13.0+cpu", "transformers": "5.25.0", "peft": "0.21.2",
       "code": "ab" * 32, "commit": "26c26ed6e085bc8b2372cf2de13c95cd5b785b33",
       "cpu_capability": "AVX512", "cpu_flags": ["avx512_bf16"], "cpu_model": "AMD EPYC",
       "precision": "auto", "autocast": "bf16"}


def _suite(folder: Path) -> Path:
    """A two-arm, two-seed suite folder whose four runs finished, 09:00-09:41 UTC."""
    suite = {"name": "recorded", "seeds": [0, 1], "baseline": "b",
             "base": {"name": "x", "rounds": 1, "method": {"name": "fedavg"},
                      "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
                      "data": {"dataset": {"name": "intent_recognition"}}},
             "arms": {"a": {}, "b": {}}, "metrics": ["accuracy"], "groups": ["server"]}
    folder.mkdir()
    (folder / "suite.yaml").write_text(yaml.safe_dump(suite))
    for i, (arm, seed) in enumerate([("a", 0), ("b", 0), ("a", 1), ("b", 1)]):
        run = folder / arm / f"seed_{seed}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"name: {arm}\nseed: {seed}\n")
        row = {"round": 1, "participant": "server", "split": "test", "accuracy": 0.5 + i / 10}
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "latest.json").write_text('{"round": 1}')
        span = [f"2026-12-05T09:{10 * i:02d}:00+00:00", f"2026-12-05T09:{10 * i + 11:02d}:00+00:00"]
        (run / "environment.json").write_text(json.dumps([{**ENV, "spans": [span]}]))
    return folder


def test_the_commands_are_kept_in_order_named_by_the_report_and_read_by_the_page(tmp_path):
    folder = _suite(tmp_path / "s")
    first = record_invocation(folder, "fedkt suite run suites/x --jobs 2")
    second = record_invocation(folder, "fedkt suite run suites/x --jobs 2")  # resumed
    third = record_invocation(folder, "fedkt suite run suites/x --jobs 1")
    assert read_invocations(folder) == [first, second, third]
    text = report_suite(folder)
    assert (f"- run by: {commands_text([first])}; then `fedkt suite run suites/x --jobs 1` ("
            in text) and commands_text([first]).startswith("`fedkt suite run suites/x --jobs "
                                                           "2` (2026-")
    # fedkt suite keep carries them: merged with what the kept folder holds, in time order
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / INVOCATIONS_FILE).write_text(json.dumps(
        {"command": "fedkt suite run suites/x", "started": "2026-12-01T08:00:00+00:00"}) + "\n")
    keep_invocations(folder, kept)
    keep_invocations(folder, kept)  # twice: nothing added the second time
    assert [e["command"] for e in read_invocations(kept)] == [
        "fedkt suite run suites/x", first["command"], second["command"], third["command"]]
    # published without a comment: the page takes command, commit, CPU and dates from the
    # runs' record; a comment's own statement wins where it makes one
    got = read_suite_result(folder)
    assert got.commands == [first, second, third]
    prov = results.provenance(folder, got.environment, got.wall, got.commands)
    assert prov.command == ("fedkt suite run suites/x --jobs 2` then `fedkt suite run "
                            "suites/x --jobs 1")
    assert (prov.commit, prov.machine, prov.date) == (
        "26c26ed", "AMD EPYC (its runs' record)", "2026-12-05 09:00:00-09:41:00 UTC")
    assert prov.time == "41 min 0 s in 1 sitting(s), its runs' record"
    partial = {**got.wall, "timed_runs": 3}  # a run without times: its dates are not known
    assert results.provenance(folder, got.environment, partial, got.commands).date == (
        results.NOT_RECORDED)
    table = folder / "suite.md"
    table.write_text("<!-- `fedkt suite run suites/y` at commit 1234567, 2026-12-04 10:00 UTC, "
                     "a 2-core Intel Xeon with AMX; 41 min wall -->\n" + table.read_text())
    prov = results.provenance(folder, got.environment, got.wall, got.commands)
    assert (prov.command, prov.commit, prov.machine, prov.date) == (
        "fedkt suite run suites/y", "1234567", "a 2-core Intel Xeon with AMX",
        "2026-12-04 10:00 UTC")


def test_a_malformed_record_is_refused_by_file_line_and_field(tmp_path):
    folder = _suite(tmp_path / "s")
    path = folder / INVOCATIONS_FILE
    path.write_text('{"command": "fedkt suite run x", "started": "2026-12-05T09:00:00+00:00"}\n'
                    '{"command": "fedkt suite run x"}\n')
    with pytest.raises(ValueError, match=r"invocations.jsonl: line 2.started: expected str, "
                                         r"got NoneType"):
        read_invocations(folder)
    path.write_text('{"command": "x", "started": "yesterday"}\n')
    with pytest.raises(ValueError, match=r"line 1.started: not an ISO 8601 time: 'yesterday'"):
        report_suite(folder)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match=r"invocations.jsonl: line 1: not JSON"):
        read_invocations(folder)
    path.unlink()
    report_suite(folder)
    data = json.loads((folder / "suite.json").read_text())
    assert "commands" not in data  # nothing recorded: nothing claimed
    data["commands"] = [{"command": 3, "started": "2026-12-05T09:00:00+00:00"}]
    (folder / "suite.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"suite.json: commands.command: expected str, got int"):
        read_suite_result(folder)
