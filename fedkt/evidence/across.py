"""One suite's claims under several environments (``fedkt suite across``).

A seed does not fix how a machine's matrix kernels round, and across kernel settings
(bf16 with or without AMX, fp32) a run can move by more than a seed moves it
(docs/evidence.md, "Machines").  So a suite run on one machine decides its claims for
that machine.  ``fedkt suite across A B ...`` reads the same suite's ``suite.json`` from
folders made under different kernel settings and gives each claim:

* each setting's own verdict, as its suite decided it (nothing recomputed);
* a word across them: ``reproduced under both`` (``under all N`` for three or more; or
  contradicted, not resolved, fragile) where every folder agrees; **machine-dependent**
  only where two settings decided opposite sides (one reproduced, another contradicted);
  ``differs`` otherwise;
* the **pooled verdict**, blocked by fold (:func:`fedkt.evidence.pooled.pooled_decision`):
  per fold, the difference averaged over the settings, and Student's t over those fold
  means, decided by the suite's rules (at least 4 folds, all but one on the side, the
  interval on it).

Every file is checked before it is used: a field of the wrong type, a NaN, a claim text
that does not parse, a nesting too deep to read are refused naming the file and field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path
from typing import Any

from fedkt.evidence.choice import choice_markdown
from fedkt.evidence.claims import ClaimError, Decision, Joint, decide_joint, parse_claim
from fedkt.evidence.invocations import check_commands
from fedkt.evidence.pooled import Pooled, align_folds, pooled_decision
from fedkt.infra.environment import setting_line
from fedkt.tracking.tables import format_table

__all__ = ["PooledClaim", "SuiteResult", "across_report", "joint_verdict", "pool_claim",
           "primary_across", "read_suite_result"]


@dataclass
class SuiteResult:
    """What one suite folder decided: its name, claims (by text) and environment lines."""

    label: str
    folder: Path
    name: str
    claims: dict[str, dict[str, Any]]
    environment: list[str]
    paper: dict[str, Any] | None = None  # the paper's numbers beside the suite's, if any
    folds: bool = False  # its claims' units are folds (seeds inside them), not seeds
    choice: dict[str, Any] | None = None  # a pilot's choice (fedkt.evidence.choice), if any
    wall: dict[str, Any] | None = None  # the runs' recorded wall time (fedkt.evidence.wall)
    commands: list[dict[str, str]] | None = None  # fedkt.evidence.invocations, if recorded
    declared_folds: list[int] | None = None  # the file's folds, where it ran some (--fold)

    @property
    def unit(self) -> str:
        """What each claim's listed differences are one of: ``fold`` or ``seed``."""
        return "fold" if self.folds else "seed"


def _table_lines(table: Path) -> list[str]:
    """``suite.md``'s lines (none where the folder has no table)."""
    try:
        return table.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []


def _environment_from_table(lines: list[str]) -> list[str]:
    """The environment lines of a ``suite.md`` (as :func:`fedkt.evidence.suite_report.
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
    kept only the table (a published one): the same fields ``suite.json`` holds as text.
    Only the table's own rows count: those that follow its header without a break."""
    name = next((x[len("# Suite "):].strip() for x in lines if x.startswith("# Suite ")), "")
    try:
        start = lines.index("## Claims")
    except ValueError:
        raise ValueError(f"{table}: no Claims table") from None
    head = next((i for i in range(start, len(lines)) if lines[i].startswith("|")), len(lines))
    rows = list(takewhile(lambda x: x.startswith("|"), lines[head:]))[2:]  # header, rule
    claims: dict[str, dict[str, Any]] = {}
    for k, line in enumerate(rows):
        cells = line.strip().strip("|").split("|")
        if len(cells) < 8 or cells[0].strip() not in ("primary", "secondary"):
            continue
        row = {key: c.strip() for key, c in zip(_COLUMNS, cells[:7], strict=True)}
        verdict, _, reason = "|".join(cells[7:]).strip().partition(": ")  # a reason may hold '|'
        entry = {**row, "verdict": verdict, "reason": reason}
        _check_claim(entry, f"{table}: Claims table row {k + 1}")
        claims[row["claim"]] = entry
    if not name or not claims:
        raise ValueError(f"{table}: not a suite's table (no '# Suite' title or no claim rows)")
    return name, claims


