"""``fedkt`` command line: run, resume, eval, report, list, deploy."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

EPILOG = """examples:
  fedkt run                                        the default demo (FedCoLLM, real SmolLM2-135M)
  fedkt run quickstart                             tiny FedAvg-LoRA quick start (4 clients)
  fedkt run fedmkt/hetero --set rounds=5 --set runtime.name=flower-sim
  fedkt run my.yaml                                run your own config file
  fedkt configs list                               the shipped configs (`configs show NAME` prints one)
  fedkt configs explain training.lr                what a config key means (type, default, values)
  fedkt models install qwen2.5-0.5b                install a real checkpoint (`models list`: all)
  fedkt resume runs/demo                           continue an interrupted run
  fedkt eval runs/demo                             re-evaluate a run's last checkpoint
  fedkt eval runs/demo --harness fedkt_intent_recognition   ... with lm-evaluation-harness
  fedkt export runs/demo out --merge               the LLM as a merged Hugging Face model
  fedkt report runs/demo runs/standalone           compare runs in a markdown table
  fedkt report runs/demo --baseline runs/demo@0    paired CIs against round 0 (zero-shot)
  fedkt suite run suites/quick --jobs 2            arms x seeds, claims decided by CIs
  fedkt list                                       methods, built-in datasets, model presets
  fedkt data suites/banking77_fedmkt_transfer      each fold's classes per side and record counts
