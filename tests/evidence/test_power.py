"""``fedkt suite power``: folds needed for a target floor and half-width, the item SE, the
runs and hours, and a suite's design-targets table, with answers computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.cli import main
from fedkt.evidence.power import claim_power, floor_factor, folds_needed, item_se, seed_split
from fedkt.evidence.suite_report import target_rows

Z = 1.959963984540054


def test_folds_for_a_half_width_by_hand():
    # t(0.975, K-1) * 0.1 / sqrt(K) <= 0.1: K=6 gives 2.571/2.449 = 1.050, K=7 2.447/2.646
    # = 0.925, so 7 folds
    assert folds_needed(0.1, 0.1) == 7
    assert folds_needed(1e-6, 0.1) == 4  # never below the verdict's 4 folds
    assert folds_needed(0.0, 0.1) == 4


def test_folds_for_a_floor_by_hand():
    # floor = 1.4294 * t * sd / sqrt(K) <= 0.1 with sd 0.1: t / sqrt(K) <= 0.6996;
    # K=10: 2.262/3.162 = 0.715, K=11: 2.228/3.317 = 0.672, so 11 folds
    assert floor_factor() == pytest.approx(1 + 0.8416212335729143 / Z)
    assert folds_needed(0.1, 0.1, factor=floor_factor()) == 11


def test_item_se_from_the_bootstrap_by_hand():
    assert item_se(Z * 0.05, 1, None) == pytest.approx(0.05)
    # 4 folds, fold SD 0.1, item SE 0.05: the bootstrap's variance (0.01 * 3/4 + 0.0025) / 4
    # = 0.0025, its half-width 1.96 * 0.05
    assert item_se(Z * 0.05, 4, 0.1) == pytest.approx(0.05)
    assert item_se(0.01, 4, 0.5) == 0.0  # noise larger than the interval: none left


def test_one_fold_gives_a_lower_bound():
    got = claim_power("a.server.accuracy > b.server.accuracy", [0.2], 0.2 - Z * 0.05,
                      0.2 + Z * 0.05, 0.14, 0.10, 0.06)
    assert got.fold_sd is None and got.lower_bound and got.item_se == pytest.approx(0.05)
    assert got.folds_for_half == folds_needed(0.05, 0.06)


def _pilot(root: Path) -> Path:
    folder = root / "pilot"
    folder.mkdir()
    per = {"0": 0.1, "1": 0.3, "2": 0.2, "3": 0.0}  # SD 0.1291
    claim = {"claim": "a.server.accuracy > b.server.accuracy", "role": "primary",
             "estimate": "+0.1500", "ci": "[+0.0500, +0.2500]", "verdict": "fragile",
             "reason": "x", "per_seed": per, "floor": 0.2,
             "per_seed_text": "+0.100, +0.300, +0.200, +0.000"}
    (folder / "suite.json").write_text(json.dumps({
        "name": "p", "seeds": [0, 1, 2, 3], "claims": [claim],
        "table": [{"arm": "round 0 (a@0)"}, {"arm": "a"}, {"arm": "b"}]}))
    (folder / "suite.md").write_text(
        "# Suite p\n\n## Where the time went\n\n| | wall (s) | eval (s, %) |\n|---|---:|---:|\n"
        "| a | 1800.0 | 1.0 (0%) |\n| b | 900.0 | 1.0 (0%) |\n| all runs | 10800.0 | 8 |\n")
    return folder


def test_power_command_by_hand(tmp_path, capsys):
    folder = _pilot(tmp_path)
    assert main(["suite", "power", str(folder), "--target-floor", "0.2",
                 "--half-width", "0.1"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("| a.server"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    sd = 0.12909944487358055
    assert cells[1:3] == ["4", f"{sd:.3f}"]
    k_floor = folds_needed(sd, 0.2, factor=floor_factor())
    k_half = folds_needed(sd, 0.1)
    # by hand: floor t/sqrt(K) <= 0.2 / (1.4294 * 0.1291) = 1.084: K=5 1.241, K=6 1.050;
    # half-width t/sqrt(K) <= 0.1 / 0.1291 = 0.775: K=8 0.836, K=9 0.769
    assert (k_floor, k_half) == (6, 9)
    assert cells[4:6] == ["-", "-"]  # one seed a fold: no seed split
    assert cells[7:10] == ["6", "9", "9 x 1"]
    # runs: 9 folds x 1 seed x 2 arms; hours: 9 folds x (1800 + 900) s a fold
    assert cells[10:] == ["18", f"{9 * 2700 / 3600:.1f}"]
    assert "0.75 h per fold" in out


def test_power_refuses_bad_targets(tmp_path, capsys):
    folder = _pilot(tmp_path)
    assert main(["suite", "power", str(folder), "--half-width", "-1"]) == 2
    assert "positive" in capsys.readouterr().err


def test_design_targets_table():
    verdicts = [{"claim": "x", "floor": 0.08, "half_width": 0.07},
                {"claim": "y", "parts": [{"claim": "y1", "floor": 0.12, "half_width": 0.05},
                                         {"claim": "y2", "floor": 0.09, "half_width": 0.06}]},
                {"claim": "not run"}]
    rows = target_rows(0.10, 0.06, verdicts)
    assert rows == [["x", "0.080", "0.100", "yes", "0.070", "0.060", "no"],
                    ["y1", "0.120", "0.100", "no", "0.050", "0.060", "yes"],
                    ["y2", "0.090", "0.100", "yes", "0.060", "0.060", "yes"]]
    assert verdicts[0]["targets"] == {"floor": 0.10, "floor_met": True, "half_width": 0.06,
                                      "half_width_met": False}
    assert target_rows(None, None, verdicts) == []


def test_a_part_declared_again_alone_gets_one_design_targets_row():
    """A suite that declares a joint primary and then its parts one at a time: each part
    once in the table, every verdict still given its targets."""
    part = {"floor": 0.13, "half_width": 0.09}
    verdicts = [{"claim": "a and b", "parts": [{"claim": "a", **part},
                                               {"claim": "b", "floor": 0.01, "half_width": 0.01}]},
                {"claim": "a", **part}, {"claim": "c", "floor": 0.05, "half_width": 0.03}]
    rows = target_rows(0.10, 0.06, verdicts)
    assert [r[0] for r in rows] == ["a", "b", "c"]
    assert rows[0] == ["a", "0.130", "0.100", "no", "0.090", "0.060", "no"]
    assert verdicts[1]["targets"]["floor_met"] is False


def test_a_part_declared_again_alone_gets_one_power_row(tmp_path):
    """`fedkt suite power` on a suite with a joint claim whose first part is also declared
    alone: each part once, in the order first met (it listed the part twice)."""
    from fedkt.evidence.power import pilot_power

    A, B = "a.server.accuracy > c.server.accuracy", "b.server.accuracy >= c.server.accuracy"
    D = "d.server.accuracy > c.server.accuracy"
    folder = tmp_path / "pilot"
    folder.mkdir()

    def one(text: str, per: str) -> dict:
        return {"claim": text, "estimate": "+0.1", "ci": "[+0.05, +0.15]", "floor": 0.1,
                "per_seed_text": per, "verdict": "x", "reason": "x"}

    a, b = one(A, "+0.10, +0.12, +0.08, +0.10"), one(B, "+0.01, +0.02, +0.00, +0.01")
    claims = [{"claim": f"{A} and {B}", "role": "primary", "verdict": "x", "reason": "x",
               "estimate": "+0.1; +0.01", "ci": "-", "parts": [a, b]},
              {**a, "role": "secondary"}, {**one(D, "+0.3, +0.2, +0.3, +0.2"), "role": "secondary"}]
    (folder / "suite.json").write_text(json.dumps({"name": "p", "seeds": [0, 1, 2, 3],
                                                   "claims": claims, "table": []}))
    rows, _ = pilot_power(folder, 0.10, 0.06)
    assert [r.claim for r in rows] == [A, B, D]


PER_RUN = {"0": {"1000": 0.1, "2000": 0.3}, "1": {"1001": 0.5, "2001": 0.5},
           "2": {"1002": 0.2, "2002": 0.4}}


def test_seed_split_by_hand():
    # within: fold 0 mean 0.2, squares 0.01 + 0.01; fold 1 none; fold 2 0.01 + 0.01:
    # 0.04 over 3 degrees of freedom. Fold means 0.2, 0.5, 0.3: variance 0.023333, less
    # 0.013333 / 2 seeds = 0.016667 between folds
    got = seed_split(PER_RUN)
    assert got.seed_sd == pytest.approx((0.04 / 3) ** 0.5)
    assert got.between_sd == pytest.approx(0.016667 ** 0.5, rel=1e-4)
    assert got.seeds_per_fold == 2
    assert got.fold_sd(2) == pytest.approx(0.023333 ** 0.5, rel=1e-4)  # the pilot's own
    assert got.fold_sd(4) == pytest.approx(0.02 ** 0.5, rel=1e-4)
    one = seed_split({"0": {"1": 0.1, "2": 0.3}})
    assert one.between_sd is None and one.fold_sd(4) is None
    assert seed_split({"0": {"1": 0.1}, "1": {"2": 0.3}}) is None  # no fold with 2 seeds
    # a fold that varies less than its seeds say: no between-fold part, not a negative one
    assert seed_split({"0": {"1": 0.0, "2": 1.0}, "1": {"3": 0.0, "4": 1.0}}).between_sd == 0


def test_power_plans_with_more_seeds_a_fold(tmp_path, capsys):
    folder = tmp_path / "pilot"
    folder.mkdir()
    per = {f: sum(v.values()) / 2 for f, v in PER_RUN.items()}
    claim = {"claim": "a.server.accuracy > b.server.accuracy", "role": "primary",
             "estimate": "+0.3333", "ci": "[+0.2000, +0.4500]", "verdict": "fragile",
             "reason": "x", "per_seed": per, "per_run": PER_RUN, "floor": 0.2,
             "per_seed_text": "+0.200, +0.500, +0.300"}
    (folder / "suite.json").write_text(json.dumps({
        "name": "p", "seeds": [1000, 2000, 1001, 2001, 1002, 2002], "claims": [claim],
        "folds": {"1000": 0, "2000": 0, "1001": 1, "2001": 1, "1002": 2, "2002": 2},
        "table": [{"arm": "a"}, {"arm": "b"}]}))
    for args, seeds, sd in (([], 2, 0.023333 ** 0.5), (["--seeds", "4"], 4, 0.02 ** 0.5),
                            (["--seeds", "1"], 1, (0.016667 + 0.013333) ** 0.5)):
        assert main(["suite", "power", str(folder), "--half-width", "0.1", *args]) == 0
        out = capsys.readouterr().out
        cells = [c.strip() for c in next(x for x in out.splitlines()
                                         if x.startswith("| a.server")).strip("|").split("|")]
        assert cells[4:6] == [f"{(0.04 / 3) ** 0.5:.3f}", f"{0.016667 ** 0.5:.3f}"]
        need = max(folds_needed(sd, 0.1), folds_needed(sd, 0.10, factor=floor_factor()))
        assert cells[9] == f"{need} x {seeds}"
        assert cells[10] == str(need * seeds * 2)
    assert "planned with 1 seed(s) per fold" in out
    assert main(["suite", "power", str(folder), "--seeds", "0"]) == 2


def test_a_suite_stopped_after_one_fold_counts_that_fold(tmp_path, capsys):
    """A fold suite declared with 4 folds x 2 seeds, reported after fold 0: its hours are
    that fold's, and its seeds per fold the design's 2, not the 8 declared seeds."""
    folder = tmp_path / "pilot"
    folder.mkdir()
    claim = {"claim": "a.server.accuracy > b.server.accuracy", "role": "primary",
             "estimate": "+0.2000", "ci": "[+0.1000, +0.3000]", "verdict": "fragile",
             "reason": "x", "per_seed": {"0": 0.2}, "per_run": {"0": {"1000": 0.1, "2000": 0.3}},
             "floor": 0.2, "per_seed_text": "+0.200"}
    seeds = [1000 * r + f for f in range(4) for r in (1, 2)]
    (folder / "suite.json").write_text(json.dumps({
        "name": "p", "seeds": seeds, "folds": {str(s): s % 1000 for s in seeds},
        "claims": [claim], "table": [{"arm": "a"}, {"arm": "b"}]}))
    for arm, wall in (("a", 3000.0), ("b", 600.0)):
        for seed in (1000, 2000):
            run = folder / arm / "fold_0" / f"seed_{seed}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(json.dumps(
                {"round": 1, "participant": "server", "split": "train", "wall_time": wall})
                + "\n")
    assert main(["suite", "power", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "1 fold(s), 2 seed(s) per fold, 2 arms; 2.00 h per fold" in out  # 2 x 3600 s
    cells = [c.strip() for c in next(x for x in out.splitlines()
                                     if x.startswith("| a.server")).strip("|").split("|")]
    assert cells[4:6] == [f"{0.02 ** 0.5:.3f}", "-"]  # seeds split, no fold part yet
    assert cells[9].startswith("≥") and cells[9].endswith(" x 2")


def test_a_published_fold_suite_counts_every_seed_of_a_fold(tmp_path, capsys):
    """A published folder keeps only suite.md's "Where the time went" table, an arm's mean
    run: one fold of 2 seeds a fold costs twice the arms' sum."""
    folder = tmp_path / "pilot"
    folder.mkdir()
    claim = {"claim": "a.server.accuracy > b.server.accuracy", "role": "primary",
             "estimate": "+0.2000", "ci": "[+0.1000, +0.3000]", "verdict": "fragile",
             "reason": "x", "per_seed": {"0": 0.2, "1": 0.2}, "floor": 0.2,
             "per_seed_text": "+0.200, +0.200"}
    (folder / "suite.json").write_text(json.dumps({
        "name": "p", "seeds": [1000, 2000, 1001, 2001], "claims": [claim],
        "folds": {"1000": 0, "2000": 0, "1001": 1, "2001": 1},
        "table": [{"arm": "a"}, {"arm": "b"}]}))
    (folder / "suite.md").write_text(
        "# Suite p\n\n## Where the time went\n\n| | wall (s) | eval (s, %) |\n|---|---:|---:|\n"
        "| a | 1800.0 | 1.0 (0%) |\n| b | 900.0 | 1.0 (0%) |\n| all runs | 10800.0 | 8 |\n")
    assert main(["suite", "power", str(folder)]) == 0
    assert "2 fold(s), 2 seed(s) per fold, 2 arms; 1.50 h per fold" in capsys.readouterr().out