def _finite(value: Any, where: str) -> float:
    """``value`` (a number, or its text as suite.json writes it: '+0.1234') as a finite float."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: expected a number, got {type(value).__name__}")
    try:
        got = float(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(got):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    return got


def _check_claim(claim: Any, where: str) -> None:
    """Refuse a claim entry whose fields would not print or compare (naming ``where``)."""
    if not isinstance(claim, dict):
        raise ValueError(f"{where}: a claim must be a mapping, got {type(claim).__name__}")
    for key in ("claim", "verdict", "estimate", "ci"):
        if key not in claim:
            raise ValueError(f"{where}.{key}: missing")
    for key in ("claim", "verdict", "ci", "reason", "role", "per_seed_text", "seed_ci",
                "floor_text"):
        if key in claim and claim[key] is not None and not isinstance(claim[key], str):
            raise ValueError(f"{where}.{key}: expected text, got {claim[key]!r}")
    text = claim["claim"]
    if any(c in text for c in "\n\r|") or not text.strip():
        raise ValueError(f"{where}.claim: {text!r} is not one claim line")
    try:
        parse_claim(text)
    except ClaimError as exc:
        raise ValueError(f"{where}.claim: {exc}") from None
    for k, estimate in enumerate(str(claim["estimate"]).split(";")):  # a joint claim's parts
        if estimate.strip() != "-":  # "-": the claim was not run
            at = f"{where}.estimate" + (f"[part {k + 1}]" if ";" in str(claim["estimate"])
                                        else "")
            _finite(estimate.strip() if isinstance(claim["estimate"], str)
                    else claim["estimate"], at)
    parts = claim.get("parts")
    if parts is not None:
        if not isinstance(parts, list):
            raise ValueError(f"{where}.parts: expected a list of the joint claim's parts")
        for k, part in enumerate(parts):
            _check_claim(part, f"{where}.parts[{k}]")
    per_seed = claim.get("per_seed")
    if per_seed is not None:
        if not isinstance(per_seed, dict):
            raise ValueError(f"{where}.per_seed: expected a mapping of seed to difference")
        for seed, value in per_seed.items():
            _finite(value, f"{where}.per_seed[{seed}]")
    per_run = claim.get("per_run")
    if per_run is not None:
        if not isinstance(per_run, dict) or not all(isinstance(v, dict)
                                                    for v in per_run.values()):
            raise ValueError(f"{where}.per_run: expected a mapping of fold to a mapping of "
                             "seed to difference")
        for fold, seeds in per_run.items():
            for seed, value in seeds.items():
                _finite(value, f"{where}.per_run[{fold}][{seed}]")
    for part in str(claim.get("per_seed_text") or "-").split(";"):
        if part.strip() not in ("-", ""):
            for k, value in enumerate(part.split(",")):
                _finite(value.strip(), f"{where}.per_seed_text[{k}]")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except RecursionError:
        raise ValueError(f"{path}: nested too deep to be a suite's result") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a suite's result ({exc})") from None


def read_suite_result(spec: str | Path) -> SuiteResult:
    """``LABEL=FOLDER`` or ``FOLDER`` (labelled by its name): a suite folder's verdicts,
    from its ``suite.json``, or from ``suite.md`` where only the table was kept.

    Raises ``FileNotFoundError`` naming the folder when it has neither and ``ValueError``
    naming the file and field when the file is not a suite's."""
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
        return SuiteResult(label, folder, name, claims, _environment_from_table(lines),
                           folds=any(line.startswith("|") and "| per fold |" in line
                                     for line in lines))
    data = _load_json(result)
    if not isinstance(data, dict):
        raise ValueError(f"{result}: not a suite's result (the top level is not a mapping)")
    if not isinstance(data.get("name"), str):
        raise ValueError(f"{result}: name: missing or not text")
    if not isinstance(data.get("claims"), list):
        raise ValueError(f"{result}: claims: missing or not a list")
    claims = {}
    for i, claim in enumerate(data["claims"]):
        _check_claim(claim, f"{result}: claims[{i}]")
        claims[claim["claim"]] = claim
    env = data.get("environment")
    if env is None or env == []:
        env = _environment_from_table(_table_lines(table))
    elif not isinstance(env, list) or not all(isinstance(x, str) for x in env):
        raise ValueError(f"{result}: environment: expected a list of lines, got "
                         f"{type(env).__name__}")
    optional = {"paper": _check_paper, "choice": _check_choice, "wall": _check_wall,
                "commands": check_commands, "declared_folds": _check_folds}
    # each refused by field where malformed
    for key, check in optional.items():
        if data.get(key) is not None:
            check(data[key], f"{result}: {key}")
    return SuiteResult(label, folder, data["name"], claims, [_one_line(x) for x in env],
                       folds=bool(data.get("folds")),
                       **{key: data.get(key) for key in optional})


