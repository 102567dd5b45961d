"""A suite's wall time from its runs' own spans (``environment.json``): sittings joined
across runs at once, split where the suite stopped, and named in suite.md, suite.json and
docs/results.md."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from fedkt.cli import main
from fedkt.evidence import results
from fedkt.evidence.across import read_suite_result
from fedkt.evidence.suite_report import report_suite
from fedkt.evidence.wall import SITTING_GAP_S, suite_wall


def _at(clock: str, day: str = "2026-12-05") -> str:
    return f"{day}T{clock}+00:00"


def _run(folder: Path, spans: list[list[str]] | None, seed: int = 0) -> Path:
    """A finished run's records: metrics (round 1), config, checkpoint index and, unless
    ``spans`` is None (a run made before runs kept their times), its spans."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"name: {folder.name}\nseed: {seed}\n")
    rows = [{"round": 1, "participant": "server", "split": "test", "accuracy": 0.5 + seed / 10}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "latest.json").write_text('{"round": 1}')
    entry = {"from_round": 1} | ({"spans": spans} if spans is not None else {})
    (folder / "environment.json").write_text(json.dumps([entry]))
    return folder


def test_runs_at_once_are_one_sitting_and_a_stop_starts_another(tmp_path):
    gap = int(SITTING_GAP_S)
    runs = [
        _run(tmp_path / "a", [[_at("09:00:00"), _at("09:30:00")]]),
        _run(tmp_path / "b", [[_at("09:00:05"), _at("09:40:00")]]),  # beside a
        _run(tmp_path / "c", [[_at("09:40:30"), _at("10:00:00")]]),  # 30 s after b
        # resumed: its first process stopped at 10:00:00, the second ran 11:00-11:10
        _run(tmp_path / "d", [[_at("09:59:00"), _at("10:00:00")],
                              [_at("11:00:00"), _at("11:10:00")]]),
        _run(tmp_path / "e", None),  # made before runs kept their times
        _run(tmp_path / "f", [["not a time", _at("12:00:00")]]),  # unreadable: not timed
    ]
    wall = suite_wall(runs)
    assert wall.sittings == [(datetime.fromisoformat(_at("09:00:00")),
                              datetime.fromisoformat(_at("10:00:00"))),
                             (datetime.fromisoformat(_at("11:00:00")),
                              datetime.fromisoformat(_at("11:10:00")))]
    assert (wall.seconds, wall.timed, wall.runs) == (4200.0, 4, 6)
    assert wall.duration() == "1 h 10 min 0 s"
    assert wall.text() == (
        "1 h 10 min 0 s in 2 sitting(s) (2026-12-05 09:00:00-10:00:00, 2026-12-05 "
        "11:00:00-11:10:00 UTC); 2 of its 6 runs recorded no times (made before runs "
        "recorded their spans), so their time is not in it")
    # a gap of exactly SITTING_GAP_S is a stop; one second less is the same sitting
    late = _run(tmp_path / "g", [[_at("10:00:00"), _at("10:00:00")]])
    later = _run(tmp_path / "h", [[f"2026-12-05T10:{gap // 60:02d}:{gap % 60:02d}+00:00",
                                   _at("10:05:00")]])
    assert len(suite_wall([late, later]).sittings) == 2
    sooner = _run(tmp_path / "i", [[f"2026-12-05T10:{(gap - 1) // 60:02d}:"
                                    f"{(gap - 1) % 60:02d}+00:00", _at("10:05:00")]])
    assert len(suite_wall([late, sooner]).sittings) == 1
    night = _run(tmp_path / "j", [[_at("23:30:00"), _at("00:15:00", "2026-12-06")]])
    assert suite_wall([night]).text() == (
        "45 min 0 s in 1 sitting(s) (2026-12-05 23:30:00-2026-12-06 00:15:00 UTC)")
    assert suite_wall([runs[4]]) is None


def test_the_report_the_status_and_the_results_page_give_the_wall_the_runs_recorded(
        tmp_path, capsys):
    suite = {"name": "walled", "seeds": [0, 1], "baseline": "b",
             "base": {"name": "x", "rounds": 1, "method": {"name": "fedavg"},
                      "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
                      "data": {"dataset": {"name": "intent_recognition"}}},
             "arms": {"a": {}, "b": {}}, "metrics": ["accuracy"], "groups": ["server"]}
    folder = tmp_path / "walled"
    folder.mkdir()
    (folder / "suite.yaml").write_text(yaml.safe_dump(suite))
    spans = {("a", 0): ("09:00:00", "09:20:00"), ("b", 0): ("09:00:02", "09:10:00"),
             ("b", 1): ("09:10:03", "09:21:00"), ("a", 1): ("13:00:00", "13:20:00")}
    for (arm, seed), (a, b) in spans.items():
        _run(folder / arm / f"seed_{seed}", [[_at(a), _at(b)]], seed)
    text = report_suite(folder)
    assert ("Wall time: 41 min 0 s in 2 sitting(s) (2026-12-05 09:00:00-09:21:00, "
            "2026-12-05 13:00:00-13:20:00 UTC); from the finished runs' own spans") in text
    wall = json.loads((folder / "suite.json").read_text())["wall"]
    assert (wall["seconds"], wall["timed_runs"], wall["runs"]) == (2460, 4, 4)
    assert wall["sittings"][1] == [_at("13:00:00"), _at("13:20:00")]
    assert main(["suite", "status", str(folder)]) == 0
    assert capsys.readouterr().out.endswith(
        "finished runs' wall time so far: 41 min 0 s in 2 sitting(s) (2026-12-05 "
        "09:00:00-09:21:00, 2026-12-05 13:00:00-13:20:00 UTC)\n")
    def provenance(folder: Path) -> results.Provenance:
        return results.provenance(folder, wall=read_suite_result(folder).wall)

    got = provenance(folder)
    assert got.time == "41 min 0 s in 2 sitting(s), its runs' record"
    # the comment's time stands where a run recorded none; the runs' is then a floor
    (folder / "suite.md").write_text("<!-- `fedkt suite run x` at commit abc1234, 2 h 3 min "
                                     "wall -->\n" + text)
    env = folder / "a" / "seed_1" / "environment.json"
    env.write_text(json.dumps([{"from_round": 1}]))
    report_suite(folder, into=tmp_path / "copy")
    (tmp_path / "copy" / "suite.md").write_text((folder / "suite.md").read_text())
    assert provenance(tmp_path / "copy").time == "2 h 3 min"
    (tmp_path / "copy" / "suite.md").write_text(text)
    assert provenance(tmp_path / "copy").time == (
        "at least 21 min 0 s (3 of its 4 runs recorded their times)")
    # a wall the page could not read is refused by file and field, as every field is
    data = json.loads((tmp_path / "copy" / "suite.json").read_text())
    data["wall"]["timed_runs"] = "3"
    (tmp_path / "copy" / "suite.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"suite.json: wall.timed_runs: expected int, got str"):
        read_suite_result(tmp_path / "copy")
