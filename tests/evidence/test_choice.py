"""A pilot's declared choice (``choice:`` of a suite file): the rule on means with known
answers, its refusal of a rule the suite cannot apply, and the report applying it to a
suite folder's runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from fedkt.config import ConfigError
from fedkt.evidence.choice import ChoiceRule, choice_markdown, choose
from fedkt.evidence.results import results_markdown
from fedkt.evidence.suite import load_suite
from fedkt.evidence.suite_report import report_suite

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "configs" / "suites" / "quick.yaml"

RULE = ChoiceRule.model_validate({
    "among": ["paper", "rehearse", "anchor", "both"],
    "keep": {"metric": "server.own", "against": "none", "margin": 0.03},
    "best": "server.other",
    "ties": {"within": 0.01, "by": "server.all"},
})


def _means(table: dict[str, dict[str, float]]):
    return lambda arm, ref: table.get(arm, {}).get(ref.split(".")[1])


def test_the_highest_eligible_arm_wins_and_the_bar_is_inclusive():
    got = choose(RULE, _means({
        "none": {"own": 0.90},
        "paper": {"own": 0.40, "other": 0.95, "all": 0.70},    # best, but forgets
        "rehearse": {"own": 0.87, "other": 0.80, "all": 0.83},  # exactly at the bar
        "anchor": {"own": 0.95, "other": 0.60, "all": 0.78},
        "both": {"own": 0.86, "other": 0.90, "all": 0.88},      # 0.01 below the bar
    }))
    assert got["chosen"] == "rehearse"
    assert [r["eligible"] for r in got["rows"]] == [False, True, True, False]
    assert all(r["bar"] == pytest.approx(0.87) for r in got["rows"])
    assert got["reason"].startswith("eligible: 2 of 4; the highest server.other (0.800)")
    assert [r["chosen"] for r in got["rows"]] == [False, True, False, False]


def test_arms_within_the_tie_margin_are_decided_by_the_tie_metric():
    table = {"none": {"own": 0.90},
             "paper": {"own": 0.90, "other": 0.800, "all": 0.70},
             "rehearse": {"own": 0.90, "other": 0.795, "all": 0.85},  # within 0.01
             "anchor": {"own": 0.90, "other": 0.780, "all": 0.99},    # 0.02 below: out
             "both": {"own": 0.50, "other": 0.99, "all": 0.99}}       # not eligible
    got = choose(RULE, _means(table))
    assert got["chosen"] == "rehearse"
    assert "2 within 0.01 of the best server.other (0.800)" in got["reason"]
    # without a tie rule, the best alone decides
    bare = RULE.model_copy(update={"ties": None})
    assert choose(bare, _means(table))["chosen"] == "paper"


def test_none_eligible_takes_the_arm_losing_least_and_says_so():
    got = choose(RULE, _means({
        "none": {"own": 0.90},
        "paper": {"own": 0.30, "other": 0.95, "all": 0.6},
        "rehearse": {"own": 0.80, "other": 0.50, "all": 0.6},
        "anchor": {"own": 0.85, "other": 0.10, "all": 0.6},
        "both": {"own": 0.70, "other": 0.90, "all": 0.6},
    }))
    assert got["chosen"] == "anchor" and got["eligible_any"] is False
    assert got["reason"].startswith("none eligible (server.own at least 0.870")
    assert "Chosen: **anchor** (none eligible" in choice_markdown(got)


def test_no_keep_rule_makes_every_arm_eligible():
    rule = ChoiceRule.model_validate({"among": ["a", "b"], "best": "clients.accuracy"})
    got = choose(rule, _means({"a": {"accuracy": 0.2}, "b": {"accuracy": 0.3}}))
    assert got["chosen"] == "b" and all(r["eligible"] for r in got["rows"])


def test_a_choice_waits_for_every_run_of_its_arms():
    table = {a: {"own": 0.9, "other": 0.5, "all": 0.5}
             for a in ("none", "paper", "rehearse", "anchor", "both")}
    got = choose(RULE, _means(table), missing=["anchor seed 2000", "unrelated seed 1000"])
    assert got["chosen"] is None
    assert got["reason"] == "not computed: 1 of its arms' runs not finished (anchor seed 2000)"
    assert choose(RULE, _means(table), missing=["unrelated seed 1000"])["chosen"] == "paper"
    del table["none"]  # the keep rule's reference arm has no value
    assert choose(RULE, _means(table))["reason"] == "not computed: none has no server.own"


def _quick(tmp_path: Path, choice: dict) -> Path:
    raw = yaml.safe_load(QUICK.read_text())
    raw["choice"] = choice
    raw["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(("choice", "message"), [
    ({"among": ["fedavg", "fedprox"], "best": "clients.accuracy"},
     "choice.among: 'fedprox' is not an arm of the suite"),
    ({"among": ["fedavg", "standalone"], "best": "clients.accuracy",
      "keep": {"metric": "clients.accuracy", "against": "nothing"}},
     "choice.keep.against: 'nothing' is not an arm"),
    ({"among": ["fedavg", "standalone"], "best": "global_slm.accuracy"},
     "choice.best: group 'global_slm' is not one of the suite's groups"),
    ({"among": ["fedavg", "standalone"], "best": "clients.accuracy",
      "ties": {"within": 0.01, "by": "slm.accuracy"}},
     "choice.ties.by: group 'slm' is not one of the suite's groups"),
    ({"among": ["fedavg", "standalone"], "best": "accuracy"}, "choice.best"),
    ({"among": ["fedavg", "fedavg"], "best": "clients.accuracy"}, "choice.among"),
    ({"among": ["fedavg"], "best": "clients.accuracy"}, "choice.among"),
    ({"among": ["fedavg", "standalone"], "best": "clients.accuracy",
      "keep": {"metric": "clients.accuracy", "against": "standalone", "margin": -0.1}},
     "choice.keep.margin"),
])
def test_a_rule_the_suite_cannot_apply_is_refused_by_name(tmp_path, choice, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_suite(_quick(tmp_path, choice))


def test_the_report_applies_the_rule_to_the_runs_means(tmp_path):
    """Runs' logged accuracies (no prediction files): the table's means, by hand, decide."""
    path = _quick(tmp_path, {
        "among": ["fedavg", "standalone"],
        "keep": {"metric": "server.accuracy", "against": "standalone", "margin": 0.05},
        "best": "clients.accuracy"})
    raw = yaml.safe_load(path.read_text())
    del raw["primary"], raw["claims"]  # claims need prediction files; the rule does not
    path.write_text(yaml.safe_dump(raw))
    suite = load_suite(path)
    accuracy = {("fedavg", 0): (0.60, 0.70), ("fedavg", 1): (0.56, 0.74),
                ("standalone", 0): (0.62, 0.50), ("standalone", 1): (0.58, 0.52)}
    for (arm, seed), cfg in suite.runs.items():
        run = suite.run_dir(arm, seed)
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "latest.json").write_text(json.dumps({"round": cfg.rounds}))
        (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        server, clients = accuracy[(arm, seed)]
        rows = [{"round": cfg.rounds, "participant": p, "split": "test", "accuracy": a}
                for p, a in (("server", server), ("client_0", clients),
                             ("client_1", clients))]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (suite.folder / "suite.yaml").write_text(path.read_text())
    report_suite(suite.folder)
    got = json.loads((suite.folder / "suite.json").read_text())["choice"]
    # fedavg's server 0.58 >= standalone's 0.60 - 0.05: eligible, and its clients lead
    assert got["chosen"] == "fedavg"
    assert [r["keep"] for r in got["rows"]] == pytest.approx([0.58, 0.60])
    assert [r["best"] for r in got["rows"]] == pytest.approx([0.72, 0.51])
    assert got["rows"][0]["bar"] == pytest.approx(0.55)
    text = (suite.folder / "suite.md").read_text()
    row = "| **fedavg** | 0.580 | 0.550 | yes | 0.720 |"
    assert "## The pilot's choice" in text and row in text
    assert row in results_markdown(tmp_path)  # docs/results.md's section of the suite
    broken = json.loads((suite.folder / "suite.json").read_text())
    broken["choice"]["rows"][0].pop("best")
    (suite.folder / "suite.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"suite.json: choice: not a choice fedkt wrote"):
        results_markdown(tmp_path)
    # one run of a rule's arm missing: not computed, and the report says why
    (suite.run_dir("standalone", 1) / "checkpoints" / "latest.json").unlink()
    report_suite(suite.folder)
    got = json.loads((suite.folder / "suite.json").read_text())["choice"]
    assert got["chosen"] is None and "standalone seed 1" in got["reason"]