def _check_folds(folds: Any, where: str) -> None:
    """Refuse a ``declared_folds`` entry of suite.json that is not a list of folds."""
    if not isinstance(folds, list) or not all(
            isinstance(f, int) and not isinstance(f, bool) for f in folds):
        raise ValueError(f"{where}: expected a list of fold numbers, got {folds!r}")


def _check_wall(wall: Any, where: str) -> None:
    """Refuse a ``wall`` entry of suite.json (:func:`fedkt.evidence.suite_report.report_suite`'s)
    that the results page could not read."""
    if not isinstance(wall, dict):
        raise ValueError(f"{where}: expected a mapping")
    for key, kind in {"duration": str, "timed_runs": int, "runs": int, "sittings": list}.items():
        if not isinstance(wall.get(key), kind):
            raise ValueError(f"{where}.{key}: expected {kind.__name__}, got "
                             f"{type(wall.get(key)).__name__}")


def _check_choice(choice: Any, where: str) -> None:
    """Refuse a ``choice`` entry of suite.json that the results page could not render."""
    try:
        choice_markdown(choice)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{where}: not a choice fedkt wrote ({type(exc).__name__}: "
                         f"{exc})") from None


def _check_paper(paper: Any, where: str) -> None:
    """Refuse a ``paper`` entry of suite.json that the results page could not render."""
    if not isinstance(paper, dict) or not isinstance(paper.get("rows"), list):
        raise ValueError(f"{where}: expected a mapping with a list of rows")
    for i, row in enumerate(paper["rows"]):
        ok = (isinstance(row, dict) and isinstance(row.get("row"), str)
              and isinstance(row.get("fedkt_ref"), str)
              and all(isinstance(row.get(k), (int, float)) for k in ("paper", "runs"))
              and all(row.get(k) is None or isinstance(row.get(k), (int, float))
                      for k in ("mean", "std", "difference")))
        if not ok:
            raise ValueError(f"{where}.rows[{i}]: expected row, fedkt_ref, paper, runs, "
                             "mean, std and difference")


