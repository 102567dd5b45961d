"""Suites: a family of runs sharing data, models and seeds, with claims decided by CIs.

A suite YAML::

    name: demo_suite                 # the folder is output_dir (default runs/suites/{name})
    base: ../quickstart.yaml         # a run config: a path (relative to this file) or inline
    seeds: [0, 1]
    baseline: standalone             # the arm every other arm is compared with in the table
    arms:                            # name -> overrides of the base (dotted keys or nested)
      fedavg: {}
      standalone: {method: {name: standalone}}
    primary: fedavg.clients.accuracy > standalone.clients.accuracy   # declared before it runs
    claims:                          # secondary claims
      - fedavg.server.accuracy > standalone.server.accuracy
    metrics: [accuracy]              # table columns (default: each group's per-example metrics)
    groups: [server, clients]        # participant groups in the table
    bootstrap: 2000                  # resamples; level: 0.95; bootstrap_seed: 0
    comparison:                      # optional: accuracy, bytes, compute per arm
      server_baseline: zero_shot
      clients_baseline: standalone
      read: {fedavg: {server: null, clients: server}}

``folds: [0, 1, 2, 3]`` with ``seeds_per_fold: 2`` runs two training seeds inside each
test fold (``<suite>/<arm>/fold_<f>/seed_<seed>``; the fold is the unit of the verdicts);
``target_floor`` / ``target_half_width`` add a design-targets table.
``fold_overrides: {4: {data.dataset.classes: "60-89", data.split.fold: 0}}`` gives a fold
its own overrides (after the arm's): a suite may then take more folds than one testbed's
records make, each still one unit of the verdict.

Each (arm, seed) is an ordinary run folder, ``<suite>/<arm>/seed_<seed>``.  A run
whose last round is checkpointed is skipped; a started one is resumed; so after
a crash or Ctrl-C the same command finishes only what is missing; a run whose kept config
differs from what the (edited) suite file gives it is refused by name unless
``rerun_changed``.  ``--jobs N``
runs N at once (each a ``fedkt`` process with ``cores / N`` torch threads).
``--runs-from DIR`` takes each finished run of another suite folder that this suite would
make itself (the same config and setting) instead of running it again.  The
suite ends with ``suite.md`` (the table and the claims' verdicts), ``suite.json``
and ``plots/``; a ``comparison`` section adds the cross-method table
(:mod:`fedkt.evidence.method_table`).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from fedkt.config import (
    ConfigError,
    RunConfig,
    _set_dotted,
    _Strict,
    parse_config,
)
from fedkt.configs.catalog import UnknownConfigError, resolve_config
from fedkt.eval.predictions import read_predictions
from fedkt.evidence.choice import ChoiceRule, check_choice, choice_markdown, choose
from fedkt.evidence.claims import (
    Claim,
    ClaimError,
    Decision,
    Joint,
    Ref,
    decide,
    decide_joint,
    parse_claim,
)
from fedkt.evidence.deadline import SuiteStopped, why_not_start
from fedkt.evidence.invocations import (
    commands_text,
    keep_invocations,
    read_invocations,
    record_invocation,
)
from fedkt.evidence.method_table import (
    ComparisonConfig,
    check_comparison,
    comparison_report,
)
from fedkt.evidence.paper import PaperReference, check_paper, paper_markdown, paper_result
from fedkt.evidence.runs import (
    Group,
    Run,
    available_metrics,
    compare,
    fmt_mean_std,
    open_run,
    paired,
)
from fedkt.evidence.stats import DEFAULT_BOOTSTRAP, DEFAULT_LEVEL
from fedkt.evidence.suite_plots import suite_plots
from fedkt.evidence.wall import SITTING_GAP_S, suite_wall
from fedkt.infra.environment import code_label, describe, environment
from fedkt.infra.precision import physical_cores
from fedkt.tracking.folder import CONFIG_FILE, LATEST_FILE
from fedkt.tracking.resume import changed_keys
from fedkt.tracking.rows import mean_breakdown, sum_breakdown, time_breakdown
from fedkt.tracking.summary import read_environment
from fedkt.tracking.tables import breakdown_table, format_table

__all__ = ["SuiteConfig", "load_suite", "only_folds", "report_suite", "run_suite"]

FOLD_SEED_BASE = 1000  # a run's seed inside fold f: 1000 * (r + 1) + f
SUITE_TABLE = "suite.md"
SUITE_JSON = "suite.json"


class SuiteConfig(_Strict):
    """A suite file (see the module docstring)."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    base: str | dict[str, Any]
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    # Seeds inside folds: the test folds (the base's data.split.folds cuts the records) and
    # the training seeds run inside each; the fold is the unit of the verdict.  Run (fold f,
    # r-th seed) has seed FOLD_SEED_BASE * (r + 1) + f, never its fold's index.
    folds: list[int] | None = Field(None, min_length=1)
    seeds_per_fold: int | None = Field(None, ge=1)
    # A fold's own overrides of its runs' config (after the arm's and the fold's): e.g.
    # folds 4-7 the same cut of other classes, so that a suite has more folds than one
    # testbed's records make.  Each fold stays one unit of the verdict.
    fold_overrides: dict[int, dict[str, Any]] = Field(default_factory=dict)
    # The suite file's folds where a folder runs only some of them (`fedkt suite run
    # --fold`, e.g. a second kernel setting on 4 of 8 folds): written into the folder's
    # suite.yaml, never into a suite file, and named by the folder's report.
    declared_folds: list[int] | None = None
    # The design's targets: the claims table says, per claim, whether they were met.
    target_floor: float | None = Field(None, gt=0)
    target_half_width: float | None = Field(None, gt=0)
    arms: dict[str, dict[str, Any]] = Field(..., min_length=1)
    baseline: str | None = None
    # The one claim the suite is run to decide, written in the file before it runs; the
    # others are secondary, and suite.md says so.  A suite without one says that too.
    primary: str | None = None
    claims: list[str] = Field(default_factory=list)
    metrics: list[str] | None = None
    groups: list[str] = Field(default_factory=lambda: ["server", "clients"], min_length=1)
    output_dir: str = "runs/suites/{name}"
    bootstrap: int = Field(DEFAULT_BOOTSTRAP, ge=100)
    level: float = Field(DEFAULT_LEVEL, gt=0.5, lt=1.0)
    bootstrap_seed: int = 0
    # The cross-method table (fedkt.evidence.method_table): accuracy, bytes, compute, exposure.
    comparison: ComparisonConfig | None = None
    # Experiment trackers for every run (a run config's ``tracking``, e.g. [mlflow]); an
    # arm's own ``tracking`` wins.  Each (arm, seed) is one tracking run tagged suite, arm
    # and seed, in one MLflow experiment (the suite's name; store SUITE/mlruns unless
    # $MLFLOW_TRACKING_URI) and under SUITE/tensorboard/ARM/seed_N.
    tracking: list[str] | dict[str, Any] | None = None
    # A paper's table this suite runs at reduced scale: its numbers beside the suite's
    # (fedkt.evidence.paper); they decide nothing.
    paper: PaperReference | None = None
    # A pilot's rule for which arm a later suite tests (fedkt.evidence.choice), declared
    # before it runs and applied by the report.
    choice: ChoiceRule | None = None

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, overrides in arms.items():
            if not name or not name[0].isalnum() or any(c in name for c in ".@/ "):
                raise ValueError(f"arm name {name!r}: use letters, digits, '_' and '-'")
            if not isinstance(overrides, dict):
                raise ValueError(f"arm {name!r}: overrides must be a mapping")
        return arms

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds {seeds} repeat a seed")
        return seeds

    @field_validator("folds")
    @classmethod
    def _unique_folds(cls, folds: list[int] | None) -> list[int] | None:
        if folds is not None:
            if len(set(folds)) != len(folds):
                raise ValueError(f"folds {folds} repeat a fold")
            if any(not 0 <= f < FOLD_SEED_BASE for f in folds):
                raise ValueError(f"folds {folds}: each fold is 0..{FOLD_SEED_BASE - 1}")
        return folds

    @field_validator("fold_overrides")
    @classmethod
    def _fold_overrides(cls, overrides: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        for fold, over in overrides.items():
            if not over:
                raise ValueError(f"fold_overrides: fold {fold}: give a mapping of overrides")
        return overrides

    def run_seeds(self) -> dict[int, int | None]:
        """Every run's seed and its test fold (None: the seed is its own unit)."""
        if self.folds is None:
            return {s: None for s in self.seeds}
        return {FOLD_SEED_BASE * (r + 1) + f: f for f in self.folds
                for r in range(self.seeds_per_fold or 1)}


@dataclass
class Suite:
    cfg: SuiteConfig
    folder: Path
    runs: dict[tuple[str, int], RunConfig]  # (arm, seed) -> validated run config
    claims: list[Claim | Joint]  # the primary claim first, if the file declares one
    source: Path  # the suite file
    primary: Claim | Joint | None = None
    fold_of: dict[int, int] | None = None  # seed -> test fold (seeds inside folds)

    @property
    def seeds(self) -> list[int]:
        """Every run's seed, in order (with folds, fold by fold)."""
        return list(self.fold_of) if self.fold_of else list(self.cfg.seeds)

    def run_dir(self, arm: str, seed: int) -> Path:
        if self.fold_of:
            return self.folder / arm / f"fold_{self.fold_of[seed]}" / f"seed_{seed}"
        return self.folder / arm / f"seed_{seed}"


def only_folds(cfg: SuiteConfig, folds: Sequence[int]) -> SuiteConfig:
    """``cfg`` run on only ``folds`` of its folds, in the file's order: each fold's runs
    are the very runs of the whole suite (the same seeds, configs and overrides), so a
    folder of some folds can be finished, or taken from (``--runs-from``), by the whole
    suite later.  ``declared_folds`` keeps the file's folds for the report.  Raises
    ``ValueError`` naming a fold the suite does not have."""
    if cfg.folds is None:
        raise ValueError("--fold: the suite has no folds (its seeds are its units)")
    stray = [f for f in folds if f not in cfg.folds]
    if stray:
        raise ValueError(f"--fold: the suite has no fold {stray[0]} (folds {cfg.folds})")
    chosen = [f for f in cfg.folds if f in set(folds)]
    return cfg.model_copy(update={"folds": chosen,
                                  "declared_folds": cfg.declared_folds or list(cfg.folds)})


def _deep_merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if "." in key:  # a dotted override, as --set takes
            try:
                _set_dotted(out, key, value)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value, f"{where}.{key}")
        else:
            out[key] = value
    return out


