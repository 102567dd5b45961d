"""The README's verdict table against the method docs that hold the suites' tables: every
interval the README quotes is one of its method doc's, at the README's precision; and the
demo's description against configs/demo.yaml."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_NUM = r"[+\-−]?\d+\.\d+"
_CI = re.compile(rf"\[({_NUM}), ({_NUM})\]")


def _num(text: str) -> float:
    return float(text.replace("−", "-"))


def _verdict_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("| method | suite | shape of the paper |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _decimals(text: str) -> int:
    return len(text.split(".")[1])


def test_every_interval_in_the_readme_table_is_in_its_method_doc():
    rows = _verdict_rows()
    assert len(rows) >= 8
    for row in rows:
        docs = sorted(set(re.findall(r"\(docs/methods/(\w+)\.md", row)))
        if not docs:
            method = row.split("|")[1].strip().split(",")[0].lower()
            docs = [method]
        intervals = []
        for name in docs:
            path = ROOT / "docs" / "methods" / f"{name}.md"
            assert path.is_file(), f"README row links {path}"
            intervals += [(_num(a), _num(b)) for a, b in _CI.findall(path.read_text())]
        for lo, hi in _CI.findall(row):
            places = max(_decimals(lo), _decimals(hi))
            want = (round(_num(lo), places), round(_num(hi), places))
            assert any((round(a, places), round(b, places)) == want for a, b in intervals), (
                f"README quotes [{lo}, {hi}] in the row of {docs}, which no interval of "
                f"docs/methods/{docs[0]}.md rounds to")


def test_the_evidence_doc_describes_the_demo_as_configured():
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    items = demo["data"]["split"]["test_size"]
    clients = demo["clients"]["num_clients"]
    text = (ROOT / "docs" / "evidence.md").read_text()
    assert f"{items}-item tables" in text
    assert f"× {clients + 2} participants" in text  # the server, the global SLM, the clients