def test_hours_range_up_to_what_the_reuse_store_spared_the_pilot(tmp_path, capsys):
    """A pilot whose runs the reuse store served part of: the hours run from its wall
    times up to its wall times plus the seconds reuse spared (a published table's
    "spared by reuse (s)" column), what the runs cost with nothing stored."""
    folder = _pilot(tmp_path)
    (folder / "suite.md").write_text(
        "# Suite p\n\n## Where the time went\n\n"
        "| | wall (s) | eval (s, %) | spared by reuse (s) |\n|---|---:|---:|---:|\n"
        "| a | 1800.0 | 1.0 (0%) | 900.0 |\n| b | 900.0 | 1.0 (0%) | 0.0 |\n"
        "| all runs | 10800.0 | 8 | 3600.0 |\n\n## Next\n\n| c | 5.0 | 1 | 7.0 |\n")
    assert main(["suite", "power", str(folder), "--target-floor", "0.2",
                 "--half-width", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "0.75 h per fold" in out and "up to 1.00 h with nothing served" in out
    row = next(x for x in out.splitlines() if x.startswith("| a.server"))
    # 9 folds x 2,700 s a fold, up to 9 x 3,600 s
    assert row.strip("|").split("|")[-1].strip() == f"{9 * 0.75:.1f}-{9 * 1.0:.1f}"