def _read_yaml(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ConfigError(f"{what}: file not found: {path}")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: {path} is not valid YAML ({exc})") from None


def load_suite(path: str | Path, output_dir: str | Path | None = None,
               folds: Sequence[int] | None = None) -> Suite:
    """Read and validate a suite file: every (arm, seed) config and every claim, before
    any run starts, with errors naming the file, arm and key.  ``folds``: only these of
    the suite's folds (:func:`only_folds`)."""
    path = Path(path)
    if not path.is_file():  # a shipped suite's name, e.g. suites/quick
        try:
            path = resolve_config(str(path))
        except UnknownConfigError as exc:
            raise ConfigError(f"suite: {exc}") from None
    raw = _read_yaml(path, "suite")
    if not isinstance(raw, dict):
        raise ConfigError(f"suite {path}: the top level must be a mapping")
    try:
        cfg = SuiteConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"invalid suite {path}:\n" + "\n".join(lines)) from None
    if isinstance(cfg.base, str):
        base_path = (path.parent / cfg.base).resolve()
        if not base_path.is_file():  # a shipped config's name (`fedkt configs list`)
            try:
                base_path = resolve_config(cfg.base)
            except UnknownConfigError as exc:
                raise ConfigError(f"suite {path}: base: {exc}") from None
        base = _read_yaml(base_path, f"suite {path}: base")
    else:
        base = cfg.base
    if not isinstance(base, dict):
        raise ConfigError(f"suite {path}: base must be a run config mapping")
    if cfg.baseline is not None and cfg.baseline not in cfg.arms:
        raise ConfigError(f"suite {path}: baseline {cfg.baseline!r} is not an arm "
                          f"({sorted(cfg.arms)})")
    if cfg.comparison is not None:
        try:
            check_comparison(cfg.comparison, list(cfg.arms))
        except ValueError as exc:
            raise ConfigError(f"suite {path}: {exc}") from None
    if cfg.paper is not None:
        try:
            check_paper(cfg.paper, set(cfg.arms), cfg.groups)
        except ValueError as exc:
            raise ConfigError(f"suite {path}: {exc}") from None
    if cfg.choice is not None:
        try:
            check_choice(cfg.choice, set(cfg.arms), cfg.groups)
        except ValueError as exc:
            raise ConfigError(f"suite {path}: {exc}") from None
    if cfg.seeds_per_fold is not None and cfg.folds is None:
        raise ConfigError(f"suite {path}: seeds_per_fold: needs folds (the test folds)")
    stray = sorted(set(cfg.fold_overrides) - set(cfg.declared_folds or cfg.folds or []))
    if stray:
        raise ConfigError(f"suite {path}: fold_overrides: fold {stray[0]} is not one of the "
                          f"suite's folds ({cfg.declared_folds or cfg.folds})")
    if cfg.folds is not None and "seeds" in raw:
        raise ConfigError(f"suite {path}: seeds: with folds, each run's seed is derived "
                          f"({FOLD_SEED_BASE} * (r + 1) + fold); give seeds_per_fold instead")
    if cfg.declared_folds is not None and not set(cfg.folds or []) <= set(cfg.declared_folds):
        raise ConfigError(f"suite {path}: declared_folds: {cfg.declared_folds} must hold "
                          f"every fold the folder runs ({cfg.folds})")
    if folds is not None:
        try:
            cfg = only_folds(cfg, folds)
        except ValueError as exc:
            raise ConfigError(f"suite {path}: {exc}") from None
    folder = Path(output_dir or cfg.output_dir.format(name=cfg.name))
    fold_of = {s: f for s, f in cfg.run_seeds().items() if f is not None} or None
    probe = Suite(cfg, folder, {}, [], path, None, fold_of)
    runs = {}
    for arm, overrides in cfg.arms.items():
        data = _deep_merge(base, overrides, f"suite {path}: arm {arm!r}")
        for seed, fold in cfg.run_seeds().items():
            run_data = {**data, "seed": seed, "name": f"{arm}",
                        "output_dir": str(probe.run_dir(arm, seed))}
            if fold is not None:
                run_data = copy.deepcopy(run_data)
                _set_dotted(run_data, "data.split.fold", fold)
                if fold in cfg.fold_overrides:
                    run_data = _deep_merge(run_data, cfg.fold_overrides[fold],
                                           f"suite {path}: fold_overrides: fold {fold}")
            if cfg.tracking is not None and "tracking" not in overrides:
                run_data["tracking"] = copy.deepcopy(cfg.tracking)
            if run_data.get("tracking"):
                run_data["tracking"] = _suite_tracking(run_data["tracking"], cfg.name, folder,
                                                       arm, seed)
            try:
                runs[(arm, seed)] = parse_config(run_data, f"(suite {path}, arm {arm!r})")
            except ConfigError as exc:
                raise ConfigError(str(exc)) from None
            split = runs[(arm, seed)].data.split
            if fold is not None and split.folds is None:
                raise ConfigError(f"suite {path}: folds: arm {arm!r} has no "
                                  "data.split.folds to cut the records into folds")
            if fold is not None and seed == split.fold_seed:
                raise ConfigError(f"suite {path}: arm {arm!r}: seed {seed} is the split's "
                                  "fold_seed; a training seed must differ from it")
    try:
        primary = parse_claim(cfg.primary, set(cfg.arms)) if cfg.primary else None
        claims = [parse_claim(c, set(cfg.arms)) for c in cfg.claims]
    except ClaimError as exc:
        raise ConfigError(f"suite {path}: {exc}") from None
    if primary is not None:  # first, and once
        claims = [primary, *(c for c in claims if c.text != primary.text)]
    if isinstance(cfg.base, str):  # the copy in the suite folder must find its base too
        cfg = cfg.model_copy(update={"base": base})
    return Suite(cfg, folder, runs, claims, path, primary, fold_of)


