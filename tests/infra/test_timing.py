"""Where a run's time goes: the phases of :mod:`fedkt.infra.timing` in rows, report and suite."""

from __future__ import annotations

import time

import pytest

from fedkt.infra import timing
from fedkt.tracking import breakdown_table, time_breakdown
from tests.support.conformance import conformance


def test_the_outermost_phase_takes_the_time():
    before = timing.clocks()
    with timing.phase("knowledge"):
        time.sleep(0.05)
        with timing.phase("eval"):  # scoring done for the teacher's knowledge
            time.sleep(0.05)
    with timing.phase("eval"):
        time.sleep(0.01)
    spent = timing.phase_seconds(before, timing.clocks())
    assert spent["knowledge_seconds"] >= 0.1  # the inner eval counted as knowledge
    assert 0.01 <= spent["eval_seconds"] < spent["knowledge_seconds"]
    assert set(spent) == {"knowledge_seconds", "eval_seconds"}
    with pytest.raises(ValueError, match="unknown phase 'training'"), timing.phase("training"):
        pass


@pytest.mark.parametrize("name, phases", [
    ("fedavg", {"train", "eval", "comm", "checkpoint"}),
    ("fedmkt", {"train", "eval", "distill", "knowledge", "align"}),
    ("fedcollm", {"train", "eval", "distill"}),
    pytest.param("koala", {"train", "eval", "distill", "knowledge"},  # 20 s, idle AVX2
                 marks=pytest.mark.slow),
])
def test_rows_break_a_run_into_phases_that_add_up_to_its_wall_time(name, phases):
    """Every participant's phases are its own: in the local runtime the clients work while
    the server waits, so summing everyone's phases must stay within the run's wall time
    (it would not if the server also counted its clients' work)."""
    rows = conformance(name).run.rows
    spent = time_breakdown(rows)
    assert spent is not None
    for p in phases:
        assert spent[p] > 0, f"{name}: no time in phase {p!r}"
    covered = sum(spent[p] for p in timing.PHASES)
    assert covered <= spent["wall"] * 1.02 + 0.05, (name, spent)
    assert spent["other"] == pytest.approx(max(0.0, spent["wall"] - covered))
    assert any(k.endswith("_seconds") and r["participant"].startswith("client")
               for r in rows for k in r), "clients report their phases too"
    assert spent["saved"] >= 0.0  # what reused results spared is not in the wall time
    table = breakdown_table([(name, spent)])
    assert table.splitlines()[0].count("|") == len(timing.PHASES) + 5


def test_a_suite_breakdown_sums_and_averages_its_runs():
    """suite.md's per-arm row is the mean over seeds, its 'all runs' row the sum over every
    run; runs without timings are left out of both."""
    from fedkt.tracking import mean_breakdown, sum_breakdown

    a = {"wall": 10.0, "eval": 4.0, "other": 1.0}
    b = {"wall": 30.0, "eval": 8.0, "other": 3.0}
    assert sum_breakdown([a, None, b]) == {"wall": 40.0, "eval": 12.0, "other": 4.0}
    assert mean_breakdown([a, None, b]) == {"wall": 20.0, "eval": 6.0, "other": 2.0}
    assert sum_breakdown([None]) is None and mean_breakdown([]) is None
