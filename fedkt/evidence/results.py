"""docs/results.md and the README's results summary, generated from published suites.

Each folder under a suites root (``docs/suites/<name>/``) holds what one ``fedkt suite
run`` decided: ``suite.json``, or only ``suite.md`` for a folder published before
suite.json was kept (:func:`fedkt.evidence.across.read_suite_result` reads either).  Its
provenance is the comment at the top of ``suite.md`` (the command, commit, date, wall time
and machine of the run, written when the folder was published), the suite's environment
line, and what its runs recorded where the comment is silent (:func:`provenance`).  Each setting's numbers are the suite's own text; for a suite published
under two or more kernel settings the summary adds what ``fedkt suite across`` gives from
the same files (the word across the settings, the pooled verdict blocked by fold).

The demo's final lines per machine kind are recorded as data too
(``docs/records/demo/<kind>.json``: the final table's values, machine, kernels, commit,
date, wall time; the one the README shows holds the table verbatim): :func:`demo_block`
makes the README's demo table and its per-kind table from them.

``python -m fedkt.evidence.results docs/suites > docs/results.md`` writes the page;
``--readme README.md`` rewrites the README's two generated blocks (results summary, demo)
in place.  The README's summary holds the suites that decide (:func:`decides`: split by
fold, with seeds inside each fold, and not a pilot); docs/results.md holds every suite.  The
tests regenerate both and compare them with the files, so a number that differs from its
suite fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from fedkt.evidence.across import SuiteResult, primary_across, read_suite_result
from fedkt.evidence.choice import choice_markdown
from fedkt.evidence.paper import paper_markdown
from fedkt.infra.environment import BF16_ISAS
from fedkt.tracking.tables import format_table

__all__ = ["DEMO_END", "DEMO_START", "README_END", "README_START", "Provenance",
           "Published", "demo_block", "demo_records", "kernels", "main", "provenance",
           "decides", "published", "readme_summary", "replace_block", "results_markdown"]

README_START = "<!-- results:start (python -m fedkt.evidence.results docs/suites --readme README.md) -->"
README_END = "<!-- results:end -->"
DEMO_START = "<!-- demo:start (python -m fedkt.evidence.results docs/suites --readme README.md) -->"
DEMO_END = "<!-- demo:end -->"
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Provenance:
    """Where a suite's numbers came from, as its folder records it."""

    command: str
    commit: str
    date: str
    time: str
    machine: str
    environment: str

    def line(self) -> str:
        """One markdown line: command, commit, machine, date, time, environment."""
        command = f"`{self.command}`" if self.command != NOT_RECORDED else NOT_RECORDED
        commit = f"`{self.commit}`" if self.commit != NOT_RECORDED else NOT_RECORDED
        return (f"command {command}; commit {commit}; machine: {self.machine}; "
                f"date: {self.date}; wall time: {self.time}; environment: {self.environment}")


@dataclass(frozen=True)
class Published:
    """One published suite folder: its decided claims and their provenance."""

    folder: Path
    result: SuiteResult
    provenance: Provenance

    @property
    def kernels(self) -> str:
        """The kernel setting it ran under (``fp32, AVX2``, ``bf16, AVX512-BF16``)."""
        return kernels(self.provenance.environment)


