"""A suite folder's runs between machines: which are done and the time left
(``fedkt suite status``), their records kept without weights (``fedkt suite keep``,
``--keep``), and finished runs taken from other folders (``--runs-from``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fedkt.config import ConfigError
from fedkt.evidence.invocations import keep_invocations
from fedkt.evidence.suite import (
    Suite,
    SuiteChangedError,
    SuiteMachineError,
    config_changes,
    current_setting,
    load_suite,
    load_suite_folder,
    run_setting,
    run_state,
    setting_changes,
    suite_body,
    write_suite_file,
)
from fedkt.infra.precision import physical_cores
from fedkt.tracking.folder import CONFIG_FILE, LATEST_FILE
from fedkt.tracking.rows import time_breakdown
from fedkt.tracking.summary import read_environment

__all__ = [
    "KEPT_FILES", "arm_wall", "arm_walls", "check_kept_suite", "copy_records",
    "fold_progress", "keep_runs", "status_suite", "suite_status", "take_runs",
    "time_left",
]

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


def arm_walls(suite: Suite, only: str | None = None,
              done: set[tuple[str, int]] | None = None) -> dict[str, list[tuple[float, float]]]:
    """Each arm's finished runs in the suite folder, timed: ``(wall, wall + spared)`` a
    run, its wall time and that plus the seconds the reuse store spared it
    (:func:`fedkt.tracking.rows.time_breakdown`); arms with no timed run are left out.
    ``only``: read that arm's runs alone; ``done``: the finished runs, already known."""
    from fedkt.tracking.rows import read_rows

    walls: dict[str, list[tuple[float, float]]] = {}
    for (arm, seed), cfg in suite.runs.items():
        if only is not None and arm != only:
            continue
        run_dir = suite.run_dir(arm, seed)
        metrics = run_dir / "metrics.jsonl"
        finished = ((arm, seed) in done if done is not None
                    else run_state(run_dir, cfg.rounds) == "done")
        if not finished or not metrics.is_file():
            continue
        spent = time_breakdown(read_rows(metrics))
        if spent is not None:
            walls.setdefault(arm, []).append((spent["wall"], spent["wall"] + spent["saved"]))
    return walls


def arm_wall(suite: Suite, arm: str) -> float | None:
    """The mean wall time of ``arm``'s finished runs in the suite folder (None: none is
    timed), what a left run of it is estimated to take (:func:`time_left`)."""
    runs = arm_walls(suite, only=arm).get(arm)  # before each start: its own runs only
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
    done = {k for k, cfg in suite.runs.items()
            if run_state(suite.run_dir(*k), cfg.rounds) == "done"}  # each run's state once
    walls = arm_walls(suite, done=done)
    threads: set[int] = set()
    left: list[str] = []
    for arm, seed in suite.runs:
        if (arm, seed) not in done:
            left.append(arm)
            continue
        for entry in read_environment(suite.run_dir(arm, seed)):
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


def check_kept_suite(suite: Suite, dest: Path, mine: dict[str, Any] | None = None) -> None:
    """Refuse a ``dest`` that keeps runs of another suite file than ``suite``'s folder, or
    than ``mine`` (the suite as it will be run, before its folder is written); the same
    file run on other of its folds is the same suite."""
    kept, own = dest / "suite.yaml", suite.folder / "suite.yaml"
    if not kept.is_file() or kept.resolve() == own.resolve():
        return
    name = own if mine is None else suite.source
    mine = yaml.safe_load(own.read_text() if mine is None else yaml.safe_dump(mine))
    if suite_body(yaml.safe_load(kept.read_text())) != suite_body(mine):
        raise SuiteChangedError(f"{dest}: holds runs of another suite file than {name}; "
                                "keep them in a new folder")


def _check_keep(suite: Suite, done: list[tuple[str, int]], dest: Path) -> None:
    """Refuse, before copying, to keep runs into a folder of another suite file, or
    beside runs (or of runs) of another setting than the first run kept."""
    check_kept_suite(suite, dest)
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
        write_suite_file(copy_of.read_text(), dest / "suite.yaml")
        keep_invocations(source, dest)
    size = 0
    for arm, seed in done:
        run_dir = suite.run_dir(arm, seed)
        size += copy_records(run_dir, dest / run_dir.relative_to(source))
    return len(done), size


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
        mine = run_setting(now, cfg)
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
