"""``fedkt suite report``: a suite folder's table, claims' verdicts and plots
(``suite.md``, ``suite.json``, ``plots/``), from its finished runs' records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedkt.eval.predictions import read_predictions
from fedkt.evidence.choice import choice_markdown, choose
from fedkt.evidence.claims import Claim, Decision, Joint, Ref, claim_parts, decide, decide_joint
from fedkt.evidence.invocations import commands_text, read_invocations
from fedkt.evidence.method_table import comparison_report
from fedkt.evidence.paper import paper_markdown, paper_result
from fedkt.evidence.runs import (
    Group,
    Run,
    available_metrics,
    compare,
    fmt_mean_std,
    open_run,
    paired,
)
from fedkt.evidence.suite import SUITE_JSON, SUITE_TABLE, Suite, load_suite_folder, run_state
from fedkt.evidence.suite_plots import suite_plots
from fedkt.evidence.wall import SITTING_GAP_S, suite_wall
from fedkt.infra.environment import describe
from fedkt.tracking.rows import mean_breakdown, sum_breakdown, time_breakdown
from fedkt.tracking.summary import read_environment
from fedkt.tracking.tables import breakdown_table, format_table

__all__ = [
    "environment_lines", "peak_memory", "report_suite", "target_rows",
]

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
    the targets, with ``yes``/``no``; none without targets.  A claim that is also a part of
    a joint claim before it (a suite that declares the joint primary and then its parts)
    gets one row.  Also records them in each verdict's ``targets`` (suite.json)."""
    if target_floor is None and target_half is None:
        return []
    rows = []
    word = {True: "yes", False: "no", None: "-"}
    for part, first in claim_parts(verdicts):
        floor, half = part.get("floor"), part.get("half_width")
        if floor is None or half is None:
            continue
        met_floor = None if target_floor is None else bool(floor <= target_floor)
        met_half = None if target_half is None else bool(half <= target_half)
        part["targets"] = {"floor": target_floor, "floor_met": met_floor,
                           "half_width": target_half, "half_width_met": met_half}
        if first:
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
