"""The floor plans in docs/architecture.md ("The tree") and the README ("Layout") against
the package: architecture.md names every module and package of fedkt/, the README every
top-level one, and neither names a file or folder that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedkt"
_FILE = re.compile(r"\b(\w+\.py)\b")
_FOLDER = re.compile(r"\b(\w+)/")
# Folders a plan names that are the repository's, not the package's.
_OUTSIDE = {"benchmarks", "configs", "docs", "fedkt", "support", "tests"}


def _block(path: Path, heading: str) -> str:
    """The first fenced block after ``heading`` in ``path``."""
    text = path.read_text(encoding="utf-8").split(heading, 1)[1]
    return text.split("```", 2)[1]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def _packages() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").is_file())


def _missing_and_absent(block: str, modules: list[Path], packages: list[Path]
                        ) -> tuple[list[str], list[str]]:
    files, folders = set(_FILE.findall(block)), set(_FOLDER.findall(block))
    missing = [str(p.relative_to(ROOT)) for p in modules if p.name not in files]
    missing += [f"{p.relative_to(ROOT)}/" for p in packages if p.name not in folders]
    names = {p.name for p in PACKAGE.rglob("*.py")}
    dirs = {p.name for p in PACKAGE.rglob("*") if p.is_dir()} | _OUTSIDE
    absent = sorted({f for f in files if f not in names} | {f"{d}/" for d in folders
                                                           if d not in dirs})
    return missing, absent


def test_the_architecture_tree_names_every_module_and_nothing_else():
    missing, absent = _missing_and_absent(
        _block(ROOT / "docs" / "architecture.md", "## The tree"), _modules(), _packages())
    assert not missing, f"docs/architecture.md, The tree: add {missing}"
    assert not absent, f"docs/architecture.md, The tree: no such file or folder {absent}"


def test_the_readme_layout_names_every_top_level_module_and_nothing_else():
    top = [p for p in _modules() if p.parent == PACKAGE]
    packages = [p for p in _packages() if p.parent == PACKAGE]
    missing, absent = _missing_and_absent(_block(ROOT / "README.md", "## Layout"), top, packages)
    assert not missing, f"README.md, Layout: add {missing}"
    assert not absent, f"README.md, Layout: no such file or folder {absent}"


def test_the_check_sees_a_missing_and_an_absent_name():
    block = "fedkt/\n  runner.py   the loop\n  gone.py     moved away\n  eval/  nowhere/\n"
    modules = [PACKAGE / "runner.py", PACKAGE / "cli.py"]
    missing, absent = _missing_and_absent(block, modules, [PACKAGE / "eval", PACKAGE / "data"])
    assert missing == ["fedkt/cli.py", "fedkt/data/"]
    assert absent == ["gone.py", "nowhere/"]