def _first(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    return found.group(0) if found else NOT_RECORDED


def provenance(folder: Path, environment: Sequence[str] = (),
               wall: dict[str, Any] | None = None,
               commands: Sequence[dict[str, str]] | None = None) -> Provenance:
    """The provenance comment of ``folder/suite.md`` read into its fields; a field the
    comment does not state is taken from the runs' record where it holds one (the
    command from ``commands``, suite.json's :mod:`fedkt.evidence.invocations`; the commit
    and CPU from the environment line; the dates from ``wall``'s sittings where every run
    recorded its times), else ``not recorded``.  The wall time is the one its runs
    recorded (``wall``: suite.json's, as :func:`fedkt.evidence.across.read_suite_result`
    reads it) where every run recorded its times; else the comment's
    first duration followed by ``wall`` or ``for N runs``, with its ``about`` or ``at
    least`` where it has one (a time put together afterwards); else the runs' record as a
    lower bound."""
    try:
        lines = (folder / "suite.md").read_text().splitlines()
    except OSError:
        lines = []
    comment = lines[0] if lines and lines[0].startswith("<!--") else ""
    env = next((e for e in environment if e.strip()), "")
    env = env.strip().removeprefix("- ").removeprefix("environment: ") or NOT_RECORDED
    command = _first(r"`fedkt suite run [^`]+`", comment).strip("`")
    if command == NOT_RECORDED and commands:
        command = "` then `".join(dict.fromkeys(c["command"] for c in commands))
    commit = (re.search(r"at commit ([0-9a-f]{7,40})", comment)
              or re.search(r"\(commit ([0-9a-f]{7})[0-9a-f]*\)", env))
    date = _first(r"\d{4}-\d{2}-\d{2}(?: [\d:]+(?:-[\d:]+)? UTC"
                  r"(?: to \d{4}-\d{2}-\d{2} [\d:]+ UTC)?)?", comment)  # a span over days too
    if date == NOT_RECORDED and wall and wall["sittings"] and wall["timed_runs"] == wall["runs"]:
        a, b = (datetime.fromisoformat(t) for t in (wall["sittings"][0][0],
                                                     wall["sittings"][-1][1]))
        date = f"{a:%Y-%m-%d %H:%M:%S}-{b:%H:%M:%S} UTC" if a.date() == b.date() else (
            f"{a:%Y-%m-%d %H:%M:%S} UTC to {b:%Y-%m-%d %H:%M:%S} UTC")
    machine = _first(r"a \d+-core [A-Za-z0-9 \-]+?(?=,| \(| beside|;|$)", comment)
    cpu = re.search(r", on ([^;,]+)", env)
    if machine == NOT_RECORDED and cpu:
        machine = f"{cpu.group(1).strip()} (its runs' record)"
    time = _first(r"(?:about |at least )?(?:\d+ h )?\d+ min(?: \d+ s)?"
                  r"(?= wall| for \d+ runs)", comment)
    if wall and wall["timed_runs"] == wall["runs"]:
        time = f"{wall['duration']} in {len(wall['sittings'])} sitting(s), its runs' record"
    elif wall and time == NOT_RECORDED:
        time = (f"at least {wall['duration']} ({wall['timed_runs']} of its {wall['runs']} "
                "runs recorded their times)")
    return Provenance(
        command=command,
        commit=commit.group(1) if commit else NOT_RECORDED,
        date=date,
        time=time,
        machine=machine,
        environment=env,
    )


def kernels(environment: str) -> str:
    """The arithmetic and kernels an environment line names: bf16 on AMX or AVX512-BF16,
    fp32 on AVX2 (``training.precision: auto``).  A lower machine kind emulated on a higher
    one names the kernels it leaves and the host, as the demo's table does: oneDNN's by
    ``ONEDNN_MAX_CPU_ISA`` (``bf16, AVX512-BF16 kernels on the AMX host``), and ATen's
    where its CPU capability (``ATEN_CPU_CAPABILITY``) is AVX2 under AVX512 matrix kernels
    (``bf16, AMX (ATen AVX2) kernels on the AMX host``).  Where the line records the
    arithmetic (``precision fp32 (pinned)``, from 2026-12-05) that wins over what ``auto``
    would pick: ``fp32, AVX512 kernels on the AMX host``, ``bf16 (emulated), AVX2``."""
    low = environment.lower()
    host = ("AMX" if "amx" in low else "AVX512-BF16" if "avx512_bf16" in low
            else "AVX512" if "avx512" in low else "AVX2" if "avx2" in low else None)
    if host is None:
        return NOT_RECORDED
    found = re.search(r"onednn_max_cpu_isa=([a-z0-9_]+)", low)
    cap = found.group(1).upper() if found else None
    native = host in ("AMX", "AVX512-BF16") and (cap is None or cap in BF16_ISAS)
    recorded = re.search(r"\bprecision (bf16|fp32) \((?:auto|pinned)\)", low)
    bf16 = recorded.group(1) == "bf16" if recorded else native
    if bf16 and native:  # the cap (if any) leaves bf16 dot products
        used = "AMX" if host == "AMX" and (cap is None or "AMX" in cap
                                           or cap in ("ALL", "DEFAULT")) else "AVX512-BF16"
        kind = f"bf16, {used}"
    else:  # fp32, or bf16 without bf16 dot products (emulated)
        level = host if cap is None else cap
        used = "AVX512" if level.startswith(("AVX512", "AMX")) else "AVX2"
        kind = f"{'bf16 (emulated)' if bf16 else 'fp32'}, {used}"
    aten = re.search(r"\bcpu (avx2|default)\b", low)  # ATen's capability below AVX512
    aten_lower = aten is not None and used != "AVX2"
    if aten_lower:
        kind += f" (ATen {aten.group(1).upper()})"
    return f"{kind} kernels on the {host} host" if used != host or aten_lower else kind


def published(root: Path) -> list[Published]:
    """Every suite folder under ``root`` (sorted by folder name) that holds a suite.json
    or a suite.md."""
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not ((folder / "suite.json").is_file() or (folder / "suite.md").is_file()):
            continue
        result = read_suite_result(folder)
        out.append(Published(folder, result, provenance(folder, result.environment,
                                                        result.wall, result.commands)))
    if not out:
        raise FileNotFoundError(f"{root}: no suite folders (each needs suite.json or suite.md)")
    return out


def _cell(text: object) -> str:
    return str(text if text not in (None, "") else "-").replace("|", "\\|")


def _claims_table(suite: SuiteResult) -> str:
    header = ["", "claim", "estimate", "95% CI (items, seeds, folds)" if suite.folds else
              "95% CI (items, seeds)", f"per {suite.unit}", "floor", "verdict"]
    rows = []
    for claim in suite.claims.values():
        verdict = _cell(claim.get("verdict"))
        if claim.get("reason"):
            verdict += f": {_cell(claim['reason'])}"
        rows.append([_cell(claim.get("role")), f"`{_cell(claim.get('claim'))}`",
                     _cell(claim.get("estimate")), _cell(claim.get("ci")),
                     _cell(claim.get("per_seed_text")), _cell(claim.get("floor_text")), verdict])
    return format_table(header, rows, markdown=True)


def _primary(suite: SuiteResult) -> dict | None:
    return next((c for c in suite.claims.values() if c.get("role") == "primary"), None)


def results_markdown(root: Path, command: str = "python -m fedkt.evidence.results docs/suites "
                     "> docs/results.md") -> str:
    """docs/results.md: a summary of every suite's primary claim, then each suite's claims
    table with its provenance once."""
    suites = published(root)
    lines = [
        "# Results",
        "",
        f"<!-- generated by `{command}`; edit the suites, not this page -->",
        "",
        "What each published suite decided, claim by claim, under the verdict rules of "
        "[evidence.md](evidence.md#how-verdicts-are-decided). Every number is the suite's own "
        "(`docs/suites/<folder>/suite.json`, or its `suite.md` where only that was kept); "
        "the folders hold the full tables, per-seed runs and plots. A suite decides its "
        "claims for the kernels it ran on: where the same suite ran under two settings, "
        "both are listed and a claim counts only where they agree "
        "([`fedkt suite across`](evidence.md#machines)). What each method's results mean: "
        "its record ([the docs index](README.md#records)).",
        "",
        "## Primary claims",
        "",
        _summary_table(suites, link_prefix=""),
        "",
    ]
    for suite in suites:
        rel = suite.folder.name
        lines += [
            f"## {rel}",
            "",
            f"Suite `{suite.result.name}` ({suite.kernels}), "
            + (f"some of the suite file's folds {suite.result.declared_folds} (`fedkt "
               "suite run --fold`: suite.md names them), "
               if suite.result.declared_folds else "")
            + f"folder [suites/{rel}](suites/{rel}/suite.md).",
            "",
            f"Provenance: {suite.provenance.line()}.",
            "",
            _claims_table(suite.result),
            "",
        ]
        if suite.result.paper:
            lines += [paper_markdown(suite.result.paper), ""]
        if suite.result.choice:
            lines += [choice_markdown(suite.result.choice), ""]
    return "\n".join(lines)


def _summary_table(suites: Sequence[Published], *, link_prefix: str) -> str:
    """One row per suite name: its primary claim, each kernel setting's verdict and, for a
    suite published under two or more, the word across them and the pooled verdict
    (``fedkt suite across``'s, from the same files)."""
    by_name: dict[str, list[Published]] = {}
    for suite in suites:
        by_name.setdefault(suite.result.name, []).append(suite)
    settings = sorted({s.kernels for s in suites}, key=lambda k: (not k.startswith("fp32"), k))
    header = ["suite", "primary claim", *settings, "across settings",
              "pooled (blocked by fold)"]
    rows = []
    for name, group in by_name.items():
        claim = _primary(group[0].result)
        if claim is None:
            continue
        cells, ordered = [], []
        for setting in settings:
            match = next((s for s in group if s.kernels == setting), None)
            mine = _primary(match.result) if match else None
            cells.append(f"{mine['verdict']}: {mine['estimate']} {mine['ci']}" if mine else "-")
            ordered += [match.result] if match else []
        both = primary_across(ordered) or ("-", "-")
        link = f"[{name}]({link_prefix}results.md#{group[0].folder.name})"
        rows.append([link, f"`{_cell(claim['claim'])}`", *(_cell(c) for c in cells),
                     *(_cell(c) for c in both)])
    return format_table(header, rows, markdown=True)


def decides(suite: Published) -> bool:
    """Whether a suite is one the README shows: it splits its items by fold (the unit of
    its verdict, seeds inside each fold) and it is not a pilot (a name ending ``_pilot``:
    a pilot chooses or sizes a suite; it does not decide a claim for fedkt)."""
    return bool(suite.result.folds) and not suite.result.name.endswith("_pilot")


def readme_summary(root: Path) -> str:
    """The README's block: the primary claim and verdicts of every suite that
    :func:`decides` (links into docs/results.md, which lists every suite), between
    :data:`README_START` and :data:`README_END`."""
    shown = [s for s in published(root) if decides(s)]
    return "\n".join([README_START, _summary_table(shown, link_prefix="docs/"), README_END])


def replace_block(text: str, block: str, start: str = README_START,
                  end: str = README_END) -> str:
    """``text`` with the lines from ``start`` to ``end`` replaced by ``block``."""
    first, last = text.find(start), text.find(end)
    if first < 0 or last < first:
        raise ValueError(f"no block between {start!r} and {end!r}")
    return text[:first] + block + text[last + len(end):]


def demo_records(folder: Path) -> list[dict[str, Any]]:
    """The recorded demo runs, one per machine kind (``<kind>.json``), in their ``order``;
    a file missing a field is a ``ValueError`` naming it."""
    records = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        missing = [k for k in ("kind", "order", "machine", "commit", "date", "wall_time",
                               "rows") if k not in data]
        if missing:
            raise ValueError(f"{path}: missing {', '.join(missing)}")
        records.append({**data, "file": path.name})
    if sum(bool(r.get("shown")) for r in records) != 1 or not records:
        raise ValueError(f"{folder}: exactly one record needs \"shown\": true (and its table)")
    return sorted(records, key=lambda r: r["order"])


def _final(record: dict[str, Any], who: str) -> str:
    value = record["rows"].get(who, {}).get("final")
    return "-" if value is None else f"{value:.3f}"


def demo_block(folder: Path, link_prefix: str = "docs/records/demo/") -> str:
    """The README's demo block: the shown record's final table verbatim, the line on the
    machine that made it, and every kind's final lines side by side."""
    records = demo_records(folder)
    shown = next(r for r in records if r.get("shown"))
    if not shown.get("table"):
        raise ValueError(f"{folder / shown['file']}: the shown record needs its table")
    header = ["machine kind", "server", "global SLM", "clients' mean", "time", "measured at",
              "record"]
    rows = [[r["kind"], _final(r, "server"), _final(r, "global_slm"),
             _final(r, "clients (mean)"), _cell(r["wall_time"]),
             f"{_cell(r['commit'])}, {_cell(r['date'])}",
             f"[{r['file']}]({link_prefix}{r['file']})"] for r in records]
    return "\n".join([
        DEMO_START, "```", *shown["table"], "```",
        f"Made on {shown['machine']}; {shown['kernels']}. The kernels move the numbers, so "
        "each machine kind ends the demo with its own lines (round 2; each record says where "
        "and how its time was measured):",
        "", format_table(header, rows, markdown=True), DEMO_END])


def main(argv: Sequence[str] | None = None) -> int:
    """Print docs/results.md for a suites root, or rewrite a README's summary block."""
    parser = argparse.ArgumentParser(prog="python -m fedkt.evidence.results",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the folder of published suites (docs/suites)")
    parser.add_argument("--readme", type=Path,
                        help="rewrite this file's results block in place instead of printing")
    args = parser.parse_args(argv)
    if args.readme is not None:
        text = replace_block(args.readme.read_text(), readme_summary(args.root))
        demo = demo_block(args.root.parent / "records" / "demo")
        args.readme.write_text(replace_block(text, demo, DEMO_START, DEMO_END))
        return 0
    sys.stdout.write(results_markdown(args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
