"""unfinished/: every kept folder has its row in unfinished/README.md and every row its
folder, each a suite's kept runs (its suite.yaml beside them), so a suite published and
its folder removed leaves nothing behind."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
UNFINISHED = ROOT / "unfinished"
_ROW = re.compile(r"^\| \[([^\]]+)\]\(([^)]+)\) \|", re.M)


def _rows() -> dict[str, str]:
    return {name: link for name, link in _ROW.findall(
        (UNFINISHED / "README.md").read_text(encoding="utf-8"))}


def test_every_kept_folder_has_its_row_and_every_row_its_folder():
    folders = sorted(p.name for p in UNFINISHED.iterdir() if p.is_dir())
    rows = _rows()
    assert folders == sorted(rows), (
        f"unfinished/: folders without a README row: {sorted(set(folders) - set(rows))}; "
        f"rows without a folder: {sorted(set(rows) - set(folders))}")
    assert all(link == name for name, link in rows.items()), rows


def test_each_kept_folder_is_a_suites_runs():
    for folder in (p for p in UNFINISHED.iterdir() if p.is_dir()):
        suite = yaml.safe_load((folder / "suite.yaml").read_text(encoding="utf-8"))
        arms = set(suite["arms"])
        runs = sorted(folder.glob("*/fold_*/seed_*"))
        assert runs, f"{folder.name}: no kept run"
        for run in runs:
            arm = run.parents[1].name
            assert arm in arms, f"{run.relative_to(ROOT)}: arm {arm!r} is not its suite's"
            assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file(), run
