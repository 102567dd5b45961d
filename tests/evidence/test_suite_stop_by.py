"""``fedkt suite run --stop-by``: a suite that must end by a time starts no run that its
arm's recorded wall time says would end after it, and the same command goes on later."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from fedkt.cli import main
from fedkt.evidence.deadline import STOPPED_EXIT, clock, parse_stop_by, why_not_start
from fedkt.evidence.suite import load_suite, run_state
from fedkt.evidence.suite_keep import arm_wall
from fedkt.tracking.rows import read_rows, run_wall_time

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("text", "seconds"), [
    ("90m", 5400), ("2h30m", 9000), ("45s", 45), ("1.5h", 5400), ("1h0m30s", 3630),
    ("2026-12-06T12:00Z", 3 * 3600), ("2026-12-06T12:00:00+01:00", 2 * 3600),
])
def test_a_stop_time_is_a_duration_from_now_or_a_time_with_its_zone(text, seconds):
    assert parse_stop_by(text, NOW) == NOW + seconds


@pytest.mark.parametrize(("text", "why"), [
    ("2026-12-06T12:00", "needs its zone"), ("soon", "give a duration"), ("", "give a"),
    ("m", "give a duration"), ("90 minutes", "give a duration"),
])
def test_a_stop_time_it_cannot_read_is_refused_naming_the_flag(text, why):
    with pytest.raises(ValueError, match="--stop-by") as err:
        parse_stop_by(text, NOW)
    assert why in str(err.value)


def test_a_run_starts_only_where_its_arms_wall_time_fits():
    stop = NOW + 600
    assert why_not_start(599.0, stop, NOW) is None
    assert why_not_start(601.0, stop, NOW) == (
        f"its arm's mean wall time here, 601 s, is more than the 600 s left before "
        f"{clock(stop)}")
    assert clock(stop) == "2026-12-06 09:10:00 UTC"
    assert why_not_start(None, stop, NOW) is None  # no finished run of its arm: it starts
    for estimate in (None, 0.0):  # the time has passed: nothing starts
        assert why_not_start(estimate, stop, stop) == (
            "the stop time (2026-12-06 09:10:00 UTC) has passed")


def _suite(tmp_path: Path) -> Path:
    """The quick suite's base, one round, its FedAvg arm alone at two seeds."""
    data = yaml.safe_load((ROOT / "configs" / "suites" / "quick.yaml").read_text())
    data["base"]["rounds"] = 1
    data["arms"] = {"fedavg": {}}
    data.pop("baseline")
    data["primary"] = "fedavg.clients.accuracy > fedavg@0.clients.accuracy"
    data["claims"] = []
    data["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(path: Path, *flags: str) -> int:
    return main(["suite", "run", str(path), "-q", *flags])


def test_a_suite_stops_before_a_run_that_would_not_fit_and_goes_on_later(tmp_path, capsys):
    path = _suite(tmp_path)
    # the time has passed: not even an untimed run starts, and the exit says "go on later"
    assert _run(path, "--jobs", "2", "--stop-by", "2000-01-01T00:00Z") == STOPPED_EXIT
    assert ("fedavg seed 0 not started: the stop time (2000-01-01 00:00:00 UTC) has "
            "passed; 2 run(s) left") in capsys.readouterr().err
    suite = load_suite(path)
    assert not suite.run_dir("fedavg", 0).exists() and arm_wall(suite, "fedavg") is None

    assert _run(path, "--jobs", "2", "--stop-by", "1h") == 0  # untimed runs start: both
    walls = [run_wall_time(read_rows(suite.run_dir("fedavg", s) / "metrics.jsonl"))
             for s in (0, 1)]
    assert arm_wall(suite, "fedavg") == pytest.approx(sum(walls) / 2)

    # seed 0 recorded as a run of an hour, seed 1 to do again: an hour does not fit in 10
    # minutes, so seed 1 is not started and nothing of it is written
    metrics = suite.run_dir("fedavg", 0) / "metrics.jsonl"
    rows = read_rows(metrics)
    scale = 3600.0 / walls[0]
    metrics.write_text("".join(
        json.dumps({**r, "wall_time": r["wall_time"] * scale} if r.get("participant")
                   == "server" and "wall_time" in r else r) + "\n" for r in rows))
    shutil.rmtree(suite.run_dir("fedavg", 1))
    (suite.folder / "suite.md").unlink()
    assert arm_wall(suite, "fedavg") == pytest.approx(3600.0)
    assert _run(path, "--stop-by", "10m") == STOPPED_EXIT
    err = capsys.readouterr().err
    assert "fedavg seed 1 not started: its arm's mean wall time here, 3600 s, is more " in err
    assert "1 run(s) left, the same command goes on" in err
    assert not suite.run_dir("fedavg", 1).exists()
    assert not (suite.folder / "suite.md").exists()  # no table for a stopped suite

    assert _run(path, "--stop-by", "2h") == 0  # it fits in two: the suite finishes
    assert run_state(suite.run_dir("fedavg", 1), 1) == "done"
    assert (suite.folder / "suite.md").is_file()


def test_an_unreadable_stop_time_is_refused_before_anything_runs(tmp_path, capsys):
    path = _suite(tmp_path)
    assert _run(path, "--stop-by", "noon") == 2
    assert "--stop-by 'noon': give a duration" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
