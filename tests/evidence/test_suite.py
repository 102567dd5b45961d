"""The shipped quick suite end to end: verdicts from its prediction files, outputs, and a
suite interrupted halfway that finishes only what is missing with the same table."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedkt.eval.predictions import prediction_files, read_predictions
from fedkt.evidence.claims import decide, parse_claim
from fedkt.evidence.stats import seed_interval
from fedkt.evidence.suite import load_suite, run_state
from fedkt.evidence.suite_keep import keep_runs
from fedkt.infra.environment import describe, environment
from tests.conftest import suite_claims_text

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "configs" / "suites" / "quick.yaml"


def _ctrl_c_as_in_a_terminal() -> None:
    # A job started in the background by a shell inherits SIGINT ignored (CI can run us so);
    # give the suite process the default, as a terminal's Ctrl-C would find it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _suite(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-m", "fedkt.cli", "suite", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal, **kw)


# The tests on the quick suite's real runs (the fixture below: 86 s on an idle 2-core AVX2
# host, 2026-12-03) are slow; the default run keeps the suite's rules on records
# (tests/evidence/test_suite_keep.py, test_suite_changed.py, test_verdicts.py).
on_the_quick_suite = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("suite") / "quick"
    proc = _suite(["run", str(QUICK), "--output-dir", str(folder), "--jobs", "2",
                   "--keep", str(folder.parent / "kept")])
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    (folder.parent / "stdout.txt").write_text(out)
    return folder


@on_the_quick_suite
def test_suite_run_keeps_each_run_before_the_runs_after_it_start(finished, tmp_path):
    lines = (finished.parent / "stdout.txt").read_text().splitlines()
    kept = finished.parent / "kept"
    suite = load_suite(QUICK, finished)
    for arm, seed in suite.runs:
        label = f"suite quick: {arm} seed {seed}: "
        at = lines.index(f"{label}kept into {kept}")
        assert lines[at - 1].startswith(f"{label}finished in ")
    firsts = [lines.index(f"suite quick: {arm} seed {seed}: kept into {kept}")
              for arm, seed in suite.runs]
    starts = [i for i, x in enumerate(lines) if x.endswith(": running")]
    assert min(firsts) < max(starts)  # kept as each finished, not at the end
    keep_runs(finished, tmp_path / "again")  # what `fedkt suite keep` copies, byte for byte
    files = sorted(p.relative_to(kept) for p in kept.rglob("*") if p.is_file())
    assert len(files) > 4 * 5 and files == sorted(
        p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*")
        if p.is_file())
    assert all((kept / f).read_bytes() == (tmp_path / "again" / f).read_bytes()
               for f in files)


def _correct(folder: Path, arm: str, seed: int, rnd: int | None, participants: str
             ) -> tuple[list[str], np.ndarray]:
    """Per-example 0/1 correctness read straight from the prediction files."""
    files = prediction_files(folder / arm / f"seed_{seed}")
    rounds = sorted({r for r, _, _ in files})
    rnd = rounds[-1] if rnd is None else rnd
    names = sorted(p for r, p, s in files if r == rnd and not s
                   and (p == participants or (participants == "clients" and p != "server")))
    tables = [read_predictions(files[(rnd, p, "")]) for p in names]
    ids = tables[0].ids
    rows = []
    for t in tables:
        pos = {i: k for k, i in enumerate(t.ids)}
        rows.append([t.columns["pred"][pos[i]] == t.columns["gold"][pos[i]] for i in ids])
    return ids, np.array(rows, dtype=float).mean(0)  # mean over the group's participants


def _hand_ci(pairs: list[tuple[np.ndarray, np.ndarray]], reps: int, seed: int):
    """The documented procedure, written out with index arrays."""
    rng = np.random.default_rng(seed)
    per_seed = []
    for a, b in pairs:
        idx = rng.integers(0, len(a), size=(reps, len(a)))
        per_seed.append(a[idx].mean(1) - b[idx].mean(1))
    stacked = np.stack(per_seed)
    if len(pairs) > 1:
        pick = rng.integers(0, len(pairs), size=(reps, len(pairs)))
        reps_ = stacked[pick, np.arange(reps)[:, None]].mean(1)
    else:
        reps_ = stacked[0]
    per_seed = [a.mean() - b.mean() for a, b in pairs]
    lo, hi = np.quantile(reps_, [0.025, 0.975])
    return float(np.mean(per_seed)), lo, hi, per_seed


@on_the_quick_suite
def test_quick_suite_verdicts_follow_from_its_prediction_files(finished):
    suite = load_suite(QUICK, finished)
    report = json.loads((finished / "suite.json").read_text())
    table = (finished / "suite.md").read_text()
    assert table.startswith("# Suite quick")
    # the environment the runs were computed in, as suite.md prints it (suite across reads it)
    assert report["environment"] == [x for x in table.splitlines()
                                     if x.startswith("- environment: ")]
    # this process's environment, then the arithmetic the runs resolved `auto` to
    line, here = report["environment"][0].removeprefix("- environment: "), describe(environment())
    assert line.startswith(here)
    assert re.fullmatch(r"; precision (bf16|fp32) \(auto\)", line[len(here):])
    assert [c["claim"] for c in report["claims"]] == [suite.cfg.primary, *suite.cfg.claims]
    assert [c["role"] for c in report["claims"]] == ["primary"] + ["secondary"] * len(
        suite.cfg.claims)
    for result in report["claims"]:
        claim = parse_claim(result["claim"])
        pairs = []
        for seed in suite.cfg.seeds:
            ids_a, a = _correct(finished, claim.lhs.arm, seed, claim.lhs.round, claim.lhs.group)
            ids_b, b = _correct(finished, claim.rhs.arm, seed, claim.rhs.round, claim.rhs.group)
            order = {i: k for k, i in enumerate(ids_b)}
            pairs.append((a, b[[order[i] for i in ids_a]]))
        est, lo, hi, per_seed = _hand_ci(pairs, suite.cfg.bootstrap, suite.cfg.bootstrap_seed)
        assert result["value"] == pytest.approx(est, abs=1e-12)
        assert (result["low"], result["high"]) == pytest.approx((lo, hi), abs=1e-12)
        assert list(result["per_seed"].values()) == pytest.approx(per_seed, abs=1e-12)
        expected = decide(claim, lo, hi, per_seed, seed_interval=seed_interval(per_seed),
                          estimate=est, floor=result["floor"])
        assert (result["verdict"], result["reason"]) == (expected.verdict, expected.reason)
    # Per-example files of every run, at round 0 and the final round; table; plots.
    for arm in suite.cfg.arms:
        for seed in suite.cfg.seeds:
            rounds = {r for r, _, _ in prediction_files(finished / arm / f"seed_{seed}")}
            assert {0, 2} <= rounds
    plots = sorted(p.name for p in (finished / "plots").glob("*.png"))
    assert "accuracy_clients_rounds.png" in plots and "accuracy_clients_final.png" in plots


@pytest.mark.slow  # 45 s: a real suite killed mid-way and resumed (keeps the default run < 10 min)
def test_interrupted_suite_finishes_only_what_is_missing(finished, tmp_path):
    folder = tmp_path / "quick"
    suite = load_suite(QUICK, folder)
    proc = _suite(["run", str(QUICK), "--output-dir", str(folder), "--jobs", "1"])
    first = (next(iter(suite.cfg.arms)), suite.cfg.seeds[0])
    deadline = time.time() + 600
    while run_state(suite.run_dir(*first), 2) != "done":
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    time.sleep(1.0)  # the next run has started
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    states = {k: run_state(suite.run_dir(*k), 2) for k in suite.runs}
    assert states[first] == "done" and list(states.values()).count("done") < len(states)
    done_before = {k: (suite.run_dir(*k) / "metrics.jsonl").stat().st_mtime_ns
                   for k, s in states.items() if s == "done"}
    proc = _suite(["run", str(QUICK), "--output-dir", str(folder), "--jobs", "1"])
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    for key, mtime in done_before.items():  # finished runs were skipped, not rerun
        assert (suite.run_dir(*key) / "metrics.jsonl").stat().st_mtime_ns == mtime
        assert f"{key[0]} seed {key[1]}: done, skipped" in out
    assert "| fedavg |" in suite_claims_text(folder)
    assert suite_claims_text(folder) == suite_claims_text(finished)


@on_the_quick_suite
def test_a_claim_against_the_larger_of_two_arms_follows_from_the_files(finished, tmp_path):
    """``A > max(B, C)`` through ``fedkt suite report``: on each seed's resample the larger
    of the two arms, from the prediction files, by hand."""
    import shutil

    import yaml

    from fedkt.evidence.suite_report import report_suite

    folder = tmp_path / "copy"
    shutil.copytree(finished, folder)
    raw = yaml.safe_load((folder / "suite.yaml").read_text())
    raw["claims"] = ["fedavg.clients.accuracy > max(standalone, fedavg).clients.accuracy"]
    (folder / "suite.yaml").write_text(yaml.safe_dump(raw))
    report_suite(folder)
    got = json.loads((folder / "suite.json").read_text())["claims"][1]
    suite = load_suite(folder / "suite.yaml", folder)
    rng = np.random.default_rng(suite.cfg.bootstrap_seed)
    reps, per_seed, draws = suite.cfg.bootstrap, [], []
    for seed in suite.cfg.seeds:
        ids, a = _correct(folder, "fedavg", seed, None, "clients")
        sides = []
        for arm in ("standalone", "fedavg"):
            ids_b, b = _correct(folder, arm, seed, None, "clients")
            order = {i: k for k, i in enumerate(ids_b)}
            sides.append(b[[order[i] for i in ids]])
        idx = rng.integers(0, len(a), size=(reps, len(a)))
        draws.append(a[idx].mean(1) - np.maximum(sides[0][idx].mean(1), sides[1][idx].mean(1)))
        per_seed.append(a.mean() - max(sides[0].mean(), sides[1].mean()))
    pick = rng.integers(0, len(draws), size=(reps, len(draws)))
    reps_ = np.stack(draws)[pick, np.arange(reps)[:, None]].mean(1)
    assert (got["low"], got["high"]) == pytest.approx(tuple(np.quantile(reps_, [.025, .975])),
                                                      abs=1e-12)
    assert list(got["per_seed"].values()) == pytest.approx(per_seed, abs=1e-12)
    assert got["high"] <= 1e-12  # A against the larger of B and A itself: never above


@on_the_quick_suite
def test_report_into_another_folder_leaves_the_suite_folder_as_it_was(finished, tmp_path):
    """``fedkt suite report DIR --into OUT`` (a kept folder under version control): the same
    table, written only into OUT."""
    from fedkt.cli import main

    before = {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()}
    assert main(["suite", "report", str(finished), "--into", str(tmp_path / "out")]) == 0
    assert {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()} == before
    got = json.loads((tmp_path / "out" / "suite.json").read_text())
    kept = json.loads((finished / "suite.json").read_text())
    assert got["claims"] == kept["claims"] and got["table"] == kept["table"]
    assert list((tmp_path / "out" / "plots").glob("*_final.png"))


@on_the_quick_suite
def test_report_groups_seeds_and_refuses_runs_on_other_examples(finished, tmp_path):
    import shutil

    from fedkt.eval.predictions import Predictions, write_predictions

    runs = [str(finished / arm / f"seed_{s}") for arm in ("fedavg", "standalone")
            for s in (0, 1)]
    out = subprocess.run([sys.executable, "-m", "fedkt.cli", "report", *runs, "--baseline",
                          runs[2], "--metric", "accuracy"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "fedavg (2 seeds)" in out.stdout and "±" in out.stdout
    assert "| fedavg (2 seeds) | clients | accuracy |" in out.stdout
    # A copy of a run whose final client tables name other test examples is refused.
    other = tmp_path / "other"
    shutil.copytree(runs[0], other)
    for path in (other / "predictions" / "round_0002").glob("*.json.gz"):
        table = read_predictions(path)
        ids = [f"x{i}" if i < 5 else k for i, k in enumerate(table.ids)]
        write_predictions(other, 2, path.name.split(".")[0],
                          {"": Predictions({**table.columns, "id": ids}, table.meta)})
    bad = subprocess.run([sys.executable, "-m", "fedkt.cli", "report", str(other),
                          "--baseline", runs[0]], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "different test examples: 5 of 60 ids" in bad.stderr
    assert str(other) in bad.stderr and runs[0] in bad.stderr


@on_the_quick_suite
def test_report_takes_round0_from_an_arm_that_has_it(finished, tmp_path):
    """A baseline without round 0 (eval.round0: false) leaves the zero-shot row to the
    next arm that has it; a claim on the missing round 0 is an error, not a crash."""
    import shutil

    from fedkt.evidence.suite_report import report_suite

    folder = tmp_path / "quick"
    shutil.copytree(finished, folder)
    for seed in (0, 1):  # the baseline (standalone) as if it had not evaluated round 0
        run = folder / "standalone" / f"seed_{seed}"
        rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if r.get("round") != 0]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        shutil.rmtree(run / "predictions" / "round_0000")
    text = report_suite(folder)
    assert "| round 0 (fedavg@0) |" in text
    verdicts = {c["claim"]: c["verdict"]
                for c in json.loads((folder / "suite.json").read_text())["claims"]}
    bad = "standalone.clients.accuracy > standalone@0.clients.accuracy"
    assert verdicts[bad].startswith("error:") and "round 0" in verdicts[bad]
    good = "fedavg.server.accuracy > fedavg@0.server.accuracy"
    assert verdicts[good] in ("reproduced", "not resolved", "contradicted")


@on_the_quick_suite
def test_the_papers_numbers_stand_beside_the_suites_own(finished, tmp_path):
    """``paper:`` rows: the suite's mean over seeds (from the prediction files, by hand)
    beside the paper's value, in suite.md, suite.json and docs/results.md's section."""
    import shutil

    import yaml

    from fedkt.evidence.results import results_markdown
    from fedkt.evidence.suite_report import report_suite

    root = tmp_path / "suites"
    folder = root / "quick"
    shutil.copytree(finished, folder)
    raw = yaml.safe_load((folder / "suite.yaml").read_text())
    raw["paper"] = {"source": "A paper, Table 9", "scale": "tiny models",
                    "rows": [{"row": "clients, FedAvg", "paper": 0.5,
                              "fedkt": "fedavg.clients.accuracy"},
                             {"row": "server, Zero-Shot", "paper": 0.25,
                              "fedkt": "fedavg@0.server.accuracy"}]}
    (folder / "suite.yaml").write_text(yaml.safe_dump(raw))
    report_suite(folder)
    got = json.loads((folder / "suite.json").read_text())["paper"]
    seeds = raw["seeds"]
    clients = [_correct(folder, "fedavg", s, None, "clients")[1].mean() for s in seeds]
    zero = [_correct(folder, "fedavg", s, 0, "server")[1].mean() for s in seeds]
    for row, values, paper in zip(got["rows"], (clients, zero), (0.5, 0.25), strict=True):
        assert row["runs"] == len(seeds)
        assert row["mean"] == pytest.approx(np.mean(values), abs=1e-12)
        assert row["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-12)
        assert row["difference"] == pytest.approx(np.mean(values) - paper, abs=1e-12)
    assert got["source"] == "A paper, Table 9"
    first = f"| clients, FedAvg | `fedavg.clients.accuracy` | 0.500 | {np.mean(clients):.3f}"
    assert first in (folder / "suite.md").read_text()
    assert first in results_markdown(root)


@pytest.mark.parametrize(("row", "message"), [
    ({"row": "x", "paper": 0.5, "fedkt": "fedprox.clients.accuracy"},
     "paper.rows[0] ('x'): arm 'fedprox' is not an arm"),
    ({"row": "x", "paper": 0.5, "fedkt": "fedavg.global_slm.accuracy"},
     "paper.rows[0] ('x'): group 'global_slm' is not one of the suite's groups"),
    ({"row": "x", "paper": 0.5, "fedkt": "fedavg accuracy"}, "paper.rows.0.fedkt"),
    ({"row": "x", "paper": float("nan"), "fedkt": "fedavg.clients.accuracy"},
     "paper.rows.0.paper"),
])
def test_a_paper_row_the_suite_cannot_show_is_refused_by_name(tmp_path, row, message):
    import yaml

    from fedkt.config import ConfigError

    raw = yaml.safe_load(QUICK.read_text())
    raw["paper"] = {"source": "A paper", "rows": [row]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_suite(path, tmp_path / "out")