"""


def _load(config: str | Path, overrides: list[str], extra: dict[str, object]):
    from fedkt.config import load_config

    sets = list(overrides) + [f"{k}={json.dumps(v)}" for k, v in extra.items() if v is not None]
    return load_config(config, sets)


def cmd_run(args: argparse.Namespace) -> int:
    from fedkt.configs.catalog import resolve_config
    from fedkt.models.install import check_installed
    from fedkt.runner import run
    from fedkt.tracking.folder import clear_run_dir, holds_files, is_run_folder, not_a_run, run_lock

    config = resolve_config(args.config)  # a file, or a shipped config's name
    cfg = _load(config, args.set, {"runtime.name": args.runtime, "rounds": args.rounds,
                                   "output_dir": args.output_dir, "seed": args.seed})
    check_installed(cfg)  # an offline alias that is not installed: say which command installs it
    if cfg.run_dir.exists() and not cfg.run_dir.is_dir():
        raise NotADirectoryError(f"output_dir: {cfg.run_dir} is a file, not a folder")
    args.run_dir = str(cfg.run_dir)  # for the resume hint if a round fails
    # A folder that is not a run is refused before the lock would put a file into it.
    if cfg.run_dir.is_dir() and not is_run_folder(cfg.run_dir) and holds_files(cfg.run_dir):
        raise not_a_run(cfg.run_dir, args.overwrite)
    # The folder's lock is taken before the folder is checked, so two runs into one folder
    # cannot both find it empty; in-process runtimes keep it to the end (the run loop takes
    # it again), `flower` hands the job to the SuperLink's ServerApp, whose loop takes it.
    with run_lock(cfg.run_dir):
        if holds_files(cfg.run_dir):
            if not is_run_folder(cfg.run_dir):
                raise not_a_run(cfg.run_dir, args.overwrite)
            if not args.overwrite:
                raise FileExistsError(
                    f"run folder {cfg.run_dir} is not empty: `fedkt resume {cfg.run_dir}` "
                    "continues it, --overwrite starts afresh, --output-dir picks another folder")
            clear_run_dir(cfg.run_dir)
        print(f"fedkt: {cfg.method.name} on {cfg.runtime.name} runtime, "
              f"{cfg.clients.num_clients} clients, {cfg.rounds} rounds -> {cfg.run_dir}")
        if cfg.runtime.name != "flower":
            run(cfg, quiet=args.quiet)
    if cfg.runtime.name == "flower":
        run(cfg, quiet=args.quiet)
    print(f"done: metrics, plots and checkpoints in {cfg.run_dir}")
    return 0


def _run_config(run_dir: Path, overrides: list[str]):
    from fedkt.config import load_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a fedkt run folder (no config.yaml)")
    with warnings.catch_warnings():
        # fedkt wrote this file; one written before a key was renamed (the runtime sections,
        # method.lam, ...) loads under the new names without a word.
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"fedkt\.config")
        return load_config(path, overrides)


def cmd_resume(args: argparse.Namespace) -> int:
    from fedkt.runner import run

    run_dir = Path(args.run_dir)
    cfg = _run_config(run_dir, [*args.set, f"output_dir={json.dumps(str(run_dir))}"])
    run(cfg, resume=True, quiet=args.quiet)
    print(f"done: {run_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from fedkt.methods import get_method
    from fedkt.runtime.report import server_participants
    from fedkt.tracking.checkpoint import read_checkpoint
    from fedkt.tracking.folder import RunRecorder

    run_dir = Path(args.run_dir)
    cfg = _run_config(run_dir, [*args.set, f"output_dir={json.dumps(str(run_dir))}"])
    if args.harness:  # lm-evaluation-harness (fedkt[harness]) instead of fedkt's scorer
        from fedkt.eval.harness import format_results, run_harness

        results = run_harness(cfg, run_dir, args.harness, clients=args.clients,
                              include=args.harness_include, limit=args.harness_limit,
                              verbose=args.verbose)
        print(format_results(results))
        print(f"results in {run_dir / 'harness'}")
        return 0
    if args.clients or args.harness_include or args.harness_limit:
        raise ValueError("--clients, --harness-include and --harness-limit go with --harness")
    rec = RunRecorder(run_dir, resume=True)
    done = rec.last_complete_round()
    state = read_checkpoint(rec.checkpoints, done, rec.latest())[0] if done else None
    server = get_method(cfg.method.name).server(cfg, run_dir)
    server.setup()
    if state is not None:
        server.load_state_dict(state)
    participants = server_participants(server.evaluate(done))
    if not participants:
        print(f"{cfg.method.name} has no server model to evaluate; see metrics.jsonl for clients")
        return 0
    print(f"{run_dir} (after round {done}):")
    for name, metrics in participants.items():
        print(f"  {name}:")
        for key, value in metrics.items():
            print(f"  {key:>16}: {value:.4f}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from fedkt.export import export_model

    res = export_model(args.run_dir, args.participant, args.out, round=args.round,
                       merge=args.merge, overwrite=args.overwrite)
    what = {"adapter": f"PEFT adapter folder (base model: {res.base})",
            "merged": "merged Hugging Face model (AutoModelForCausalLM.from_pretrained)",
            "full": "whole Hugging Face model (the run trains every weight, no adapter)"}
    print(f"{res.participant} after round {res.round} -> {res.path}: {what[res.kind]}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedkt.evidence.paired_table import baseline_report, groups_report
    from fedkt.evidence.run_table import harness_report, report
    from fedkt.evidence.runs import group_runs, open_run
    from fedkt.tracking.rows import time_breakdown
    from fedkt.tracking.tables import breakdown_table

    runs = [open_run(p) for p in args.run_dirs]
    plain = [str(r.path) for r in runs]
    parts = [report(plain, metric=args.metric)]
    groups = group_runs(runs)
    if any(len(g.runs) > 1 for g in groups):
        parts.append("Seed groups (mean ± std over seeds):\n\n"
                     + groups_report(groups, args.metric))
    harness = harness_report(plain)
    if harness:
        parts.append("lm-evaluation-harness:\n\n" + harness)
    parts.append("Where the time went (seconds per phase, summed over participants):\n\n"
                 + breakdown_table([(r.label, time_breakdown(r.info.rows)) for r in runs]))
    if args.baseline:
        parts.append(baseline_report(args.run_dirs, args.baseline, args.metric,
                                     reps=args.bootstrap, seed=args.bootstrap_seed))
    table = "\n\n".join(parts)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")
    return 0


def cmd_suite_run(args: argparse.Namespace) -> int:
    import time

    from fedkt.evidence.deadline import STOPPED_EXIT, SuiteStopped, parse_stop_by
    from fedkt.evidence.suite_run import run_suite

    try:  # a stop time it cannot read is refused before anything runs
        stop_by = None if args.stop_by is None else parse_stop_by(args.stop_by, time.time())
    except ValueError as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 2
    try:
        run_suite(args.suite, jobs=args.jobs, output_dir=args.output_dir, quiet=args.quiet,
                  rerun_changed=args.rerun_changed, keep=args.keep,
                  runs_from=args.runs_from or (), command=args.command_line,
                  folds=args.fold, stop_by=stop_by)
    except SuiteStopped as exc:
        print(f"fedkt: stopped by --stop-by: {exc}", file=sys.stderr)
        return STOPPED_EXIT
    except KeyboardInterrupt:
        print("fedkt: suite interrupted; the same command finishes only what is missing",
              file=sys.stderr)
        return 130
    except RuntimeError as exc:  # some runs failed; the table covers the finished ones
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_suite_report(args: argparse.Namespace) -> int:
    from fedkt.evidence.suite_report import report_suite

    print(report_suite(args.suite_dir, into=args.into))
    return 0


def _table(make: Callable[[], str], output: str | None) -> int:
    """A suite table command's body: the table ``make`` builds, printed and written to
    ``output``; an input it cannot read is a named error (exit 2), even with ``-v``."""
    try:
        table = make()
    except (FileNotFoundError, ValueError) as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 2
    print(table, end="")
    if output:
        Path(output).write_text(table)
    return 0


def cmd_suite_across(args: argparse.Namespace) -> int:
    from fedkt.evidence.across import across_report

    return _table(lambda: across_report(args.suite_dirs), args.output)


def cmd_suite_power(args: argparse.Namespace) -> int:
    from fedkt.evidence.power import power_report, suite_targets

    floor, half = suite_targets(args.pilot)
    return _table(lambda: power_report(args.pilot, args.target_floor or floor or 0.10,
                                       args.half_width or half or 0.06, args.seeds),
                  args.output)


def cmd_suite_keep(args: argparse.Namespace) -> int:
    from fedkt.evidence.suite_keep import keep_runs

    def make() -> str:
        runs, size = keep_runs(args.source, args.dest)
        return f"kept {runs} finished run(s) of {args.source} in {args.dest} ({size:,} bytes)\n"
    return _table(make, None)


def cmd_suite_status(args: argparse.Namespace) -> int:
    from fedkt.evidence.suite_keep import fold_progress, status_suite, suite_status, time_left
    from fedkt.evidence.wall import suite_wall

    def make() -> str:
        suite = status_suite(args.suite, args.output_dir, args.fold)  # loaded once
        states = suite_status(args.suite, suite=suite)
        wall = suite_wall([suite.run_dir(arm, seed) for arm, seed, state in states
                           if state.startswith("done")])
        return ("".join(f"{arm:<24} seed {seed:<4} {state}\n" for arm, seed, state in states)
                + time_left(args.suite, suite=suite) + "\n"
                + (fold_progress(suite.fold_of, states) + "\n" if suite.fold_of else "")
                + (f"finished runs' wall time so far: {wall.text()}\n" if wall else ""))
    return _table(make, None)


SUITE_HELP = """\
A suite is a family of runs (arms x seeds) on one base config, with claims that
paired confidence intervals decide. A suite file:

  name: demo_suite
  base: quickstart              # run config: a path relative to this file, a shipped name
                                # (fedkt configs list), or an inline mapping
  seeds: [0, 1]
  baseline: standalone          # arm the table compares every other arm with
  arms:                         # name -> overrides of base (nested, or dotted like --set)
    fedavg: {}
    standalone: {method: {name: standalone}}
    lam1: {"method.ft_weight": 1.0}
  claims:                       # ARM[@ROUND].GROUP.METRIC OP [FACTOR *] ARM.GROUP.METRIC [+|- X]
                                # (OP ~= takes '+- TOL': equivalence)
    - fedavg.clients.accuracy > standalone.clients.accuracy
    - fedavg.server.accuracy >= 0.9 * standalone@0.clients.accuracy
    - fedavg.clients.accuracy > standalone.clients.accuracy and
      fedavg.server.accuracy >= standalone.server.accuracy - 0.03   # joint: every part
  # folds: [0, 1, 2, 3]         # instead of seeds: test folds (base data.split.folds)
  # seeds_per_fold: 2           # training seeds inside each fold; the fold is the unit
  # target_floor: 0.10          # design targets, checked per claim in the table
  # paper: {source: ..., rows: [{row: 'server, FedCoLLM', paper: 0.595,
  #         fedkt: fedcollm.server.accuracy}]}   # a paper's numbers beside the suite's
  metrics: [accuracy]           # optional: table columns
  groups: [server, clients]     # optional: participant groups (clients = mean, paired per client)