def _one_line(text: Any) -> str:
    """``text`` on one line (newlines cannot start a heading or a row in the output)."""
    return re.sub(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*", " ", str(text))


def joint_verdict(verdicts: list[str | None], labels: list[str] | None = None) -> str:
    """One word from each environment's verdict (``None``: the claim is absent there).

    Every environment agreeing gives their verdict (``reproduced under both``, ``... under
    all 3``); two settings decided on opposite sides (reproduced and contradicted) give
    ``machine-dependent``; any other difference is ``differs`` (one setting decided,
    another could not: not evidence that the machine moves the answer)."""
    labels = labels or [str(i + 1) for i in range(len(verdicts))]
    if any(v is None for v in verdicts):
        return "not compared: absent in " + ", ".join(
            label for label, v in zip(labels, verdicts, strict=True) if v is None)
    first = verdicts[0]
    if all(v == first for v in verdicts):
        return f"{first} under " + ("both" if len(verdicts) == 2 else f"all {len(verdicts)}")
    words = " / ".join(str(v) for v in verdicts)
    if "reproduced" in verdicts and "contradicted" in verdicts:
        return "machine-dependent: " + words
    return "differs: " + words


def _cell(claim: dict[str, Any] | None, unit: str = "seed") -> str:
    """One setting's cell: estimate, CI and each unit's difference, then the verdict; a
    joint claim's (its fields hold each part's, joined by ``; ``) part by part."""
    if claim is None:
        return "-"
    word = claim["verdict"] + (" (why below)" if claim.get("reason") else "")
    ests, cis = str(claim["estimate"]).split("; "), str(claim["ci"]).split("; ")
    per = str(claim.get("per_seed_text") or "-").split("; ")
    if len(ests) > 1 and len(ests) == len(cis) == len(per):
        parts = [f"part {k}: {e} {c}; per {unit} {d}"
                 for k, (e, c, d) in enumerate(zip(ests, cis, per, strict=True), 1)]
        return _one_line("; ".join(parts) + f"; {word}")
    return _one_line(f"{claim['estimate']} {claim['ci']}; per {unit} "
                     f"{claim.get('per_seed_text') or '-'}; {word}")


def _per_fold(claim: dict[str, Any], part: int | None = None) -> dict[str, float] | None:
    """A claim's (or its ``part``'s) per-fold differences by fold label (by position where
    only the text was kept)."""
    if part is not None and isinstance(claim.get("parts"), list) and \
            part < len(claim["parts"]):
        return _per_fold(claim["parts"][part])
    if part is None and isinstance(claim.get("per_seed"), dict) and claim["per_seed"]:
        return {str(k): float(v) for k, v in claim["per_seed"].items()}
    texts = str(claim.get("per_seed_text") or "-").split(";")
    text = texts[part or 0].strip() if (part or 0) < len(texts) else "-"
    if text in ("", "-"):
        return None
    return {f"#{k}": float(v) for k, v in enumerate(text.split(","))}


@dataclass(frozen=True)
class PooledClaim:
    """A claim's pooled verdict over kernel settings: each part's pooled estimate (one part
    for a plain claim) and the decision (a joint claim's by
    :func:`fedkt.evidence.claims.decide_joint`)."""

    parts: tuple[Pooled, ...]
    decision: Decision
    joint: bool

    def _estimates(self, folds: bool) -> list[str]:
        cells = [f"{p.estimate:+.4f} [{p.low:+.4f}, {p.high:+.4f}]"
                 + ("; per fold " + ", ".join(f"{m:+.3f}" for m in p.fold_means)
                    if folds else "") for p in self.parts]
        cells = [f"part {k}: {c}" for k, c in enumerate(cells, 1)] if self.joint else cells
        first = self.parts[0]  # every part is pooled on the same folds
        if first.shared_only:  # some settings ran more folds: say which were pooled
            cells[-1] += f" (folds {', '.join(first.folds)}, those every setting ran)"
        return cells

    def cell(self) -> str:
        """The long form: each part's estimate, interval and fold means, then the verdict."""
        return "; ".join(self._estimates(True)) + f"; {self.decision.verdict}" + (
            " (why below)" if self.decision.reason else "")

    def short(self) -> str:
        """The results summary's form: ``verdict: estimate [low, high]`` (each part's)."""
        return f"{self.decision.verdict}: " + "; ".join(self._estimates(False))


def pool_claim(text: str, found: list[dict[str, Any] | None]) -> PooledClaim | str:
    """``text``'s pooled verdict from each setting's claim (``found``, one per setting; a
    joint claim: each part pooled on its own), or why there is none: ``-`` where a setting
    lacks the claim or its per-fold differences, or the folds do not match."""
    claim = parse_claim(text)
    parts = claim.parts if isinstance(claim, Joint) else (claim,)
    pooled = []
    for k, part in enumerate(parts):
        folds = [_per_fold(c, k if isinstance(claim, Joint) else None) if c else None
                 for c in found]
        if any(f is None for f in folds):
            return "-"
        got = pooled_decision(part.text, folds)  # type: ignore[arg-type]
        if got is None:
            matched = align_folds(folds)  # type: ignore[arg-type]
            if matched is None:
                return "not computed: the folds differ between settings"
            return (f"not computed: {matched[0].shape[0]} fold in common "
                    "(pooling needs 2 or more)")
        pooled.append(got)
    joint = isinstance(claim, Joint)
    decision = decide_joint([p.decision for p in pooled]) if joint else pooled[0].decision
    return PooledClaim(tuple(pooled), decision, joint)


def _pooled_cell(text: str, found: list[dict[str, Any] | None]) -> tuple[str, str]:
    """The pooled verdict's cell and, unless plain, its reason."""
    got = pool_claim(text, found)
    if isinstance(got, str):
        return got, ""
    return got.cell(), got.decision.reason


def primary_across(results: list[SuiteResult]) -> tuple[str, str] | None:
    """The primary claim of one suite under several settings (``results``, two or more):
    the word across them (:func:`joint_verdict`) and the pooled verdict's short form
    (:meth:`PooledClaim.short`, or why there is none). None for fewer than two settings or
    no primary."""
    if len(results) < 2:
        return None
    text = next((t for t, c in results[0].claims.items() if c.get("role") == "primary"), None)
    if text is None:
        return None
    found = [r.claims.get(text) for r in results]
    word = joint_verdict([_one_line(c["verdict"]) if c else None for c in found],
                         [_one_line(r.label) for r in results])
    got = pool_claim(text, found)
    return word, got if isinstance(got, str) else got.short()


def across_report(specs: list[str | Path]) -> str:
    """Markdown: each claim's verdict in each folder, the word across them and the pooled
    verdict blocked by fold."""
    if len(specs) < 2:
        raise ValueError("suite across needs two or more suite folders (one per environment)")
    results = [read_suite_result(s) for s in specs]
    names = {r.name for r in results}
    if len(names) > 1:
        raise ValueError("suite across compares one suite under several environments; these "
                         "folders hold different suites: " +
                         ", ".join(f"{r.folder} ({r.name})" for r in results))
    labels = [_one_line(r.label) for r in results]
    if len(set(labels)) < len(labels):
        raise ValueError("two folders share a label; name them LABEL=FOLDER")
    order: list[str] = []
    for r in results:  # the first folder's order (its primary first), then any others'
        order += [c for c in r.claims if c not in order]
    rows, reasons = [], []
    for text in order:
        found = [r.claims.get(text) for r in results]
        role = next((_one_line(c.get("role") or "") for c in found if c), "")
        pooled, why = _pooled_cell(text, found)
        rows.append([role, text, *(_cell(c, r.unit) for c, r in zip(found, results,
                                                                     strict=True)),
                     joint_verdict([_one_line(c["verdict"]) if c else None for c in found],
                                   labels), pooled])
        reasons += [f"- {label}, `{text}`: {_one_line(c['reason'])}"
                    for label, c in zip(labels, found, strict=True) if c and c.get("reason")]
        if why:
            reasons.append(f"- pooled, `{text}`: {why}")
    lines = [f"# Suite {_one_line(results[0].name)} across {len(results)} environments", ""]
    for i, (r, label) in enumerate(zip(results, labels, strict=True), 1):
        env = r.environment or ["- environment: not recorded"]
        lines.append(f"{i}. **{label}** (`{r.folder}`)")
        lines += [f"   {e}" for e in env]
    seen: dict[tuple[str, ...], str] = {}
    for r, label in zip(results, labels, strict=True):
        setting = tuple(setting_line(e) for e in r.environment)  # another code: same kernels
        if setting and setting in seen:
            lines.append(f"- note: {label} reports the same environment as "
                         f"{seen[setting]}; this is not a second kernel setting")
        seen.setdefault(setting, label)
    folds = {r.folds for r in results}
    what = ("CI (items, seeds, folds), each fold's difference" if folds == {True} else
            "CI (items, seeds), each seed's difference" if folds == {False} else
            "CI, each seed's (or fold's) difference")
    lines += ["", f"Each environment's cell: estimate, {what}, that suite's verdict (a joint "
              "claim: part by part). across: the verdict every environment "
              "gave; machine-dependent only where two decided opposite sides (one reproduced, "
              "one contradicted), differs where they disagree otherwise. pooled: per fold "
              "(the folds every environment ran), the difference averaged over the "
              "environments, Student's t over those fold "
              "means, decided by the suite's rules: the effect averaged over these kernel "
              "settings (docs/evidence.md, \"Machines\").", "",
              format_table(["", "claim", *labels, "across", "pooled (blocked by fold)"], rows,
                           markdown=True)]
    if reasons:
        lines += ["", "Why (each suite's own reason):", "", *reasons]
    return "\n".join(lines) + "\n"
