"""The project's docs, code, configs and tests speak of the project only: no numbered
stretches of work, no internal issue numbers, no word on who ran what.  A reader has none
of that history; a commit, a date and a machine are what they can check.

The patterns are written so that this file does not match them itself (a ``[ ]`` for a
space, examples built from placeholders)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each: a regular expression (case-insensitive) and what it catches.
PATTERNS: dict[str, str] = {
    r"\bsessions?\s*#?\d+": "a numbered stretch of work",
    r"\bissues?\s?#?\d+": "an issue number",
    r"\b(?:this|that|a\s+later|an\s+earlier|the\s+next|the\s+previous|the\s+last|one)\s+"
    r"session(?:'s|s)?\b(?!\s+(?:scope|fixture|cookie|resumption|state|id)\b)":
        "a stretch of work, named as such",
    r"\bhelpers?(?:'s|s')?\s(?:jobs?|sessions?|tests?|runs?)\b": "work done by a helper",
    r"\bsub-?agents?\b": "work done by a helper",
    r"\bother\s(?:people's|sessions)\b": "work done beside, by others",
    r"\bthe\s+lead(?:'s|’s)": "whose work it was",
}
_RX = re.compile("|".join(f"(?:{p})" for p in PATTERNS), re.IGNORECASE)
_ISSUE = re.compile(r"\bissues?\s?#?\d+", re.IGNORECASE)

# Another project's issue tracker may be cited by number when its name comes right
# before the word ("transformers issue #1234", "torch's issue 99").
THIRD_PARTY = frozenset({
    "accelerate", "bitsandbytes", "datasets", "flower", "flwr", "huggingface", "mlflow",
    "onednn", "peft", "pytorch", "tensorboard", "tokenizers", "torch", "transformers",
})
_WORD_BEFORE = re.compile(r"([\w.-]+?)(?:'s)?[ ]+$")

# What is scanned: the repository's own prose, code and configs (not vendored data).
GLOBS = (
    "README.md", "CHANGELOG.md", "docs/**/*.md", "fedkt/**/*.py", "fedkt/configs/**/*.yaml",
    "benchmarks/*.py", "tests/**/*.py", "flower_app/**/*",
)


def hits(line: str) -> list[str]:
    """The self-references in a text (a line, or a whole file), each as the text it matched."""
    found = []
    for m in _RX.finditer(line):
        if _ISSUE.fullmatch(m.group()):
            before = _WORD_BEFORE.search(line[: m.start()])
            if before and before.group(1).lower() in THIRD_PARTY:
                continue
        found.append(m.group())
    return found


def scanned_files() -> list[Path]:
    """Every file :data:`GLOBS` names, once each, in a stable order."""
    files = {p for pattern in GLOBS for p in ROOT.glob(pattern) if p.is_file()}
    return sorted(files)


def test_the_patterns_catch_self_references_and_pass_ordinary_words():
    n, lead = 10, "lead"
    caught = [
        f"(session {n}, a 2-core Xeon)", f"Session {n} measured why",
        f"in sessions {n}-{n + 3}", f"issue {n}'s restructuring", f"(issue #{n})",
        f"Issue {n} ran it", f"(issues {n}, {n + 1})", f"and three helper{' '}jobs ran",
        f"another helper's{' '}jobs", f"two other{' '}sessions' jobs",
        f"the {lead}'s two suites", f"before{' '}session\n  {n} the key", f"(this{' '}session's "
        "processes)", f"measured in this{' '}session", f"in a later{' '}session",
        f"a sub{''}agent ran it", f"beside other{' '}people's test files", f"beside three helpers'{' '}tests",
    ]
    for text in caught:
        assert hits(text), text
    passed = [
        '@pytest.fixture(scope="session", autouse=True)', "once per test session",
        "TLS session resumption", "an HTTP session is kept", "that is an issue",
        "the issue of dehydration", f"transformers issue #{n * 123}",
        f"torch's issue {n}", f"see huggingface/transformers#{n}", "issued by the CA",
        "a named helper for it", "the leading model", "a helper function",
        "this session fixture", "one session scope for all", "the worker's session",
    ]
    for text in passed:
        assert not hits(text), (text, hits(text))


def test_no_file_speaks_of_how_the_project_was_made():
    files = scanned_files()
    assert ROOT / "README.md" in files and Path(__file__).resolve() in files
    found = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        # the whole text, not line by line: a phrase a line break cuts is still caught
        for match in hits(text):
            at = text.index(match)
            number = text.count("\n", 0, at) + 1
            context = " ".join(text[max(0, at - 50): at + len(match) + 50].split())
            found.append(f"{path.relative_to(ROOT)}:{number}: {match!r} in {context!r}")
    assert not found, (
        "name the commit, date and machine instead of the work's history:\n" + "\n".join(found))