Verdicts: reproduced (CI of LHS - RHS on the claimed side, and 4 or more seeds or
folds carrying it), contradicted (on the other side), not resolved (CI contains 0),
fragile (the interval decides, the seeds do not). An edited suite file re-run into
the same folder is refused for the runs it changed (--rerun-changed runs them again).
Run folders: <suite>/<arm>/seed_<s> (with folds: <suite>/<arm>/fold_<f>/seed_<s>);
table: <suite>/suite.md; plots: <suite>/plots/. Shipped suites: fedkt configs list
(e.g. fedkt suite run suites/quick --jobs 2). See docs/evidence.md.
"""


def cmd_list(args: argparse.Namespace) -> int:
    """Methods, datasets and presets from their by-name tables; imports no method, no torch."""
    from fedkt.config.method_catalog import summaries
    from fedkt.data.builtin import list_builtin
    from fedkt.data.image_records import list_image_builtin
    from fedkt.models import tiny_preset_names
    from fedkt.models.offline import OFFLINE_ALIASES

    print("methods:")
    for name, summary in summaries().items():
        print(f"  {name:<18} {summary}")
    print("built-in datasets:")
    for name, desc in (list_builtin() | list_image_builtin()).items():
        print(f"  {name:<18} {desc}")
    print("tiny model presets:", ", ".join(tiny_preset_names()))
    print("offline model aliases (`fedkt models list`, `fedkt models install ALIAS`):",
          ", ".join(sorted(OFFLINE_ALIASES)))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from fedkt.data.summary import split_summary

    for title, cfg in _data_configs(args.config, args.set, args.seed, args.fold):
        print(title)
        print(split_summary(cfg, names=not args.no_names))
    return 0


def _data_configs(config: str, overrides: list[str], seeds: list[int] | None,
                  folds: list[int] | None = None):
    """``(title, run config)`` per seed of a suite (its first arm's data; with seeds inside
    folds, per fold: its first seed's, since a fold's seeds share its test part and sides)
    or a run config."""
    import yaml

    from fedkt.configs.catalog import resolve_config

    path = Path(config) if Path(config).is_file() else resolve_config(config)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if isinstance(raw, dict) and "arms" in raw and "base" in raw:
        from fedkt.evidence.suite import load_suite

        if overrides:
            raise ValueError("--set: overrides a run config's keys; a suite's data is its own")
        suite = load_suite(path)
        arm = next(iter(suite.cfg.arms))
        if suite.fold_of:
            if seeds is not None:
                raise ValueError(f"--seed: suite {suite.cfg.name} runs seeds inside folds; "
                                 f"pick folds with --fold (folds {suite.cfg.folds})")
            first: dict[int, int] = {}
            for seed, fold in suite.fold_of.items():
                first.setdefault(fold, seed)
            for fold in folds if folds is not None else list(first):
                if fold not in first:
                    raise ValueError(f"--fold: suite {suite.cfg.name} has no fold {fold} "
                                     f"(folds {suite.cfg.folds})")
                cfg = suite.runs[(arm, first[fold])]
                yield (f"suite {suite.cfg.name} ({path}), arm {arm}'s data, fold {fold}, "
                       f"{cfg.clients.num_clients} clients:", cfg)
            return
        if folds is not None:
            raise ValueError(f"--fold: suite {suite.cfg.name} has no folds (its seeds are "
                             f"{suite.cfg.seeds}: use --seed)")
        picked = seeds if seeds is not None else suite.cfg.seeds
        missing = [s for s in picked if (arm, s) not in suite.runs]
        if missing:
            raise ValueError(f"--seed: suite {suite.cfg.name} has no seed {missing[0]} "
                             f"(seeds {suite.cfg.seeds})")
        for seed in picked:
            cfg = suite.runs[(arm, seed)]
            yield (f"suite {suite.cfg.name} ({path}), arm {arm}'s data, "
                   f"{cfg.clients.num_clients} clients:", cfg)
        return
    base = _load(path, overrides, {})
    if folds is not None:
        if not base.data.split.folds:
            raise ValueError("--fold: the config has no data.split.folds")
        for fold in folds:
            cfg = _load(path, [*overrides, f"data.split.fold={fold}"], {})
            yield f"config {path}, fold {fold}, {cfg.clients.num_clients} clients:", cfg
        return
    for seed in seeds if seeds is not None else [base.seed]:
        cfg = base.model_copy(update={"seed": seed})
        yield f"config {path}, {cfg.clients.num_clients} clients:", cfg


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedkt", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Federated knowledge transfer between a server's large model and clients' "
                    "small models.", epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def overrides(p: argparse.ArgumentParser) -> None:
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (dotted, YAML value), e.g. "
                            "--set training.lr=1e-4; repeatable")
        p.add_argument("-q", "--quiet", action="store_true", help="no per-round tables")

    p = sub.add_parser("run", help="run a job from a YAML config",
                       description="Run a federated job described by a YAML config.")
    p.add_argument("config", nargs="?", default=None,
                   help="a shipped config's name (`fedkt configs list`; default: the demo) "
                        "or the path of a YAML run config")
    p.add_argument("--runtime", metavar="NAME",
                   help="transport (overrides runtime.name): a registered runtime, e.g. local, "
                        "flower-sim or flower; a config naming another lists them")
    p.add_argument("--rounds", type=int, help="overrides rounds")
    p.add_argument("--seed", type=int, help="overrides seed")
    p.add_argument("--output-dir", help="run folder (overrides output_dir)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    overrides(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue an interrupted run from its last round",
                       description="Continue a run from its last completed round.")
    p.add_argument("run_dir")
    overrides(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("eval", help="evaluate a run's last checkpoint on the test split")
    p.add_argument("run_dir")
    p.add_argument("--harness", metavar="TASK[,TASK]",
                   help="run lm-evaluation-harness tasks instead (pip install 'fedkt[harness]'; "
                        "offline: fedkt_intent_recognition, fedkt_social_iqa); results in "
                        "RUN_DIR/harness/")
    p.add_argument("--clients", action="store_true",
                   help="with --harness: every client's final model too")
    p.add_argument("--harness-include", action="append", default=[], metavar="DIR",
                   help="with --harness: a folder of your own lm-eval task YAMLs; repeatable")
    p.add_argument("--harness-limit", type=float, metavar="N",
                   help="with --harness: the first N documents of each task (a fraction if < 1)")
    overrides(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="a run's model as a PEFT adapter folder or a merged "
                       "Hugging Face model (loadable without fedkt)",
                       description="Export one participant's model of a run in Hugging Face "
                                   "/ PEFT format (see docs/models.md, exporting).")
    p.add_argument("run_dir")
    p.add_argument("out", help="folder to write (must be empty)")
    p.add_argument("--participant", default="server",
                   help="server (default), global_slm (FedCoLLM) or client_K")
    p.add_argument("--round", type=int, help="a checkpointed round (default: the last; 0: "
                   "the initial model)")
    p.add_argument("--merge", action="store_true",
                   help="fold the LoRA into the base weights: one plain Hugging Face model")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty folder")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", help="compare runs in a markdown table (paired CIs with "
                       "--baseline)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN",
                   help="run folder, or RUN@ROUND for another evaluation round (e.g. @0)")
    p.add_argument("--metric", help="metric column(s) to show, comma-separated (default: the task's main metric)")
    p.add_argument("--baseline", metavar="RUN",
                   help="add each run's difference to this run (RUN or RUN@ROUND) per "
                        "participant and metric, with a 95%% paired bootstrap CI over the "
                        "shared test examples and McNemar's exact p; runs differing only in "
                        "seed are grouped (mean over seeds, CI over seeds and examples)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("-o", "--output", help="also write the table to this file")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("suite", help="run a suite of runs (arms x seeds) and decide its claims",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Suites: families of runs with claims decided by paired "
                                   "confidence intervals.", epilog=SUITE_HELP)
    suite_sub = p.add_subparsers(dest="suite_command", required=True, metavar="SUBCOMMAND")
    q = suite_sub.add_parser("run", help="run what is missing, then write the table",
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog=SUITE_HELP)
    q.add_argument("suite", help="suite YAML")
    q.add_argument("--jobs", type=int, default=1, help="runs at once (torch threads are split)")
    q.add_argument("--output-dir", help="suite folder (default: the suite's output_dir)")
    q.add_argument("-q", "--quiet", action="store_true")
    q.add_argument("--rerun-changed", action="store_true",
                   help="run again, from the start, the runs of the folder whose config the "
                        "edited suite file changed (without it they are refused by name)")
    q.add_argument("--keep", metavar="DIR",
                   help="keep each run's records (no weights) into DIR as it finishes, as "
                        "`fedkt suite keep` does; a DIR it would refuse is refused first, "
                        "and DIR's finished runs the folder lacks are taken, not run again")
    q.add_argument("--runs-from", metavar="DIR", action="append",
                   help="take each finished run of the suite folder DIR (or a kept one) "
                        "that this suite would make itself, the same config and setting, "
                        "rather than run it again (repeatable)")
    q.add_argument("--fold", type=int, action="append", metavar="K",
                   help="run only this of the suite's folds (repeatable): each fold's runs "
                        "are the whole suite's, and the report names the folds left out; "
                        "e.g. a second kernel setting on 4 of 8 folds, pooled on the folds "
                        "both ran (docs/evidence.md, \"Machines\")")
    q.add_argument("--stop-by", metavar="WHEN",
                   help="end by WHEN, a duration from now (90m, 2h30m) or a time with its "
                        "zone (2026-12-06T12:00Z): start no run whose arm's mean wall time "
                        "in the folder would end after it; the runs going finish (and are "
                        "kept), then it exits 75 and the same command goes on later")
    q.set_defaults(func=cmd_suite_run)
    q = suite_sub.add_parser("report", help="re-render a suite's table, verdicts and plots")
    q.add_argument("suite_dir")
    q.add_argument("--into", metavar="DIR", help="write suite.md, suite.json and plots here "
                   "(default: SUITE_DIR), e.g. to report a kept folder without writing in it")
    q.set_defaults(func=cmd_suite_report)
    q = suite_sub.add_parser("across", help="one suite's claims under several environments "
                             "(kernel settings): reproduced only where every one says so")
    q.add_argument("suite_dirs", nargs="+", metavar="[LABEL=]SUITE_DIR",
                   help="the same suite's folders, one per environment")
    q.add_argument("-o", "--output", help="also write the table to this file")
    q.set_defaults(func=cmd_suite_across)
    q = suite_sub.add_parser("power", help="from a pilot suite folder: fold SD, item SE, floor "
                             "and the folds, runs and hours a target floor and half-width need")
    q.add_argument("pilot", help="a finished suite folder (or one fold of one)")
    q.add_argument("--target-floor", type=float, default=None,
                   help="detection floor to reach (default: the suite's target_floor, or 0.10)")
    q.add_argument("--half-width", type=float, default=None,
                   help="95%% half-width to reach (default: the suite's target_half_width, "
                        "or 0.06)")
    q.add_argument("--seeds", type=int, default=None,
                   help="plan with this many training seeds a fold (default: the pilot's); "
                        "needs a pilot with several seeds a fold, whose fold SD it splits")
    q.add_argument("-o", "--output", help="also write the table to this file")
    q.set_defaults(func=cmd_suite_power)
    q = suite_sub.add_parser("keep", help="copy a suite folder's finished runs' records (no "
                             "weights) into another folder, to report or finish them later on "
                             "a machine of the same setting")
    q.add_argument("source", help="a suite folder")
    q.add_argument("dest", help="the folder to copy them into (a suite folder to run on)")
    q.set_defaults(func=cmd_suite_keep)
    q = suite_sub.add_parser("status", help="which runs of a suite are done, started or new")
    q.add_argument("suite", help="suite YAML, or a suite folder (the suite.yaml it keeps)")
    q.add_argument("--output-dir", help="the suite file's folder (default: its output_dir)")
    q.add_argument("--fold", type=int, action="append", metavar="K",
                   help="only this of the suite's folds (repeatable), as `suite run --fold`")
    q.set_defaults(func=cmd_suite_status)

    p = sub.add_parser("data", help="a config's data split: each side's classes and record "
                       "counts, per seed (fold)",
                       description="Build a run config's (or a suite's) data as its runs do "
                                   "and print, per seed, the classes of the server's and the "
                                   "clients' side and the record counts; data.require's "
                                   "checks are applied.")
    p.add_argument("config", help="a run config or suite: a shipped name (`fedkt configs "
                   "list`) or a YAML path")
    p.add_argument("--seed", type=int, action="append", metavar="N",
                   help="only this seed (fold); repeatable (default: the suite's seeds, or "
                        "the config's seed)")
    p.add_argument("--fold", type=int, action="append", metavar="K",
                   help="only this test fold; repeatable (a suite with seeds inside folds: "
                        "default every fold; a config: sets data.split.fold)")
    p.add_argument("--no-names", action="store_true", help="class counts without the names")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of a run config (dotted, YAML value)")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("list", help="list methods, built-in datasets and model presets")
    p.set_defaults(func=cmd_list, light=True, plugins=True)  # no torch; plugins' methods too

    from fedkt.configs.catalog import add_config_commands
    from fedkt.models.install import add_model_commands

    add_config_commands(sub)
    add_model_commands(sub)
    try:
        from fedkt.runtime.flower_deploy import add_deploy_commands
    except ImportError:  # pragma: no cover - flower extras missing
        pass
    else:
        add_deploy_commands(sub)
    return parser


def _import_plugins() -> int | None:
    """Import the ``FEDKT_PLUGINS`` modules (methods, runtimes, readers registered outside
    fedkt); the exit status 2 when one fails, else None."""
    from fedkt.infra.plugins import PLUGINS_ENV, import_plugins

    try:
        import_plugins()
    except (ImportError, AttributeError) as exc:
        print(f"fedkt: error: {PLUGINS_ENV}={os.environ.get(PLUGINS_ENV)!r}: {exc}",
              file=sys.stderr)
        return 2
    return None


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["fedkt", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "light", False):  # `fedkt models|configs|list ...`: no torch needed
        if getattr(args, "plugins", False) and (failed := _import_plugins()) is not None:
            return failed
        try:
            return args.func(args)
        except (ValueError, OSError) as exc:
            print(f"fedkt: error: {exc}", file=sys.stderr)
            return 2
    from fedkt.config import ConfigError
    from fedkt.federated.payload import PayloadError
    from fedkt.methods.errors import RoundError
    from fedkt.runtime.envelope import TransportError

    if (failed := _import_plugins()) is not None:  # before a config is read
        return failed
    try:
        return args.func(args)
    except TransportError as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 3
    except (ConfigError, PayloadError, FileNotFoundError, FileExistsError) as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, read-only folder, a file where a folder should be
        if args.verbose:
            raise
        where = f" ({exc.filename})" if getattr(exc, "filename", None) \
            and str(exc.filename) not in str(exc) else ""
        print(f"fedkt: error: {exc}{where}", file=sys.stderr)
        return 2
    except RoundError as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        run_dir = getattr(args, "run_dir", None) or getattr(args, "output_dir", None)
        hint = run_dir or "RUN_DIR"
        print(f"fedkt: the run stopped; completed rounds are checkpointed: "
              f"`fedkt resume {hint}` continues it", file=sys.stderr)
        return 1
    except ValueError as exc:  # data errors and other validation failures
        if args.verbose:
            raise
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedkt: interrupted; `fedkt resume RUN_DIR` continues from the last round",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
