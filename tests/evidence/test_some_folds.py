"""A suite run on some of its folds (``fedkt suite run --fold``): the whole suite's runs of
those folds, a report that names the folds left out, folders of other folds kept into one,
and a pooled verdict across kernel settings on the folds every setting ran."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedkt.config import ConfigError
from fedkt.eval.predictions import Predictions, write_predictions
from fedkt.evidence.across import read_suite_result
from fedkt.evidence.results import results_markdown
from fedkt.evidence.suite import load_suite, load_suite_folder, only_folds
from fedkt.evidence.suite_keep import keep_runs
from fedkt.evidence.suite_report import report_suite
from fedkt.evidence.suite_run import run_suite

ROOT = Path(__file__).resolve().parents[2]
SUITE = {"name": "folds", "folds": [0, 1, 2, 3], "seeds_per_fold": 2, "baseline": "b",
         "base": {"name": "x", "rounds": 1, "method": {"name": "fedavg"},
                  "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
                  "data": {"dataset": {"name": "intent_recognition"},
                           "split": {"scheme": "holdout", "folds": 4}}},
         "fold_overrides": {3: {"data.split.fold_seed": 7, "data.split.fold": 0}},
         "arms": {"a": {}, "b": {}}, "metrics": ["accuracy"], "groups": ["server"],
         "primary": "a.server.accuracy > b.server.accuracy", "bootstrap": 500}


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    return path


def _finish(path: Path, folder: Path, folds: list[int]) -> None:
    """Each run of ``folds`` as a finished run leaves it: a's seed r of fold f has
    20 + 4f + r of 40 test items right, b's 10 + f (the fold report test's numbers)."""
    suite = load_suite(path, folder)
    for (arm, seed), cfg in suite.runs.items():
        fold, r = suite.fold_of[seed], seed // 1000 - 1
        if fold not in folds:
            continue
        right = 20 + 4 * fold + r if arm == "a" else 10 + fold
        run = suite.run_dir(arm, seed)
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        (run / "metrics.jsonl").write_text(json.dumps(
            {"round": 1, "participant": "server", "split": "test", "accuracy": right / 40,
             "wall_time": 10.0}) + "\n")
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "latest.json").write_text('{"round": 1}')
        table = Predictions({"id": [f"{fold}-{i}" for i in range(40)], "gold": [0] * 40,
                             "pred": [0] * right + [1] * (40 - right)},
                            {"task": "classification"})
        write_predictions(run, 1, "server", {"": table})


def test_some_folds_are_the_whole_suites_runs_of_them(tmp_path, capsys):
    """Folds 3 and 1 of four: the same run configs (seeds, folders, fold 3's override) as
    the whole suite's, in the file's order, the file's folds kept beside them; a fold the
    suite lacks, or a suite without folds, is refused by name."""
    path = _file(tmp_path)
    whole = load_suite(path, tmp_path / "out")
    some = load_suite(path, tmp_path / "out", folds=[3, 1])
    assert some.cfg.folds == [1, 3] and some.cfg.declared_folds == [0, 1, 2, 3]
    assert some.seeds == [1001, 2001, 1003, 2003]
    assert some.runs == {k: v for k, v in whole.runs.items() if whole.fold_of[k[1]] in (1, 3)}
    assert some.runs[("a", 1003)].data.split.fold_seed == 7  # its fold's override
    with pytest.raises(ConfigError, match=r"--fold: the suite has no fold 7 \(folds "):
        load_suite(path, folds=[1, 7])
    with pytest.raises(ValueError, match="has no folds"):
        only_folds(load_suite("suites/quick").cfg, [0])
    # the command refuses it by name before any run
    from fedkt.cli import main

    assert main(["suite", "run", str(path), "--output-dir", str(tmp_path / "cli"), "-q",
                 "--fold", "1", "--fold", "9"]) == 2
    assert "--fold: the suite has no fold 9" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()
    # and `suite status --fold` counts what such a run leaves: fold 3's 2 arms x 2 seeds
    assert main(["suite", "status", str(path), "--output-dir", str(tmp_path / "cli"),
                 "--fold", "3"]) == 0
    out = capsys.readouterr().out
    assert "left: 4 of 4 runs" in out and "whole folds: 0 of 1\n" in out


def test_folders_of_some_folds_report_them_and_keep_into_the_whole(tmp_path):
    """Folds 0-1 run into one folder and 2-3 into another: each report says which of the
    file's folds it holds, and kept into one folder they are the whole suite again, its
    verdict from the four folds as if run at once."""
    path = _file(tmp_path)
    first, second, kept = tmp_path / "first", tmp_path / "second", tmp_path / "kept"
    _finish(path, first, [0, 1])
    _finish(path, second, [2, 3])
    run_suite(path, output_dir=first, folds=[0, 1], quiet=True)
    run_suite(path, output_dir=second, folds=[3, 2], quiet=True)
    text = (first / "suite.md").read_text()
    assert ("- folds: [0, 1] (of the suite file's [0, 1, 2, 3]: these folds only, "
            "`fedkt suite run --fold`), 2 training seed(s)") in text
    claim = json.loads((first / "suite.json").read_text())["claims"][0]
    assert list(claim["per_seed"]) == ["0", "1"] and claim["verdict"] != "reproduced"
    assert read_suite_result(first).declared_folds == [0, 1, 2, 3]  # suite.json keeps them
    published = tmp_path / "published"
    published.mkdir()
    for name in ("suite.json", "suite.md"):
        (published / "folds").mkdir(exist_ok=True)
        (published / "folds" / name).write_text((first / name).read_text())
    assert ("some of the suite file's folds [0, 1, 2, 3] (`fedkt suite run --fold`: suite.md "
            "names them), folder") in results_markdown(published)
    data = json.loads((published / "folds" / "suite.json").read_text())
    (published / "folds" / "suite.json").write_text(json.dumps({**data, "declared_folds": "0-3"}))
    with pytest.raises(ValueError, match=r"suite.json: declared_folds: expected a list of fold"):
        read_suite_result(published / "folds")
    assert load_suite_folder(second).cfg.folds == [2, 3]
    keep_runs(first, kept)
    assert load_suite_folder(kept).cfg.folds == [0, 1]
    both = tmp_path / "both"  # folds 0-1 run, then 2-3 into the same folder: all four
    _finish(path, both, [0, 1, 2, 3])
    run_suite(path, output_dir=both, folds=[0, 1], quiet=True)
    assert "- folds: [0, 1] (of" in (both / "suite.md").read_text()
    run_suite(path, output_dir=both, folds=[2, 3], quiet=True)
    assert "- folds: [0, 1, 2, 3], 2 training" in (both / "suite.md").read_text()
    assert json.loads((both / "suite.json").read_text())["claims"][0]["verdict"] == "reproduced"
    keep_runs(second, kept)  # the same suite file: the kept folder holds all four folds
    data = yaml.safe_load((kept / "suite.yaml").read_text())
    assert data["folds"] == [0, 1, 2, 3] and "declared_folds" not in data
    keep_runs(first, kept)  # keeping fewer folds again narrows nothing
    assert load_suite_folder(kept).cfg.folds == [0, 1, 2, 3]
    text = report_suite(kept)
    assert "- folds: [0, 1, 2, 3], 2 training seed(s)" in text and "of the suite file" not in text
    assert read_suite_result(kept).declared_folds is None
    claim = json.loads((kept / "suite.json").read_text())["claims"][0]
    want = [(10 + 3 * f + 0.5) / 40 for f in range(4)]
    assert list(claim["per_seed"].values()) == pytest.approx(want)
    assert claim["verdict"] == "reproduced" and claim["value"] == pytest.approx(np.mean(want))
    # another suite file is still refused
    other = dict(SUITE, primary="b.server.accuracy > a.server.accuracy")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    run_suite(tmp_path / "other.yaml", output_dir=first, folds=[0, 1], quiet=True)
    with pytest.raises(Exception, match="another suite file"):
        keep_runs(first, kept)


def test_the_pooled_verdict_takes_the_folds_every_setting_ran():
    """Eight folds under one setting and four of them under another: pooled by fold label
    on the four shared folds, each fold's mean over the two settings; the other setting's
    folds 4-7 move nothing.  With no two shared labels nothing is pooled."""
    from fedkt.evidence.across import pool_claim
    from fedkt.evidence.pooled import align_folds

    eight = {str(f): 0.10 + 0.01 * f for f in range(8)}
    four = {str(f): 0.20 + 0.02 * f for f in (3, 1, 0, 2)}
    table, how, labels = align_folds([eight, four])
    assert how == "shared folds" and labels == ["0", "1", "2", "3"]
    assert table.tolist() == [[eight[f], four[f]] for f in labels]
    claim = "a.server.accuracy > b.server.accuracy"
    got = pool_claim(claim, [{"per_seed": eight}, {"per_seed": four}])
    means = [(eight[f] + four[f]) / 2 for f in labels]
    assert got.parts[0].fold_means == pytest.approx(means)
    assert got.parts[0].estimate == pytest.approx(np.mean(means))
    assert got.decision.verdict == "reproduced"
    assert "(folds 0, 1, 2, 3, those every setting ran)" in got.short()
    moved = pool_claim(claim, [{"per_seed": {**eight, "7": -5.0}}, {"per_seed": four}])
    assert moved.parts[0].estimate == pytest.approx(got.parts[0].estimate)
    same = pool_claim(claim, [{"per_seed": four}, {"per_seed": four}])
    assert same.parts[0].aligned_by == "fold label" and "every setting ran" not in same.short()
    assert align_folds([{"0": 1.0, "5": 2.0}, {"0": 1.0, "1": 2.0, "2": 3.0}]) is None
    unmatched = pool_claim(claim, [{"per_seed": {"0": 1.0, "5": 2.0}},
                                   {"per_seed": {"0": 1.0, "1": 2.0, "2": 3.0}}])
    assert unmatched == "not computed: the folds differ between settings"


def test_a_one_fold_pilot_under_two_settings_is_not_pooled_and_says_why() -> None:
    """Two settings of a one-fold pilot share their fold: nothing is pooled (a t-interval
    needs two folds), and the reason names the count rather than a mismatch."""
    from fedkt.evidence.across import pool_claim

    claim = "a.server.accuracy > b.server.accuracy"
    got = pool_claim(claim, [{"per_seed": {"0": 0.2}}, {"per_seed": {"0": 0.3}}])
    assert got == "not computed: 1 fold in common (pooling needs 2 or more)"
    joint = pool_claim(f"{claim} and a.server.accuracy_srv >= b.server.accuracy_srv - 0.03",
                       [{"per_seed": {"0": 0.2}, "parts": [{"per_seed": {"0": 0.2}},
                                                           {"per_seed": {"0": -0.01}}]},
                        {"per_seed": {"0": 0.3}, "parts": [{"per_seed": {"0": 0.3}},
                                                           {"per_seed": {"0": 0.01}}]}])
    assert joint == "not computed: 1 fold in common (pooling needs 2 or more)"