def _suite_tracking(tracking: Any, suite: str, folder: Path, arm: str, seed: int) -> Any:
    """A run's ``tracking`` with the suite's defaults: one run per (arm, seed), tagged
    with both, in the suite's experiment and folders (explicit settings win)."""
    if isinstance(tracking, list | str):
        tracking = {"backends": tracking}
    if not isinstance(tracking, dict):
        return tracking  # parse_config names what is wrong with it
    out = copy.deepcopy(tracking)
    out.setdefault("run_name", f"{arm}/seed_{seed}")
    out["tags"] = {**(out.get("tags") or {}), "suite": suite, "arm": arm, "seed": str(seed)}
    mlflow = out.setdefault("mlflow", {})
    tensorboard = out.setdefault("tensorboard", {})
    if isinstance(mlflow, dict):
        mlflow.setdefault("experiment", suite)
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.setdefault("uri", str(folder / "mlruns"))
    if isinstance(tensorboard, dict):
        tensorboard.setdefault("dir", str(folder / "tensorboard" / arm / f"seed_{seed}"))
    return out


# --------------------------------------------------------------------------- running


def run_state(run_dir: Path, rounds: int) -> str:
    """``done`` (last round checkpointed), ``started`` or ``new``."""
    latest = run_dir / "checkpoints" / LATEST_FILE
    if latest.is_file():
        try:
            done = int(json.loads(latest.read_text()).get("round", 0))
        except (ValueError, json.JSONDecodeError, AttributeError):
            done = 0
        return "done" if done >= rounds else "started"
    return "started" if (run_dir / "metrics.jsonl").is_file() else "new"


