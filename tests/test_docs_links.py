"""The documentation's links: every page of docs/ is in its index (docs/README.md), and
every relative link in README.md, benchmarks/README.md and docs/ reaches its file and, where
it names one, a heading of that file (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (outside code fences; repeats get -1, -2)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    """``page``'s relative links whose file or anchor does not exist."""
    bad = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading with that anchor)")
    return bad


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_reaches_its_file_and_heading():
    bad = {str(p.relative_to(ROOT)): b for p in pages() if (b := broken_links(p))}
    assert not bad, f"broken links: {bad}"


def test_every_page_of_docs_is_in_the_index():
    index = DOCS / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve()
              for t in _LINK.findall(index.read_text(encoding="utf-8"))}
    own = [p for p in DOCS.rglob("*.md") if p != index and "suites" not in p.parts]
    missing = [str(p.relative_to(ROOT)) for p in own if p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


def test_the_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words: here?\n\n```\n# not a heading\n```\n"
                                   "[ok](#two-words-here) [ok](a.md#title) [no](#not-a-heading) "
                                   "[no](b.md) [web](https://example.org/#x)\n")
    assert broken_links(tmp_path / "a.md") == ["#not-a-heading (no heading with that anchor)",
                                               "b.md (no such file)"]
