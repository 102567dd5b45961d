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
``rerun_changed``; one of another setting (libraries, kernels, CPU, fedkt's code) is
refused.  This module reads suite files and the state of their runs; running them is
:mod:`fedkt.evidence.suite_run` (``--jobs N`` at once, each a ``fedkt`` process with
``cores / N`` torch threads), the table and verdicts :mod:`fedkt.evidence.suite_report`
(``suite.md``, ``suite.json``, ``plots/``; a ``comparison`` section adds the
cross-method table, :mod:`fedkt.evidence.method_table`), and keeping runs between
machines :mod:`fedkt.evidence.suite_keep` (``fedkt suite status / keep``,
``--runs-from``).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from fedkt.config import ConfigError, RunConfig, _set_dotted, _Strict, parse_config
from fedkt.configs.catalog import UnknownConfigError, resolve_config
from fedkt.evidence.choice import ChoiceRule, check_choice
from fedkt.evidence.claims import Claim, ClaimError, Joint, parse_claim
from fedkt.evidence.method_table import ComparisonConfig, check_comparison
from fedkt.evidence.paper import PaperReference, check_paper
from fedkt.evidence.stats import DEFAULT_BOOTSTRAP, DEFAULT_LEVEL
from fedkt.infra.environment import code_label, environment
from fedkt.tracking.folder import CONFIG_FILE, LATEST_FILE
from fedkt.tracking.resume import changed_keys
from fedkt.tracking.summary import read_environment

__all__ = [
    "FOLD_SEED_BASE", "SETTING_KEYS", "SUITE_JSON", "SUITE_TABLE", "Suite",
    "SuiteChangedError", "SuiteConfig", "SuiteMachineError", "config_changes",
    "current_setting", "load_suite", "load_suite_folder", "only_folds", "plan_runs",
    "run_setting", "run_state", "setting_changes", "suite_body", "write_suite_file",
]

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


def run_setting(now: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """The setting a run of ``cfg`` started now gets: ``now``, but the config's own thread
    count wins where it sets one, as when the run starts (:func:`run_suite`)."""
    threads = cfg.runtime.torch_threads
    return {**now, "torch_threads": threads} if threads else now


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
        diff = setting_changes(run_dir, run_setting(now, cfg))
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


def suite_body(data: Any) -> Any:
    """A folder's ``suite.yaml`` as the suite file it was run from, wherever the folder
    was and whichever of the file's folds it ran (``declared_folds``)."""
    if not isinstance(data, dict):
        return data
    folds = data.get("declared_folds") or data.get("folds")
    return {**{k: v for k, v in data.items() if k not in ("output_dir", "declared_folds")},
            "folds": folds}


def write_suite_file(text: str, dest: Path) -> None:
    """Write a folder's ``suite.yaml`` (``text``); over one of the same suite file
    (:func:`suite_body`) with its folds the union of both's, so runs of some folds
    (``--fold``) run or kept into a folder of others, or of all, narrow nothing the
    folder reports."""
    new = yaml.safe_load(text)
    old = yaml.safe_load(dest.read_text()) if dest.is_file() else None
    declared = (new.get("declared_folds") or new.get("folds")) if isinstance(new, dict) else None
    if not declared or old is None or suite_body(old) != suite_body(new):
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