def config_changes(run_dir: Path, cfg: RunConfig) -> list[str]:
    """The keys in which a run's kept ``config.yaml`` differs from ``cfg`` (what the suite
    file resolves that run to now).  Not compared: where the run is (``output_dir``,
    ``name``, ``tracking``), ``runtime.torch_threads`` where the suite leaves it to the
    cores, and keys fedkt added since the run began (``config.yaml``'s keys only)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return []
    try:
        saved_raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return [f"{CONFIG_FILE} (unreadable)"]
    changes = changed_keys(saved_raw if isinstance(saved_raw, dict) else {}, cfg)
    return [key for key, (_, now) in changes.items()
            if key not in ("output_dir", "name") and not key.startswith("tracking.")
            # runtime.torch_threads left to the cores: the suite gave the run its jobs' share
            and not (key == "runtime.torch_threads" and not now)]


class SuiteChangedError(ConfigError):
    """Finished (or started) runs of a suite folder were made with another suite file."""


class SuiteMachineError(ConfigError):
    """Finished (or started) runs of a suite folder were computed under another setting
    (fedkt's code, libraries, kernels, CPU, threads) than a run started now would be."""


#: The fields of environment.json whose difference moves a run's numbers: one suite folder
#: holds runs of one setting (docs/evidence.md, "Machines"), fedkt's code included
#: (``code``: :func:`fedkt.infra.environment.source_digest`; ``commit`` only names it).
SETTING_KEYS = ("code", "torch", "transformers", "peft", "cpu_capability", "cpu_flags",
                "cpu_model", "onednn_max_cpu_isa", "kernel_env", "cuda", "torch_threads")


def setting_changes(run_dir: Path, now: dict[str, Any]) -> list[str]:
    """``key: kept -> now`` for each :data:`SETTING_KEYS` field in which an environment
    a run recorded (any of its entries) differs from ``now``; a field a run did not record
    (an older fedkt) is not compared."""
    out: list[str] = []
    for entry in read_environment(run_dir):
        for key in SETTING_KEYS:
            if key in entry and key in now and entry[key] != now[key]:
                kept, here = ((code_label(entry), code_label(now)) if key == "code"
                              else (entry[key], now[key]))
                change = f"{key}: {kept} -> {here}"
                if change not in out:
                    out.append(change)
    return out


def current_setting(threads: int | None) -> dict[str, Any]:
    """The setting a run started now from this process gets: its libraries and kernels
    (:func:`fedkt.infra.environment.environment`) and ``threads`` torch threads (None:
    not compared)."""
    env = environment()
    env.pop("torch_threads")
    if threads is not None:
        env["torch_threads"] = threads
    return env


def _run_setting(now: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """The setting a run of ``cfg`` started now gets: ``now``, but the config's own thread
    count wins where it sets one, as when the run starts (:func:`run_suite`)."""
    threads = cfg.runtime.torch_threads
    return {**now, "torch_threads": threads} if threads else now


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def plan_runs(suite: Suite, *, rerun_changed: bool = False, quiet: bool = True,
              threads: int | None = None) -> list[tuple[str, int, RunConfig, str]]:
    """``(arm, seed, config, state)`` of every run still to do.  A run of the folder made
    with another config than the suite file gives it now (an edited suite file) raises
    :class:`SuiteChangedError` naming it and the keys that differ, before anything runs;
    with ``rerun_changed`` it is run again from the start (state ``new``).  A run of the
    folder computed under another setting than a run started now would be (libraries,
    kernels, CPU model, and ``threads`` torch threads where given:
    :func:`setting_changes`) raises :class:`SuiteMachineError` naming it and what
    differs: a suite folder holds one setting, so a suite is finished on a machine of its
    own setting (or run into another folder).

    With folds the runs come fold by fold (in each fold the arms in file order, then the
    seeds), so a suite stopped part-way leaves whole folds to report, and a fold's
    controls start after its first arm, whose round 0, training and knowledge the reuse
    store then serves them."""
    now = current_setting(threads)
    changed, moved = {}, {}
    for (arm, seed), cfg in suite.runs.items():
        run_dir = suite.run_dir(arm, seed)
        if run_state(run_dir, cfg.rounds) == "new":
            continue
        keys = config_changes(run_dir, cfg)
        if keys:  # an edited suite file: refused or rerun below, whatever its setting
            changed[(arm, seed)] = keys
            continue
        diff = setting_changes(run_dir, _run_setting(now, cfg))
        if diff:
            moved[(arm, seed)] = diff
    if moved:
        lines = [f"  {arm} seed {seed}: {'; '.join(diff)}" for (arm, seed), diff in moved.items()]
        raise SuiteMachineError(
            f"suite {suite.source}: {len(moved)} run(s) in {suite.folder} were computed "
            "under another setting than a run started here now would be (kept -> now):\n"
            + "\n".join(lines[:12]) + (f"\n  and {len(lines) - 12} more" if len(lines) > 12
                                       else "")
            + "\nfinish the suite on a machine of its setting (the same libraries, kernels, "
            "CPU and --jobs) with the fedkt code it began with (a git worktree of the commit "
            "named), or run it into a new folder (--output-dir)")
    if changed and not rerun_changed:
        lines = [f"  {arm} seed {seed}: {', '.join(keys[:8])}"
                 + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
                 for (arm, seed), keys in changed.items()]
        raise SuiteChangedError(
            f"suite {suite.source}: {len(changed)} run(s) in {suite.folder} were made with "
            "another config than the suite file gives them now (keys that differ):\n"
            + "\n".join(lines) + "\nrun the edited suite into a new folder (--output-dir), "
            "or pass --rerun-changed to run these again from the start")
    todo = []
    for (arm, seed), cfg in suite.runs.items():
        if (arm, seed) in changed:
            if not quiet:
                print(f"suite {suite.cfg.name}: {arm} seed {seed}: its config changed "
                      f"({', '.join(changed[(arm, seed)][:4])}); running it again")
            todo.append((arm, seed, cfg, "new"))
            continue
        state = run_state(suite.run_dir(arm, seed), cfg.rounds)
        if state == "done":
            if not quiet:
                print(f"suite {suite.cfg.name}: {arm} seed {seed}: done, skipped")
            continue
        todo.append((arm, seed, cfg, state))
    if suite.fold_of:
        arms = list(suite.cfg.arms)
        todo.sort(key=lambda t: (suite.fold_of[t[1]], arms.index(t[0])))  # stable: seeds
    return todo


def load_suite_folder(folder: str | Path, folds: Sequence[int] | None = None) -> Suite:
    """The suite a suite folder holds: the ``suite.yaml`` it keeps, its runs in it;
    ``folds``: only these of its folds (:func:`only_folds`)."""
    folder = Path(folder)
    if not (folder / "suite.yaml").is_file():
        raise FileNotFoundError(f"{folder}: no suite.yaml; is it a suite folder?")
    return load_suite(folder / "suite.yaml", folder, folds)


def run_suite(path: str | Path, *, jobs: int = 1, output_dir: str | Path | None = None,
              quiet: bool = False, rerun_changed: bool = False,
              keep: str | Path | None = None,
              runs_from: Sequence[str | Path] = (), command: str | None = None,
              folds: Sequence[int] | None = None, stop_by: float | None = None) -> Path:
    """Run what is missing of a suite, then write its table and plots; returns the folder.

    A run of the folder made with another config than the suite file now gives it (an
    edited suite file) is refused by name with the keys that differ, before anything
    runs; ``rerun_changed`` runs those again from the start instead.  ``keep`` is a
    folder the finished runs' records are kept into (:func:`keep_runs`) as each run
    finishes, so a suite stopped at any point has kept every run it finished; a folder
    :func:`keep_runs` would refuse is refused before anything runs, and the runs it holds
    that the suite folder lacks are taken from it (:func:`take_runs`), so a suite goes on
    from its kept folder into a new working folder without running them again.
    ``runs_from``: suite folders whose finished runs this suite would make itself (the
    same config and setting) are taken from them (:func:`take_runs`) rather than run
    again.  ``command``: the command line to record in the folder
    (:mod:`fedkt.evidence.invocations`), which the report names.  ``folds``: run only
    these of the suite's folds (:func:`only_folds`).  ``stop_by``: a time (seconds since
    the epoch) by which the suite ends: a run is started only if its arm's mean wall time
    here fits before it (:mod:`fedkt.evidence.deadline`); at the first that does not, no
    more start, the runs going finish, and :class:`~fedkt.evidence.deadline.SuiteStopped`
    is raised instead of writing the table."""
    suite = load_suite(path, output_dir, folds)
    threads = max(1, physical_cores() // max(1, jobs))
    # The suite as run, its base inlined, so `fedkt suite report DIR` needs nothing else.
    dumped = suite.cfg.model_dump(exclude={"seeds"} if suite.cfg.folds is not None else None)
    kept = Path(keep) if keep is not None and (Path(keep) / "suite.yaml").is_file() else None
    if kept is not None:  # refused here, before any run, where keeping would be refused
        _check_kept_suite(suite, kept, dumped)
        plan_runs(load_suite(path, kept, folds), threads=threads)  # this config and setting
    sources = list(runs_from)
    if kept is not None and kept.resolve() != suite.folder.resolve():
        sources.append(kept)  # going on from a kept folder: its runs are not run again
    from_kept: set[tuple[str, int]] = set()
    if sources:
        taken, refused = take_runs(suite, sources, threads=threads)
        from_kept = {(arm, seed) for arm, seed, source in taken if kept is not None
                     and source.resolve().is_relative_to(kept.resolve())}
        if not quiet:
            for arm, seed, source in taken:
                print(f"suite {suite.cfg.name}: {arm} seed {seed}: taken from {source}")
            for line in refused:
                print(f"suite {suite.cfg.name}: not taken: {line}")
    todo = plan_runs(suite, rerun_changed=rerun_changed, quiet=quiet, threads=threads)
    suite.folder.mkdir(parents=True, exist_ok=True)
    _write_suite_file(f"# copied from {suite.source}\n"
                      + yaml.safe_dump(dumped, sort_keys=False), suite.folder / "suite.yaml")
    failures: list[str] = []
    finished = [k for k, cfg in suite.runs.items() if k not in from_kept
                and run_state(suite.run_dir(*k), cfg.rounds) == "done"]
    if keep is not None and finished:  # what DIR lacks (what came from it is there)
        keep_runs(suite.folder, keep, only=finished)
    if command is not None and todo:  # it runs something: after every refusal above
        record_invocation(suite.folder, command)
    running: list[tuple[str, int, subprocess.Popen, Any, float]] = []
    log_dir = suite.folder / "logs"
    conf_dir = suite.folder / "configs"
    log_dir.mkdir(exist_ok=True)
    conf_dir.mkdir(exist_ok=True)

    def start(arm: str, seed: int, cfg: RunConfig, state: str) -> None:
        run_dir = suite.run_dir(arm, seed)
        conf = conf_dir / f"{arm}_seed{seed}.yaml"
        conf.write_text(cfg.to_yaml())
        # The config's own thread count wins (results can depend on it); else split cores.
        sets = ["-q"] if cfg.runtime.torch_threads else [
            "--set", f"runtime.torch_threads={threads}", "-q"]
        if state == "started":  # continue from its last checkpointed round
            cmd = [sys.executable, "-m", "fedkt.cli", "resume", str(run_dir), *sets]
        else:
            cmd = [sys.executable, "-m", "fedkt.cli", "run", str(conf), "--overwrite", *sets]
        if not quiet:
            print(f"suite {suite.cfg.name}: {arm} seed {seed}: "
                  f"{'resuming' if state == 'started' else 'running'}", flush=True)
        log = (log_dir / f"{arm}_seed{seed}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        running.append((arm, seed, proc, log, time.perf_counter()))

    def reap() -> None:
        for item in list(running):
            arm, seed, proc, log, t0 = item
            label = f"{arm} seed {seed}"
            code = proc.poll()
            if code is None:
                continue
            running.remove(item)
            log.close()
            if code != 0:
                failures.append(f"{label} (exit {code}; see {log.name})")
                continue
            if not quiet:
                print(f"suite {suite.cfg.name}: {label}: finished in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            if keep is not None:
                try:  # the runs go on: a run not kept is named at the end
                    keep_runs(suite.folder, keep, only=[(arm, seed)])
                except (OSError, ValueError) as exc:
                    failures.append(f"{label} not kept into {keep}: {exc}")
                    print(f"suite {suite.cfg.name}: {label}: not kept: {exc}",
                          file=sys.stderr, flush=True)
                else:
                    if not quiet:
                        print(f"suite {suite.cfg.name}: {label}: kept into {keep}",
                              flush=True)

    # `kill` (SIGTERM) stops a suite like Ctrl-C: its runs are killed and resumed next time.
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    stopped = ""
    try:
        for index, item in enumerate(todo):
            while len(running) >= max(1, jobs):
                time.sleep(0.2)
                reap()
            arm, seed = item[0], item[1]
            why = None if stop_by is None else why_not_start(arm_wall(suite, arm), stop_by,
                                                             time.time())
            if why is not None:
                stopped = (f"{arm} seed {seed} not started: {why}; {len(todo) - index} "
                           "run(s) left, the same command goes on")
                if not quiet:
                    print(f"suite {suite.cfg.name}: stopping: {stopped}", flush=True)
                break
            start(*item)
        while running:
            time.sleep(0.2)
            reap()
    except BaseException:  # Ctrl-C or an error: stop the runs; a rerun resumes them
        for _, _, proc, log, _ in running:
            proc.kill()
            proc.wait()
            log.close()
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    if stopped:  # no table: the suite goes on later (a failed run is named first)
        if failures:
            raise RuntimeError("suite runs failed: " + "; ".join(failures)
                               + f"; then stopped: {stopped}")
        raise SuiteStopped(f"suite {suite.cfg.name}: {stopped}")
    # some folds (--fold): the folder's suite.yaml, which holds the folds run before too
    text = report_suite(suite.folder, suite=suite if folds is None else None)
    if not quiet:
        print(text)
    if failures:
        raise RuntimeError("suite runs failed: " + "; ".join(failures))
    return suite.folder


# --------------------------------------------------------------------------- the table


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _arm_group(suite: Suite, arm: str, rnd: int | None = None) -> Group:
    runs = []
    for seed in suite.seeds:
        folder = suite.run_dir(arm, seed)
        if (folder / "metrics.jsonl").is_file() and run_state(
                folder, suite.runs[(arm, seed)].rounds) == "done":
            runs.append(open_run(folder, rnd))
    return Group(runs)


def report_suite(folder: str | Path, *, suite: Suite | None = None,
                 into: str | Path | None = None) -> str:
    """Render ``suite.md`` / ``suite.json`` / plots from the run folders (``fedkt suite
    report``) into ``into`` (default: the suite folder; another folder leaves a kept one as
    it is); the suite file is the copy the suite folder keeps."""
    folder = Path(folder)
    out_dir = folder if into is None else Path(into)
    if suite is None:
        suite = load_suite_folder(folder)
    cfg = suite.cfg
    groups = {arm: _arm_group(suite, arm) for arm in cfg.arms}
    missing = [f"{arm} seed {s}" for arm in cfg.arms for s in suite.seeds
               if s not in groups[arm].seeds]
    present = {a: g for a, g in groups.items() if g.runs}
    if not present:
        raise ValueError(f"{folder}: no finished run yet")
    first = next(iter(present.values())).runs[0]
    metrics = cfg.metrics or available_metrics(first, "server" if "server" in
                                               first.participants() else "clients")
    metrics = metrics or ["accuracy"]
    baseline = cfg.baseline
    rows_json: list[dict[str, Any]] = []
    header = ["arm"]
    for part in cfg.groups:
        for metric in metrics:
            header.append(f"{part} {metric}")
            if baseline:
                header.append(f"Δ vs {baseline} [{int(cfg.level * 100)}% CI]")
    table = []
    arm_rows: list[tuple[str, Group]] = []
    zero = _round0_group(suite, [a for a in [baseline, *present] if a in present])
    if zero is not None:
        arm_rows.append((f"round 0 ({zero[0]}@0)", zero[1]))
    arm_rows += [(arm, g) for arm, g in present.items()]
    for label, group in arm_rows:
        line = [label]
        for part in cfg.groups:
            for metric in metrics:
                try:
                    ms = group.mean_std(part, metric)
                except ValueError:  # e.g. an arm without clients
                    ms = None
                line.append(fmt_mean_std(ms))
                entry = None
                base = present.get(baseline) if baseline else None
                if base is not None and group is not base:
                    try:
                        got = compare(group, base, part, metric, reps=cfg.bootstrap,
                                      level=cfg.level, seed=cfg.bootstrap_seed,
                                      units=suite.fold_of)
                    except ValueError:  # e.g. an arm without clients: nothing to pair
                        got = None
                    if got is not None:
                        d, _ = got
                        entry = {"estimate": d.estimate, "low": d.low, "high": d.high}
                if baseline:
                    line.append("-" if entry is None else
                                f"{entry['estimate']:+.3f} [{entry['low']:+.3f}, "
                                f"{entry['high']:+.3f}]")
                rows_json.append({"arm": label, "group": part, "metric": metric,
                                  "mean_std": ms, "vs_baseline": entry})
        table.append(line)
    verdicts = [_decide(suite, c) for c in suite.claims]
    # the suite file's folds where the folder ran only some of them (--fold)
    declared = cfg.declared_folds if cfg.declared_folds != cfg.folds else None
    if suite.fold_of:
        some = (f" (of the suite file's {declared}: these folds only, "
                "`fedkt suite run --fold`)" if declared else "")
        design = (f"- folds: {cfg.folds}{some}, {cfg.seeds_per_fold or 1} training seed(s) in "
                  f"each (seeds {suite.seeds}); the fold is the unit of the verdicts")
        resampling = ("- resampling: folds, then seeds within a fold, then each seed's test "
                      "items (each level shrunk by what the level below supplies); "
                      "t-interval and per fold: over the folds' means")
    else:
        design = f"- seeds: {cfg.seeds}"
        resampling = ("- resampling: seeds, then each seed's test items; t-interval and per "
                      "seed: over the seeds")
    text = [f"# Suite {cfg.name}", "",
            f"{design}; arms: {', '.join(cfg.arms)}; baseline: {baseline or '-'}",
            f"- cells: mean ± std over seeds of the final evaluation; Δ: paired bootstrap "
            f"({cfg.bootstrap} resamples over test examples and seeds) vs the baseline arm",
            resampling]
    n_items = _items(first)
    if n_items:
        text.append(f"- test examples per run: {n_items}")
    if missing:
        text.append(f"- not finished: {', '.join(missing)}")
    run_dirs = [r.path for g in present.values() for r in g.runs]
    commands = read_invocations(folder)
    if commands:
        text.append(f"- run by: {commands_text(commands)}")
    env_lines = environment_lines(run_dirs)
    text += env_lines
    peaks = peak_memory({arm: [r.path for r in g.runs] for arm, g in present.items()})
    if peaks:
        text.append("- peak memory of a run, per arm (the largest, MB resident): " + ", ".join(
            f"{arm} {mb:,.0f}" for arm, mb in peaks.items()))
    text += ["", format_table(header, table, markdown=True), ""]
    if verdicts:
        pct = int(cfg.level * 100)
        text += ["## Claims", "", _claims_preamble(suite), "", format_table(
            ["", "claim", "estimate",
             f"{pct}% CI (items, seeds{', folds' if suite.fold_of else ''})",
             f"{'folds' if suite.fold_of else 'seeds'}' {pct}% t-interval",
             "per fold" if suite.fold_of else "per seed", "floor", "verdict"],
            [[v["role"], v["claim"], v["estimate"], v["ci"], v["seed_ci"], v["per_seed_text"],
              v["floor_text"], v["verdict"] + (f": {v['reason']}" if v.get("reason") else "")]
             for v in verdicts], markdown=True), ""]
        targets = target_rows(cfg.target_floor, cfg.target_half_width, verdicts)
        if targets:
            text += ["### Design targets", "",
                     "Per claim (a joint claim: per part), the detection floor and the 95% "
                     "half-width (the larger of the CI's and the t-interval's) against the "
                     "suite file's target_floor and target_half_width (`fedkt suite power` "
                     "plans the folds that reach them).", "",
                     format_table(["claim", "floor", "target floor", "met",
                                   "half-width", "target half-width", "met"], targets,
                                  markdown=True), ""]
    choice = None
    if cfg.choice is not None:
        def mean(arm: str, ref: str) -> float | None:
            got = _ref_value(suite, groups, Ref(arm, None, *ref.split(".")))
            return None if got is None else got[0]

        choice = choose(cfg.choice, mean, missing)
        text += ["## The pilot's choice", "", choice_markdown(choice), ""]
    wall = suite_wall(run_dirs)
    text += ["## Where the time went", "",
             *([f"Wall time: {wall.text()}; from the finished runs' own spans "
                f"(environment.json), runs less than {SITTING_GAP_S:.0f} s apart one "
                "sitting.", ""] if wall else []),
             "Mean over seeds of each run's seconds per phase (fedkt.infra.timing), summed over "
             "its participants; other: the wall time no phase covers; all runs: the sum "
             "over every run of the suite (its runs one after another).", "",
             breakdown_table([*((arm, mean_breakdown([time_breakdown(r.info.rows)
                                                      for r in g.runs]))
                                for arm, g in present.items()),
                              ("all runs", sum_breakdown([time_breakdown(r.info.rows)
                                                          for g in present.values()
                                                          for r in g.runs]))]), ""]
    paper = None
    if cfg.paper is not None:
        paper = paper_result(cfg.paper, lambda ref: _ref_value(suite, groups, ref))
        text += ["## The paper's numbers beside the suite's", "", paper_markdown(paper), ""]
    if cfg.comparison is not None:
        text += [comparison_report(out_dir, cfg.comparison, present, reps=cfg.bootstrap,
                                   level=cfg.level, seed=cfg.bootstrap_seed)]
    out = "\n".join(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUITE_TABLE).write_text(out)
    (out_dir / SUITE_JSON).write_text(json.dumps(
        {"name": cfg.name, "seeds": suite.seeds, "folds": suite.fold_of, "metrics": metrics,
         "table": rows_json,
         "claims": verdicts, "missing": missing, "environment": env_lines,
         **({"commands": commands} if commands else {}),
         **({"declared_folds": declared} if declared else {}),
         **({"peak_rss_mb": peaks} if peaks else {}),
         **({"wall": {"seconds": round(wall.seconds), "duration": wall.duration(),
                      "text": wall.text(), "timed_runs": wall.timed, "runs": wall.runs,
                      "sittings": [[a.isoformat(), b.isoformat()] for a, b in wall.sittings]}}
            if wall else {}),
         **({"paper": paper} if paper is not None else {}),
         **({"choice": choice} if choice is not None else {})},
        indent=2, default=float) + "\n")
    suite_plots(out_dir, present, cfg.groups, metrics, baseline, rows_json)
    return out


def _ref_value(suite: Suite, finals: dict[str, Group], ref: Ref
               ) -> tuple[float, float, int] | None:
    """The suite's mean, std and run count for ``ARM[@ROUND].GROUP.METRIC`` (a paper row's,
    a choice rule's); ``finals``: each arm's runs at their last round, as the table already
    opened them."""
    group = finals[ref.arm] if ref.round is None else _arm_group(suite, ref.arm, ref.round)
    try:
        return group.mean_std(ref.group, ref.metric) if group.runs else None
    except ValueError:  # e.g. an arm without that group
        return None


def peak_memory(folders: dict[str, list[Path]]) -> dict[str, float]:
    """Per arm, the largest peak resident memory its runs recorded (``environment.json``'s
    ``peak_rss_mb``, in MB); an arm none of whose runs recorded one is left out."""
    out = {}
    for arm, paths in folders.items():
        peaks = [float(e["peak_rss_mb"]) for p in paths for e in read_environment(p)
                 if isinstance(e.get("peak_rss_mb"), int | float)]
        if peaks:
            out[arm] = max(peaks)
    return out


def environment_lines(folders: list[Path]) -> list[str]:
    """``- environment: ...`` of suite.md: where its runs were computed, and a warning when
    they come from more than one (kernels that round differently move final numbers by
    more than a seed does: docs/evidence.md, "Machines")."""
    seen: dict[str, int] = {}
    for folder in folders:
        for entry in read_environment(folder) or [{}]:
            line = describe(entry) if entry else "not recorded (a run made before fedkt kept it)"
            seen[line] = seen.get(line, 0) + 1
    if len(seen) == 1:
        return [f"- environment: {next(iter(seen))}"]
    return [f"- **runs from {len(seen)} environments**; compare across them with care "
            "(docs/evidence.md, \"Machines\"):",
            *(f"  - {n} run(s): {line}" for line, n in seen.items())]


def _round0_group(suite: Suite, arms: list[str]) -> tuple[str, Group] | None:
    """The zero-shot row: round 0 of the first of ``arms`` (baseline first) that has it."""
    for arm in arms:
        try:
            group = _arm_group(suite, arm, 0)
        except ValueError:  # this arm does not evaluate round 0 (eval.round0: false)
            continue
        if group.runs:  # open_run(..., 0) refused every run without a round-0 evaluation
            return arm, group
    return None


def target_rows(target_floor: float | None, target_half: float | None,
                verdicts: list[dict[str, Any]]) -> list[list[str]]:
    """The design-targets table: per decided claim (or part), floor and half-width against
    the targets, with ``yes``/``no``; none without targets.  Also records them in each
    verdict's ``targets`` (suite.json)."""
    if target_floor is None and target_half is None:
        return []
    rows = []
    for v in verdicts:
        for part in v.get("parts") or [v]:
            floor, half = part.get("floor"), part.get("half_width")
            if floor is None or half is None:
                continue
            met_floor = None if target_floor is None else bool(floor <= target_floor)
            met_half = None if target_half is None else bool(half <= target_half)
            part["targets"] = {"floor": target_floor, "floor_met": met_floor,
                               "half_width": target_half, "half_width_met": met_half}
            word = {True: "yes", False: "no", None: "-"}
            rows.append([part["claim"], f"{floor:.3f}", _fmt(target_floor), word[met_floor],
                         f"{half:.3f}", _fmt(target_half), word[met_half]])
    return rows


def _items(run: Run) -> int | None:
    for key in run.files:
        if key[0] == run.eval_round():
            return len(read_predictions(run.files[key]))
    return None


def _claims_preamble(suite: Suite) -> str:
    """What the claims table's columns mean, and which claim is the primary one."""
    lead = ("The **primary** claim (first row) was declared in the suite file before it ran; "
            "the others are secondary." if suite.primary is not None else
            "No primary claim is declared in the suite file: every claim is secondary.")
    if suite.fold_of:
        return (f"{lead} CI: the paired bootstrap over folds, the seeds within each drawn "
                "fold and, within each drawn seed, its test items; t-interval: Student's t "
                "over the per-fold differences (each fold's mean over its seeds); floor: the "
                "smallest true difference these folds detect with 80% power. Reproduced or "
                "contradicted needs the CI on one side, at least 4 folds, all but at most one "
                "of them on that side, and the t-interval on it too; an interval that decides "
                "without the folds is *fragile*; a joint claim (parts joined by 'and') needs "
                "every part (docs/evidence.md, \"How verdicts are decided\").")
    return (f"{lead} CI: the paired bootstrap over seeds and, within each drawn seed, its test "
            "items; t-interval: Student's t over the per-seed differences; floor: the smallest "
            "true difference these items and seeds detect with 80% power. Reproduced or "
            "contradicted needs the CI on one side, at least 4 seeds, all but at most one of "
            "them on that side, and the t-interval on it too; an interval that decides without "
            "the seeds is *fragile*; a joint claim (parts joined by 'and') needs every part "
            "(docs/evidence.md, \"How verdicts are decided\").")


def _decide(suite: Suite, claim: Claim | Joint) -> dict[str, Any]:
    out = _decide_joint(suite, claim) if isinstance(claim, Joint) else \
        _decide_interval(suite, claim)
    out["role"] = "primary" if suite.primary is not None and claim is suite.claims[0] \
        else "secondary"
    for key in ("seed_ci", "per_seed_text", "floor_text"):
        out.setdefault(key, "-")
    return out


_JOINED = ("estimate", "ci", "seed_ci", "per_seed_text", "floor_text")


def _decide_joint(suite: Suite, claim: Joint) -> dict[str, Any]:
    """A joint claim: each part decided as a claim of its own, then :func:`decide_joint`;
    the row's cells hold each part's, in order, separated by '; '."""
    parts = []
    for part in claim.parts:
        got = _decide_interval(suite, part)
        for key in _JOINED:
            got.setdefault(key, "-")
        parts.append(got)
    decision = decide_joint([Decision(p["verdict"], p.get("reason", "")) for p in parts])
    return {"claim": claim.text, **{k: "; ".join(p[k] for p in parts) for k in _JOINED},
            "verdict": decision.verdict, "reason": decision.reason, "parts": parts}


def _decide_interval(suite: Suite, claim: Claim) -> dict[str, Any]:
    cfg = suite.cfg
    out: dict[str, Any] = {"claim": claim.text, "estimate": "-", "ci": "-",
                           "verdict": "not run"}
    try:
        lhs = _arm_group(suite, claim.lhs.arm, claim.lhs.round)
        rhs = lhs if isinstance(claim.rhs, float) else _arm_group(
            suite, claim.rhs.arm, claim.rhs.round)
        largest = [] if isinstance(claim.rhs, float) or not claim.rhs.others else [
            rhs, *(_arm_group(suite, arm, claim.rhs.round) for arm in claim.rhs.others)]
    except ValueError as exc:  # e.g. ARM@0 of an arm without round 0
        return {**out, "verdict": f"error: {exc}"}
    if any(not g.runs for g in largest):
        return out
    if not lhs.runs:
        return out
    if isinstance(claim.rhs, float):
        rhs, b_group, b_metric, offset = lhs, claim.lhs.group, claim.lhs.metric, claim.offset
        factor = 0.0
        offset += claim.factor * claim.rhs
    else:
        b_group, b_metric, factor, offset = claim.rhs.group, claim.rhs.metric, claim.factor, \
            claim.offset
        if not rhs.runs:
            return out
    try:
        got = compare(lhs, largest or rhs, claim.lhs.group, claim.lhs.metric, b_group=b_group,
                      b_metric=b_metric, factor=factor, offset=offset, reps=cfg.bootstrap,
                      level=cfg.level, seed=cfg.bootstrap_seed, units=suite.fold_of)
    except ValueError as exc:
        return {**out, "verdict": f"error: {exc}"}
    if got is None:
        return {**out, "verdict": "no data"}
    d, _ = got
    seeds = d.seed_interval()
    floor = d.floor()
    decision = decide(claim, d.low, d.high, d.per_seed, seed_interval=seeds,
                      estimate=d.estimate, floor=floor, fixed=d.n == 0,
                      unit="fold" if suite.fold_of else "seed")
    common = set.intersection(*(set(g.seeds) for g in (lhs, *largest)))
    seed_labels = [r.seed for r in paired(Group([r for r in lhs.runs if r.seed in common]),
                                          rhs)[0]]
    per_run: dict[str, dict[str, float]] = {}
    if suite.fold_of:  # per_seed holds each fold's mean over its seeds, in fold order
        for run_seed, value in zip(seed_labels, d.per_run, strict=True):
            per_run.setdefault(str(suite.fold_of[run_seed]), {})[str(run_seed)] = value
        seed_labels = sorted({suite.fold_of[s] for s in seed_labels})
    return {"claim": claim.text, "estimate": f"{d.estimate:+.4f}",
            "ci": f"[{d.low:+.4f}, {d.high:+.4f}]", "verdict": decision.verdict,
            "reason": decision.reason, "low": d.low, "high": d.high, "value": d.estimate,
            "per_seed": dict(zip((str(s) for s in seed_labels), d.per_seed, strict=False)),
            "seed_low": seeds[0] if seeds else None, "seed_high": seeds[1] if seeds else None,
            "floor": floor, "resampling": d.resampling,
            "half_width": max((d.high - d.low) / 2, (seeds[1] - seeds[0]) / 2 if seeds else 0.0),
            "seed_ci": f"[{seeds[0]:+.3f}, {seeds[1]:+.3f}]" if seeds else "-",
            "per_seed_text": ", ".join(f"{v:+.3f}" for v in d.per_seed),
            "floor_text": f"{floor:.3f}", **({"per_run": per_run} if per_run else {})}


def status_suite(path: str | Path, output_dir: str | Path | None,
                 folds: Sequence[int] | None = None) -> Suite:
    """The suite of a suite file (its runs in ``output_dir``, else its own) or folder;
    ``folds``: only these of its folds (:func:`only_folds`)."""
    folder = Path(path)
    if folder.is_dir():
        if output_dir is not None:
            raise ConfigError(f"{folder}: a suite folder is its own output_dir; give the "
                              "suite file with --output-dir, or the folder alone")
        return load_suite_folder(folder, folds)
    return load_suite(path, output_dir, folds)


def fold_progress(fold_of: dict[int, int], states: Sequence[tuple[str, int, str]]) -> str:
    """Which test folds of a suite are whole (every arm and seed done) and how far the
    others are, from :func:`suite_status`'s ``states``: ``whole folds: 2 of 4 (0, 1); fold
    2: 5 of 12 runs done``.  A suite kept fold by fold is stopped at a whole fold."""
    done: dict[int, list[bool]] = {}
    for _, seed, state in states:
        done.setdefault(fold_of[seed], []).append(state.startswith("done"))
    whole = [str(f) for f, runs in sorted(done.items()) if all(runs)]
    parts = [f"fold {f}: {sum(runs)} of {len(runs)} runs done"
             for f, runs in sorted(done.items()) if any(runs) and not all(runs)]
    head = f"whole folds: {len(whole)} of {len(done)}" + (f" ({', '.join(whole)})"
                                                          if whole else "")
    return "; ".join([head, *parts])


def arm_walls(suite: Suite) -> dict[str, list[tuple[float, float]]]:
    """Each arm's finished runs in the suite folder, timed: ``(wall, wall + spared)`` a
    run, its wall time and that plus the seconds the reuse store spared it
    (:func:`fedkt.tracking.rows.time_breakdown`); arms with no timed run are left out."""
    from fedkt.tracking.rows import read_rows

    walls: dict[str, list[tuple[float, float]]] = {}
    for (arm, seed), cfg in suite.runs.items():
        run_dir = suite.run_dir(arm, seed)
        metrics = run_dir / "metrics.jsonl"
        if run_state(run_dir, cfg.rounds) != "done" or not metrics.is_file():
            continue
        spent = time_breakdown(read_rows(metrics))
        if spent is not None:
            walls.setdefault(arm, []).append((spent["wall"], spent["wall"] + spent["saved"]))
    return walls


def arm_wall(suite: Suite, arm: str) -> float | None:
    """The mean wall time of ``arm``'s finished runs in the suite folder (None: none is
    timed), what a left run of it is estimated to take (:func:`time_left`)."""
    runs = arm_walls(suite).get(arm)
    return sum(w for w, _ in runs) / len(runs) if runs else None


def time_left(path: str | Path, output_dir: str | Path | None = None, *,
              suite: Suite | None = None) -> str:
    """One line: the runs left of a suite and their time, each left run at the mean wall
    time of its arm's finished runs in the folder (one run at a time, and at the runs at
    once its runs' torch threads give this machine's cores).  Where the reuse store served
    those runs part of their work, the line gives a range: up to each arm's mean wall time
    plus the seconds reuse spared it (:func:`fedkt.tracking.rows.time_breakdown`), what a
    left run costs if nothing it needs is stored.  ``suite``: the suite ``path`` gives,
    already loaded."""
    suite = status_suite(path, output_dir) if suite is None else suite
    walls = arm_walls(suite)
    threads: set[int] = set()
    left: list[str] = []
    for (arm, seed), cfg in suite.runs.items():
        run_dir = suite.run_dir(arm, seed)
        if run_state(run_dir, cfg.rounds) != "done":
            left.append(arm)
            continue
        for entry in read_environment(run_dir):
            if isinstance(entry.get("torch_threads"), int):
                threads.add(entry["torch_threads"])
    head = f"left: {len(left)} of {len(suite.runs)} runs"
    if not left:
        return head
    timed = [walls[a] for a in left if a in walls]
    if not timed:
        return head + "; no finished run of their arms to time them by"
    seconds = sum(sum(w for w, _ in runs) / len(runs) for runs in timed)
    whole = sum(sum(w for _, w in runs) / len(runs) for runs in timed)
    ranged = whole > seconds * 1.01  # reuse spared the finished runs more than 1%
    line = (f"{head}; about {seconds / 3600:.1f} h of runs, each at its arm's mean wall "
            "time here")
    if ranged:
        line += (f", up to {whole / 3600:.1f} h with nothing served from the reuse store "
                 "(each run's wall time plus the seconds it spared)")
    jobs = max(1, physical_cores() // threads.pop()) if len(threads) == 1 else 1
    if jobs > 1:
        at = f"{seconds / 3600 / jobs:.1f}" + (f"-{whole / 3600 / jobs:.1f}" if ranged else "")
        line += f" ({at} h at --jobs {jobs}, this machine's cores)"
    untimed = sorted({a for a in left if a not in walls})
    if untimed:
        line += (f"; and {len(left) - len(timed)} run(s) of arms not yet timed: "
                 + ", ".join(untimed))
    return line


def suite_status(path: str | Path, output_dir: str | Path | None = None, *,
                 suite: Suite | None = None) -> list[tuple[str, int, str]]:
    """``(arm, seed, state)`` of every run of a suite: ``path`` is a suite file (its runs
    in ``output_dir``, else its own output_dir) or a suite folder (the suite.yaml it keeps).
    A run made with another config than the suite file gives it now says so with the keys,
    and one computed under another setting than this machine's (:func:`setting_changes`,
    threads aside) with the fields.  ``suite``: the suite ``path`` gives, already loaded."""
    suite = status_suite(path, output_dir) if suite is None else suite
    now = current_setting(None)  # the threads depend on --jobs: not compared here
    out = []
    for (arm, seed), cfg in suite.runs.items():
        run_dir = suite.run_dir(arm, seed)
        state = run_state(run_dir, cfg.rounds)
        keys = config_changes(run_dir, cfg) if state != "new" else []
        moved = setting_changes(run_dir, now) if state != "new" else []
        if keys:
            state += f", config changed: {', '.join(keys)}"
        if moved:
            state += f", another setting: {'; '.join(moved)}"
        out.append((arm, seed, state))
    return out


#: What :func:`keep_runs` copies of a finished run: what ``fedkt suite report`` and the
#: runner read (config, environment, metrics, per-item predictions, summary, the index of
#: its last checkpoint), not the weights, plots, logs or reuse store.
KEPT_FILES = (CONFIG_FILE, "environment.json", "metrics.jsonl", "summary.md",
              f"checkpoints/{LATEST_FILE}")


def _check_kept_suite(suite: Suite, dest: Path, mine: dict[str, Any] | None = None) -> None:
    """Refuse a ``dest`` that keeps runs of another suite file than ``suite``'s folder, or
    than ``mine`` (the suite as it will be run, before its folder is written); the same
    file run on other of its folds is the same suite."""
    kept, own = dest / "suite.yaml", suite.folder / "suite.yaml"
    if not kept.is_file() or kept.resolve() == own.resolve():
        return
    name = own if mine is None else suite.source
    mine = yaml.safe_load(own.read_text() if mine is None else yaml.safe_dump(mine))
    if _suite_body(yaml.safe_load(kept.read_text())) != _suite_body(mine):
        raise SuiteChangedError(f"{dest}: holds runs of another suite file than {name}; "
                                "keep them in a new folder")


def _check_keep(suite: Suite, done: list[tuple[str, int]], dest: Path) -> None:
    """Refuse, before copying, to keep runs into a folder of another suite file, or
    beside runs (or of runs) of another setting than the first run kept."""
    _check_kept_suite(suite, dest)
    kept = dest / "suite.yaml"
    entries = read_environment(suite.run_dir(*done[0]))
    if not entries:
        return
    reference = entries[-1]
    runs = [(f"{arm} seed {seed}", suite.run_dir(arm, seed)) for arm, seed in done]
    if kept.is_file():  # the same suite (above): its runs' folders in dest
        for (arm, seed), cfg in suite.runs.items():
            there = dest / suite.run_dir(arm, seed).relative_to(suite.folder)
            if run_state(there, cfg.rounds) == "done":
                runs.append((f"{arm} seed {seed} (kept in {dest})", there))
    moved = [(label, diff) for label, run_dir in runs
             if (diff := setting_changes(run_dir, reference))]
    if moved:
        first = f"{done[0][0]} seed {done[0][1]}"
        raise SuiteMachineError(
            f"{suite.folder} -> {dest}: {len(moved)} run(s) were computed under another "
            f"setting than {first} (theirs -> {first}'s):\n"
            + "\n".join(f"  {label}: {'; '.join(diff)}" for label, diff in moved[:12])
            + "\na kept folder holds one setting: keep these in a folder of their own")


def keep_runs(source: str | Path, dest: str | Path,
              only: list[tuple[str, int]] | None = None) -> tuple[int, int]:
    """Copy the finished runs of suite folder ``source`` (its records: :data:`KEPT_FILES`
    and ``predictions/``; ``only``: just these ``(arm, seed)`` of them) and its
    ``suite.yaml`` into ``dest``, in the same layout, so
    ``fedkt suite report DEST`` reads them and ``fedkt suite run ... --output-dir DEST``
    skips them: a long suite can be kept in version control and finished later, on
    another machine of the same setting (:func:`plan_runs` refuses another).  Started runs
    are not copied (they start again).  Refused before anything is copied: a ``dest`` of
    another suite file, and runs (kept there or to keep) of another setting than the first
    run kept.  Returns (runs copied, bytes)."""
    source, dest = Path(source), Path(dest)
    suite = load_suite_folder(source)
    copy_of = source / "suite.yaml"
    done = [(arm, seed) for (arm, seed), cfg in suite.runs.items()
            if run_state(suite.run_dir(arm, seed), cfg.rounds) == "done"
            and (only is None or (arm, seed) in only)]
    if not done:
        raise ValueError(f"{source}: no finished run to keep")
    _check_keep(suite, done, dest)
    dest.mkdir(parents=True, exist_ok=True)
    if copy_of.resolve() != (dest / "suite.yaml").resolve():
        _write_suite_file(copy_of.read_text(), dest / "suite.yaml")
        keep_invocations(source, dest)
    size = 0
    for arm, seed in done:
        run_dir = suite.run_dir(arm, seed)
        size += copy_records(run_dir, dest / run_dir.relative_to(source))
    return len(done), size


def _suite_body(data: Any) -> Any:
    """A folder's ``suite.yaml`` as the suite file it was run from, wherever the folder
    was and whichever of the file's folds it ran (``declared_folds``)."""
    if not isinstance(data, dict):
        return data
    folds = data.get("declared_folds") or data.get("folds")
    return {**{k: v for k, v in data.items() if k not in ("output_dir", "declared_folds")},
            "folds": folds}


def _write_suite_file(text: str, dest: Path) -> None:
    """Write a folder's ``suite.yaml`` (``text``); over one of the same suite file
    (:func:`_suite_body`) with its folds the union of both's, so runs of some folds
    (``--fold``) run or kept into a folder of others, or of all, narrow nothing the
    folder reports."""
    new = yaml.safe_load(text)
    old = yaml.safe_load(dest.read_text()) if dest.is_file() else None
    declared = (new.get("declared_folds") or new.get("folds")) if isinstance(new, dict) else None
    if not declared or old is None or _suite_body(old) != _suite_body(new):
        dest.write_text(text)
        return
    have = set(new.get("folds") or []) | set(old.get("folds") or declared)
    folds = [f for f in declared if f in have]
    data = {k: v for k, v in new.items() if k != "declared_folds"}
    data["folds"] = folds
    if folds != declared:
        data["declared_folds"] = declared
    head = text.splitlines()[0] if text else ""
    dest.write_text((head + "\n" if head.startswith("#") else "")
                    + yaml.safe_dump(data, sort_keys=False))


def copy_records(run_dir: Path, target: Path) -> int:
    """Copy a finished run's records (:data:`KEPT_FILES` and ``predictions/``; no weights)
    into ``target``, the checkpoint index last, so a copy stopped part-way leaves a run
    that is not done.  Returns the bytes copied."""
    import shutil

    index = f"checkpoints/{LATEST_FILE}"
    files = [run_dir / name for name in KEPT_FILES
             if name != index and (run_dir / name).is_file()]
    files += sorted(p for p in (run_dir / "predictions").rglob("*") if p.is_file())
    files.append(run_dir / index)
    size = 0
    for path in files:
        out = target / path.relative_to(run_dir)
        if path.resolve() == out.resolve():
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out)
        size += path.stat().st_size
    return size


def take_runs(suite: Suite, sources: Sequence[str | Path], *, threads: int | None = None
              ) -> tuple[list[tuple[str, int, Path]], list[str]]:
    """Copy into ``suite``'s folder the records of each finished run of the suite folders
    ``sources`` that ``suite`` would make itself: the same config, by
    :func:`config_changes` (another arm name, suite or folder is no difference), and the
    setting a run started here now would have (:func:`setting_changes`; ``threads`` as
    :func:`plan_runs` takes it).  Suites that share runs (one suite's arms and seeds
    repeated in another's design) then run each once.  A run already in the folder is left
    as it is; a matching run of another setting is not taken.  Returns the runs taken,
    ``(arm, seed, the run folder it came from)``, and one line per run not taken for its
    setting.  The commands recorded in a folder a run is taken from are kept beside the
    suite's own (:func:`fedkt.evidence.invocations.keep_invocations`)."""
    now = current_setting(threads)
    others = []
    folder_of: dict[Path, Path] = {}
    for source in sources:
        other = load_suite_folder(source)
        done = [(other.run_dir(a, s), cfg) for (a, s), cfg in other.runs.items()
                if run_state(other.run_dir(a, s), cfg.rounds) == "done"]
        others += done
        folder_of |= {run_dir: Path(source) for run_dir, _ in done}
    taken: list[tuple[str, int, Path]] = []
    refused: list[str] = []
    for (arm, seed), cfg in suite.runs.items():
        run_dir = suite.run_dir(arm, seed)
        if run_state(run_dir, cfg.rounds) != "new" or (run_dir / CONFIG_FILE).is_file():
            continue
        mine = _run_setting(now, cfg)
        for source_dir, other_cfg in others:
            if other_cfg.seed != cfg.seed or config_changes(source_dir, cfg):
                continue
            diff = setting_changes(source_dir, mine)
            if diff:
                refused.append(f"{arm} seed {seed}: {source_dir} was computed under another "
                               f"setting ({'; '.join(diff)})")
                continue
            copy_records(source_dir, run_dir)
            taken.append((arm, seed, source_dir))
            break
    for source in dict.fromkeys(folder_of[source_dir] for _, _, source_dir in taken):
        keep_invocations(source, suite.folder)
    return taken, refused
