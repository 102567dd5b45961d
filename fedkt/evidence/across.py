"""One suite's claims under several environments (``fedkt suite across``).

A seed does not fix how a machine's matrix kernels round, and across kernel settings
(bf16 with or without AMX, fp32) a run can move by more than a seed moves it
(docs/evidence.md, "Machines").  So a suite run on one machine decides its claims for
that machine.  ``fedkt suite across A B ...`` reads the same suite's ``suite.json`` from
folders made under different kernel settings and gives each claim one verdict across
them: it is **reproduced** (or contradicted) only where every folder says so, and
**machine-dependent** where the folders' verdicts differ.  Nothing is recomputed: each
folder's verdict stands as its own suite decided it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path
from typing import Any

from fedkt.tracking.tables import format_table

__all__ = ["SuiteResult", "across_report", "joint_verdict", "read_suite_result"]


@dataclass
class SuiteResult:
    """What one suite folder decided: its name, claims (by text) and environment lines."""

    label: str
    folder: Path
    name: str
    claims: dict[str, dict[str, Any]]
    environment: list[str]


def _table_lines(table: Path) -> list[str]:
    """``suite.md``'s lines (none where the folder has no table)."""
    try:
        return table.read_text().splitlines()
    except OSError:
        return []


def _environment_from_table(lines: list[str]) -> list[str]:
    """The environment lines of a ``suite.md`` (as :func:`fedkt.evidence.suite.
    environment_lines` writes them), for a folder whose suite.json does not keep them."""
    for i, line in enumerate(lines):
        if line.startswith("- environment:"):
            return [line]
        if line.startswith("- **runs from"):
            return [line, *takewhile(lambda x: x.startswith("  - "), lines[i + 1:])]
    return []


_COLUMNS = ("role", "claim", "estimate", "ci", "seed_ci", "per_seed_text", "floor_text")


def _claims_from_table(table: Path, lines: list[str]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The suite's name and claims from ``suite.md``'s "Claims" table, for a folder that
    kept only the table (a published one): the same fields ``suite.json`` holds as text."""
    name = next((x[len("# Suite "):].strip() for x in lines if x.startswith("# Suite ")), "")
    try:
        start = lines.index("## Claims")
    except ValueError:
        raise ValueError(f"{table}: no Claims table") from None
    claims: dict[str, dict[str, Any]] = {}
    for line in lines[start:]:
        cells = line.strip().strip("|").split("|")
        if len(cells) < 8 or cells[0].strip() not in ("primary", "secondary"):
            continue
        row = {k: c.strip() for k, c in zip(_COLUMNS, cells[:7], strict=True)}
        verdict, _, reason = "|".join(cells[7:]).strip().partition(": ")  # a reason may hold '|'
        claims[row["claim"]] = {**row, "verdict": verdict, "reason": reason}
    if not name or not claims:
        raise ValueError(f"{table}: not a suite's table (no '# Suite' title or no claim rows)")
    return name, claims


def read_suite_result(spec: str | Path) -> SuiteResult:
    """``LABEL=FOLDER`` or ``FOLDER`` (labelled by its name): a suite folder's verdicts,
    from its ``suite.json``, or from ``suite.md`` where only the table was kept.

    Raises ``FileNotFoundError`` naming the folder when it has neither and ``ValueError``
    when the file is not a suite's."""
    text = str(spec)
    label, sep, path = text.partition("=")
    folder = Path(path if sep else text)
    label = label if sep else folder.name
    result, table = folder / "suite.json", folder / "suite.md"
    if not result.is_file():
        if not table.is_file():
            raise FileNotFoundError(f"{folder}: no suite.json or suite.md (run `fedkt suite "
                                    f"report {folder}` first)")
        lines = _table_lines(table)
        name, claims = _claims_from_table(table, lines)
        return SuiteResult(label, folder, name, claims, _environment_from_table(lines))
    try:
        data = json.loads(result.read_text())
        claims = {c["claim"]: c for c in data["claims"]}
        name = str(data["name"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{result}: not a suite's result ({exc})") from None
    env = data.get("environment") or _environment_from_table(_table_lines(table))
    return SuiteResult(label, folder, name, claims, [str(x) for x in env])


def joint_verdict(verdicts: list[str | None], labels: list[str] | None = None) -> str:
    """One verdict from each environment's (``None``: the claim is absent there).

    Every environment agreeing gives their verdict (``reproduced under all 2``); any
    difference gives ``machine-dependent`` with each one's word."""
    labels = labels or [str(i + 1) for i in range(len(verdicts))]
    if any(v is None for v in verdicts):
        return "not compared: absent in " + ", ".join(
            label for label, v in zip(labels, verdicts, strict=True) if v is None)
    first = verdicts[0]
    if all(v == first for v in verdicts):
        return f"{first} under all {len(verdicts)}"
    return "machine-dependent: " + " / ".join(str(v) for v in verdicts)


def _cell(claim: dict[str, Any] | None) -> str:
    if claim is None:
        return "-"
    reason = claim.get("reason")
    word = claim["verdict"] + (" (why below)" if reason else "")
    return f"{claim['estimate']} {claim['ci']}; per seed {claim.get('per_seed_text', '-')}; {word}"


def across_report(specs: list[str | Path]) -> str:
    """Markdown: each claim's verdict in each folder, and the one across them."""
    if len(specs) < 2:
        raise ValueError("suite across needs two or more suite folders (one per environment)")
    results = [read_suite_result(s) for s in specs]
    names = {r.name for r in results}
    if len(names) > 1:
        raise ValueError("suite across compares one suite under several environments; these "
                         "folders hold different suites: " +
                         ", ".join(f"{r.folder} ({r.name})" for r in results))
    labels = [r.label for r in results]
    if len(set(labels)) < len(labels):
        raise ValueError("two folders share a label; name them LABEL=FOLDER")
    order: list[str] = []
    for r in results:  # the first folder's order (its primary first), then any others'
        order += [c for c in r.claims if c not in order]
    rows, reasons = [], []
    for text in order:
        found = [r.claims.get(text) for r in results]
        role = next((c.get("role", "") for c in found if c), "")
        rows.append([role, text, *(_cell(c) for c in found),
                     joint_verdict([c["verdict"] if c else None for c in found], labels)])
        reasons += [f"- {r.label}, `{text}`: {c['reason']}"
                    for r, c in zip(results, found, strict=True) if c and c.get("reason")]
    lines = [f"# Suite {results[0].name} across {len(results)} environments", ""]
    for i, r in enumerate(results, 1):
        env = r.environment or ["- environment: not recorded"]
        lines.append(f"{i}. **{r.label}** (`{r.folder}`)")
        lines += [f"   {e}" for e in env]
    seen: dict[tuple[str, ...], str] = {}
    for r in results:
        if r.environment and tuple(r.environment) in seen:
            lines.append(f"- note: {r.label} reports the same environment as "
                         f"{seen[tuple(r.environment)]}; this is not a second kernel setting")
        seen.setdefault(tuple(r.environment), r.label)
    lines += ["", "A claim counts as reproduced (or contradicted) when every environment's "
              "suite decided it so; where the verdicts differ it is machine-dependent "
              "(docs/evidence.md, \"Machines\"). Cells: estimate, CI (items, seeds), each "
              "seed's difference, that suite's verdict.", "",
              format_table(["", "claim", *labels, "across"], rows, markdown=True)]
    if reasons:
        lines += ["", "Why (each suite's own reason):", "", *reasons]
    return "\n".join(lines) + "\n"
