"""A suite folder holds runs of one setting, and its finished runs' records can be kept
(without weights) and finished later on a machine of that setting."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from fedkt.cli import main
from fedkt.evidence.invocations import read_invocations, record_invocation
from fedkt.evidence.suite import (
    SuiteChangedError,
    SuiteMachineError,
    current_setting,
    load_suite,
    plan_runs,
)
from fedkt.evidence.suite_keep import keep_runs, suite_status

ROOT = Path(__file__).resolve().parents[2]


def _suite(tmp_path: Path) -> Path:
    """The quick suite (its runs at one torch thread), written into ``tmp_path/out``'s
    parent with its folder as output_dir, and copied into that folder as run_suite does."""
    data = yaml.safe_load((ROOT / "configs" / "suites" / "quick.yaml").read_text())
    data["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "suite.yaml").write_text(path.read_text())
    return path


def _finish(path: Path, env: dict, skip: tuple[str, int] | None = None) -> None:
    """Each run's folder as a finished run leaves it (config, environment, metrics,
    predictions, summary, weights and plots); ``skip`` is left started (no checkpoint)."""
    suite = load_suite(path)
    for (arm, seed), cfg in suite.runs.items():
        run = suite.run_dir(arm, seed)
        (run / "predictions" / "round_0001").mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "arm": arm}) + "\n")
        (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        (run / "environment.json").write_text(json.dumps([{"from_round": 1, **env}]))
        with gzip.open(run / "predictions" / "round_0001" / "server.json.gz", "wt") as f:
            f.write(json.dumps({"ids": [arm, seed]}))
        (run / "plots").mkdir()
        (run / "plots" / "accuracy.png").write_bytes(b"\x89PNG" + bytes(1000))
        if (arm, seed) == skip:
            continue
        (run / "checkpoints" / "round_0002").mkdir(parents=True)
        (run / "checkpoints" / "round_0002" / "server.safetensors").write_bytes(bytes(5000))
        (run / "checkpoints" / "latest.json").write_text(json.dumps({"round": cfg.rounds}))
        (run / "summary.md").write_text(f"# {arm} {seed}\n")


def test_a_suite_folder_refuses_runs_of_another_setting_by_name(tmp_path):
    path = _suite(tmp_path)
    here = current_setting(1)  # the quick suite's runs: one torch thread
    _finish(path, here)
    assert plan_runs(load_suite(path), threads=1) == []  # the same setting: nothing to do
    for key, other in (("cpu_capability", "NOT-" + str(here["cpu_capability"])),
                       ("cpu_model", "another CPU"), ("torch", "0.0.1"),
                       ("onednn_max_cpu_isa", "AVX2_VNNI")):
        run = load_suite(path).run_dir("standalone", 1)
        (run / "environment.json").write_text(json.dumps([{"from_round": 1, **here,
                                                           key: other}]))
        with pytest.raises(SuiteMachineError) as err:
            plan_runs(load_suite(path), threads=1)
        text = str(err.value)
        assert f"standalone seed 1: {key}: {other} -> {here[key]}" in text
        assert "fedavg seed 0" not in text and "--output-dir" in text
    # fedkt's code is part of the setting, named by its digest and the commit it came from
    (run / "environment.json").write_text(json.dumps([{"from_round": 1, **here,
                                                       "code": "ab" * 32,
                                                       "commit": "339dd24+edited"}]))
    with pytest.raises(SuiteMachineError) as err:
        plan_runs(load_suite(path), threads=1)
    assert ("standalone seed 1: code: abababababab (commit 339dd24+edited) -> "
            f"{here['code'][:12]}") in str(err.value)
    assert "a git worktree of the commit" in str(err.value)
    # A record from before fedkt kept a field is not compared on it.
    older = {k: v for k, v in here.items() if k not in ("cpu_model", "code")}
    (run / "environment.json").write_text(json.dumps([{"from_round": 1, **older}]))
    assert plan_runs(load_suite(path), threads=1) == []
    # The suite file's own thread count decides (runtime.torch_threads: 1), not --jobs.
    assert plan_runs(load_suite(path), threads=2) == []
    (run / "environment.json").write_text(json.dumps([{"from_round": 1, **here,
                                                       "torch_threads": 2}]))
    with pytest.raises(SuiteMachineError, match="standalone seed 1: torch_threads: 2 -> 1"):
        plan_runs(load_suite(path), threads=1)
    (run / "environment.json").write_text(json.dumps([{"from_round": 1, **here,
                                                       "torch": "0.0.1"}]))
    assert [s for _, _, s in suite_status(path)] == ["done"] * 3 + [
        f"done, another setting: torch: 0.0.1 -> {here['torch']}"]
    assert main(["suite", "run", str(path), "-q"]) == 2  # refused before anything runs


def test_kept_records_leave_the_weights_and_finish_on_a_machine_of_the_setting(tmp_path,
                                                                              capsys):
    path = _suite(tmp_path)
    _finish(path, current_setting(1), skip=("fedavg", 1))
    dest = tmp_path / "kept"
    runs, size = keep_runs(tmp_path / "out", dest)
    assert runs == 3
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert "suite.yaml" in files
    assert not any(f.endswith((".safetensors", ".png")) for f in files)
    assert not any(f.startswith("fedavg/seed_1") for f in files)  # started: starts again
    for run in ("fedavg/seed_0", "standalone/seed_0", "standalone/seed_1"):
        for name in ("config.yaml", "environment.json", "metrics.jsonl", "summary.md",
                     "checkpoints/latest.json", "predictions/round_0001/server.json.gz"):
            assert f"{run}/{name}" in files
            assert (dest / run / name).read_bytes() == (tmp_path / "out" / run /
                                                        name).read_bytes()
    assert size == sum((dest / f).stat().st_size for f in files if f != "suite.yaml")
    kept = load_suite(dest / "suite.yaml", dest)
    todo = plan_runs(kept, threads=1)  # the kept runs are done; the started one is new
    assert [(arm, seed, state) for arm, seed, _, state in todo] == [("fedavg", 1, "new")]
    # Status reads a kept folder by itself, or the suite file with --output-dir.
    states = {(arm, seed): state for arm, seed, state in suite_status(dest)}
    assert states[("fedavg", 1)] == "new" and states[("fedavg", 0)] == "done"
    assert suite_status(path, dest) == suite_status(dest) != suite_status(path)
    assert main(["suite", "status", str(dest)]) == 0
    assert "fedavg                   seed 1    new" in capsys.readouterr().out
    assert main(["suite", "status", str(dest), "--output-dir", str(dest)]) == 2
    assert "--output-dir" in capsys.readouterr().err
    env = dest / "standalone" / "seed_0" / "environment.json"
    env.write_text(env.read_text().replace('"cpu_capability": "', '"cpu_capability": "X'))
    with pytest.raises(SuiteMachineError, match="standalone seed 0: cpu_capability"):
        plan_runs(kept, threads=1)
    # Runs of another setting are not kept beside these (nor among them), nor another suite's
    other = tmp_path / "other"
    other.mkdir()
    odd = _suite(other)
    _finish(odd, {**current_setting(1), "cpu_model": "another CPU"})
    env.write_text(env.read_text().replace('"cpu_capability": "X', '"cpu_capability": "'))
    with pytest.raises(SuiteMachineError) as err:
        keep_runs(other / "out", dest)
    assert str(err.value).count("-> another CPU") == 3  # the 3 kept there, by name
    assert f"fedavg seed 0 (kept in {dest}): cpu_model:" in str(err.value)
    assert not (dest / "fedavg" / "seed_1").exists()  # refused before anything was copied
    keep_runs(tmp_path / "out", dest)  # again: the same setting, nothing refused
    data = yaml.safe_load((other / "out" / "suite.yaml").read_text())
    data["base"]["training"]["lr"] = 0.5
    (other / "out" / "suite.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SuiteChangedError, match="another suite file"):
        keep_runs(other / "out", dest)
    assert main(["suite", "keep", str(tmp_path / "out"), str(tmp_path / "again")]) == 0
    assert "kept 3 finished run(s)" in capsys.readouterr().out
    assert main(["suite", "keep", str(tmp_path / "again" / "fedavg"), str(tmp_path / "x")]) == 2
    assert "no suite.yaml" in capsys.readouterr().err


def test_suite_run_keeps_each_run_as_it_finishes_and_refuses_a_folder_first(tmp_path,
                                                                            capsys):
    """``fedkt suite run --keep DIR``: a run's records are kept into DIR as it finishes
    (before the table, so a suite stopped after it has kept it), equal to what ``fedkt
    suite keep`` copies; a DIR of another suite is refused before any run; the same command
    into a new folder goes on from DIR rather than running its runs again.  One real run
    (about 20 s idle, 2-core AVX2, 2026-12-03); the slow tier's quick suite keeps each of
    four runs before the runs after it start (tests/evidence/test_suite.py)."""
    import os
    import subprocess
    import sys

    data = yaml.safe_load((ROOT / "configs" / "suites" / "quick.yaml").read_text())
    data.update(seeds=[0], arms={"fedavg": {}}, baseline=None, claims=[],
                primary="fedavg.clients.accuracy > fedavg@0.clients.accuracy",
                output_dir=str(tmp_path / "out"))
    data["base"].update(rounds=1)
    data["base"]["data"].update(max_private_per_client=8, split={"scheme": "holdout",
                                                                 "test_size": 16})
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    other = tmp_path / "other"  # a folder kept from another suite file: refused first
    other.mkdir()
    (other / "suite.yaml").write_text(yaml.safe_dump({**data, "seeds": [5]}))
    assert main(["suite", "run", str(path), "-q", "--keep", str(other)]) == 2
    assert not (tmp_path / "out" / "fedavg").exists()  # nothing ran
    kept = tmp_path / "kept"
    out = subprocess.run([sys.executable, "-m", "fedkt.cli", "suite", "run", str(path),
                          "--keep", str(kept)], env={**os.environ, "FLWR_TELEMETRY_ENABLED":
                                                      "0"},
                         text=True, capture_output=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    at = lines.index(f"suite quick: fedavg seed 0: kept into {kept}")
    assert lines[at - 1].startswith("suite quick: fedavg seed 0: finished in ")
    assert lines[at + 1:] and not any(x.startswith("suite quick: fedavg") for x in lines[at + 1:])
    assert [s for _, _, s in suite_status(kept)] == ["done"]
    again = tmp_path / "again"  # what `fedkt suite keep` copies, byte for byte
    keep_runs(tmp_path / "out", again)
    files = sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(kept) for p in kept.rglob("*") if p.is_file())
    assert all((again / f).read_bytes() == (kept / f).read_bytes() for f in files)
    # the command that ran, recorded once (the refused one is not) and named by the report
    [entry] = read_invocations(kept)
    assert entry["command"] == f"fedkt suite run {path} --keep {kept}"
    assert read_invocations(tmp_path / "out") == [entry]
    assert f"- run by: `fedkt suite run {path} --keep {kept}` (" in (
        tmp_path / "out" / "suite.md").read_text()
    # Going on from the kept folder into a new working folder (a new machine's): the kept
    # run is taken, not run again, and its records are the kept ones.
    fresh = tmp_path / "fresh"
    assert main(["suite", "run", str(path), "--output-dir", str(fresh), "--keep",
                 str(kept)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert f"suite quick: fedavg seed 0: taken from {kept / 'fedavg' / 'seed_0'}" in said
    assert not any(line.endswith(": running") for line in said)
    assert [s for _, _, s in suite_status(fresh)] == ["done"]
    assert all((fresh / f).read_bytes() == (kept / f).read_bytes()
               for f in files if f.parts[0] == "fedavg")


def test_status_says_the_runs_left_and_their_time_by_each_arms_finished_runs(tmp_path,
                                                                             capsys):
    from fedkt.evidence.suite_keep import arm_walls, time_left
    from fedkt.infra.precision import physical_cores

    path = _suite(tmp_path)
    _finish(path, current_setting(1), skip=("fedavg", 1))  # fedavg seed 1 left
    suite = load_suite(path)
    for (arm, seed), wall in {("fedavg", 0): 1800.0, ("standalone", 0): 720.0,
                              ("standalone", 1): 1080.0}.items():
        rows = [{"round": r, "participant": "server", "wall_time": wall / 2} for r in (1, 2)]
        (suite.run_dir(arm, seed) / "metrics.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in rows))
    line = time_left(path)
    jobs = physical_cores()  # the runs' one torch thread each
    # the finished runs, given, time the same arms as read from their folders; none given
    # finished, none is timed
    finished = {k for k in suite.runs if k != ("fedavg", 1)}
    assert arm_walls(suite, done=finished) == arm_walls(suite) == {
        "fedavg": [(1800.0, 1800.0)], "standalone": [(720.0, 720.0), (1080.0, 1080.0)]}
    assert arm_walls(suite, done=set()) == {}
    assert line.startswith("left: 1 of 4 runs; about 0.5 h of runs")  # fedavg's 1,800 s
    assert (f"({0.5 / jobs:.1f} h at --jobs {jobs}" in line) == (jobs > 1)
    assert main(["suite", "status", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.endswith(line + "\n")
    (suite.run_dir("fedavg", 0) / "checkpoints" / "latest.json").unlink()  # now started
    assert time_left(path) == ("left: 2 of 4 runs; no finished run of their arms to time "
                               "them by")
    (suite.run_dir("standalone", 1) / "checkpoints" / "latest.json").unlink()
    assert time_left(path) == (  # standalone seed 1 at its arm's other run's 720 s
        "left: 3 of 4 runs; about 0.2 h of runs, each at its arm's mean wall time here"
        + (f" ({0.2 / jobs:.1f} h at --jobs {jobs}, this machine's cores)" if jobs > 1
           else "") + "; and 2 run(s) of arms not yet timed: fedavg")


def test_status_gives_a_range_where_the_reuse_store_served_the_finished_runs(tmp_path):
    """A finished run the reuse store spared 2,880 s of (its ``<phase>_saved_seconds``)
    times a left run of its arm from its wall time up to its wall time plus those seconds:
    what the run costs if nothing it needs is stored."""
    from fedkt.evidence.suite_keep import time_left
    from fedkt.infra.precision import physical_cores

    path = _suite(tmp_path)
    _finish(path, current_setting(1), skip=("fedavg", 1))  # fedavg seed 1 left
    suite = load_suite(path)
    rows = [{"round": 1, "participant": "server", "wall_time": 720.0},  # served: 2,880 s
            {"round": 1, "participant": "client_0", "eval_seconds": 1.0,
             "eval_saved_seconds": 1800.0, "train_saved_seconds": 1080.0}]
    (suite.run_dir("fedavg", 0) / "metrics.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in rows))
    jobs = physical_cores()
    assert time_left(path) == (
        "left: 1 of 4 runs; about 0.2 h of runs, each at its arm's mean wall time here, "
        "up to 1.0 h with nothing served from the reuse store (each run's wall time plus "
        "the seconds it spared)"
        + (f" ({0.2 / jobs:.1f}-{1.0 / jobs:.1f} h at --jobs {jobs}, this machine's cores)"
           if jobs > 1 else ""))


def test_a_keep_stopped_part_way_leaves_no_run_that_looks_done(tmp_path):
    """The checkpoint index is copied last: a copy that fails on a prediction file leaves
    that run started in DEST (it starts again), not done without its predictions."""
    path = _suite(tmp_path)
    _finish(path, current_setting(1))
    dest = tmp_path / "kept"
    blocker = dest / "fedavg" / "seed_0" / "predictions" / "round_0001" / "server.json.gz"
    blocker.mkdir(parents=True)  # a folder where the file goes: the copy fails there
    with pytest.raises(OSError):
        keep_runs(tmp_path / "out", dest)
    assert (dest / "fedavg" / "seed_0" / "metrics.jsonl").is_file()  # copied before it
    assert not (dest / "fedavg" / "seed_0" / "checkpoints" / "latest.json").exists()
    assert dict(((a, s), st) for a, s, st in suite_status(dest))[("fedavg", 0)] != "done"


def test_runs_another_suite_made_with_the_same_config_and_setting_are_taken_not_run(
        tmp_path, capsys):
    """`--runs-from DIR`: a suite whose design repeats another's runs (other arm names,
    more seeds, an arm of its own) takes the finished ones that match by config and
    setting, records only, and plans the rest."""
    from fedkt.evidence.suite_keep import take_runs

    path = _suite(tmp_path)  # the quick suite: fedavg and standalone, seeds 0 and 1
    here = current_setting(1)
    _finish(path, here)
    other = load_suite(path)
    odd_run = other.run_dir("standalone", 1)
    (odd_run / "environment.json").write_text(json.dumps([{"from_round": 1, **here,
                                                            "cpu_model": "another CPU"}]))
    data = yaml.safe_load(path.read_text())
    data.update(name="quick_more", seeds=[0, 1, 2], output_dir=str(tmp_path / "more"))
    data["arms"] = {"shared": {}, "standalone": data["arms"]["standalone"],
                    "fedavg_lr": {"training": {"lr": 0.5}}}
    data["primary"] = "shared.clients.accuracy > standalone.clients.accuracy"
    data.pop("claims", None)
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump(data))
    suite = load_suite(more)
    made = record_invocation(tmp_path / "out", "fedkt suite run suite.yaml")
    taken, refused = take_runs(suite, [tmp_path / "out"], threads=1)
    assert read_invocations(tmp_path / "more") == [made]  # the taken runs' command beside
    assert sorted((arm, seed, str(src.relative_to(tmp_path))) for arm, seed, src in taken) == [
        ("shared", 0, "out/fedavg/seed_0"), ("shared", 1, "out/fedavg/seed_1"),
        ("standalone", 0, "out/standalone/seed_0")]
    assert refused == [f"standalone seed 1: {odd_run} was computed under another setting "
                       f"(cpu_model: another CPU -> {here['cpu_model']})"]
    run = suite.run_dir("shared", 1)
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    assert files == ["checkpoints/latest.json", "config.yaml", "environment.json",
                     "metrics.jsonl", "predictions/round_0001/server.json.gz", "summary.md"]
    for name in files:
        assert (run / name).read_bytes() == (other.run_dir("fedavg", 1) / name).read_bytes()
    todo = plan_runs(load_suite(more), threads=1)
    assert sorted((arm, seed, state) for arm, seed, _, state in todo) == [
        ("fedavg_lr", 0, "new"), ("fedavg_lr", 1, "new"), ("fedavg_lr", 2, "new"),
        ("shared", 2, "new"), ("standalone", 1, "new"), ("standalone", 2, "new")]
    # a run the folder already holds is left as it is; asking again takes nothing
    (run / "metrics.jsonl").write_text("mine\n")
    assert take_runs(load_suite(more), [tmp_path / "out"], threads=1)[0] == []
    assert (run / "metrics.jsonl").read_text() == "mine\n"
    # a folder that is not a suite folder is refused before anything runs
    assert main(["suite", "run", str(more), "--runs-from", str(tmp_path / "nope"), "-q"]) == 2
    assert "no suite.yaml" in capsys.readouterr().err
    assert not suite.run_dir("fedavg_lr", 0).exists()


def test_status_says_which_folds_are_whole_and_how_far_the_others_are(tmp_path, capsys):
    """A suite kept fold by fold is stopped at a whole fold: ``fedkt suite status`` says
    which folds are (every arm and seed done) and how many runs of each other fold are."""
    from fedkt.evidence.suite_keep import fold_progress

    fold_of = {1000: 0, 2000: 0, 1001: 1, 2001: 1, 1002: 2, 2002: 2}
    states = [(arm, seed, state) for arm in ("a", "b") for seed, state in (
        (1000, "done"), (2000, "done"), (1001, "done"), (2001, "started"),
        (1002, "new"), (2002, "new"))]
    states[-1] = ("b", 2002, "done (taken)")
    assert fold_progress(fold_of, states) == (
        "whole folds: 1 of 3 (0); fold 1: 2 of 4 runs done; fold 2: 1 of 4 runs done")
    assert fold_progress(fold_of, [(a, s, "new") for a, s, _ in states]) == (
        "whole folds: 0 of 3")
    # a shipped fold suite with nothing run yet: no fold is whole
    assert main(["suite", "status", "suites/clinc150_llm2slm_transfer", "--output-dir",
                 str(tmp_path / "none")]) == 0
    assert "\nwhole folds: 0 of 4\n" in capsys.readouterr().out
