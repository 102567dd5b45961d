"""The README's "Which method?" table against the records that hold the suites' tables:
every interval the README quotes is one of its record's, at the README's precision; the
README's demo tables against their recorded runs; and the demo's description against
configs/demo.yaml."""

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
    start = text.index("| your situation | method | what its evidence shows today |")
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
    quoted = 0
    for row in rows:
        docs = sorted(set(re.findall(r"\(docs/records/(\w+)\.md", row)))
        intervals = []
        for name in docs:
            path = ROOT / "docs" / "records" / f"{name}.md"
            assert path.is_file(), f"README row links {path}"
            intervals += [(_num(a), _num(b)) for a, b in _CI.findall(path.read_text())]
        quoted += len(_CI.findall(row))
        for lo, hi in _CI.findall(row):
            places = max(_decimals(lo), _decimals(hi))
            want = (round(_num(lo), places), round(_num(hi), places))
            assert any((round(a, places), round(b, places)) == want for a, b in intervals), (
                f"README quotes [{lo}, {hi}] in the row of {docs}, which no interval of "
                f"docs/records/{docs[0]}.md rounds to")
    assert quoted >= 5


def test_the_evidence_doc_describes_the_demo_as_configured():
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    items = demo["data"]["split"]["test_size"]
    clients = demo["clients"]["num_clients"]
    text = (ROOT / "docs" / "evidence.md").read_text()
    assert f"{items}-item tables" in text
    assert f"× {clients + 2} participants" in text  # the server, the global SLM, the clients


def test_the_readme_demo_tables_are_the_recorded_runs():
    from fedkt.evidence.results import (
        DEMO_END,
        DEMO_START,
        demo_block,
        demo_records,
        replace_block,
    )

    readme = (ROOT / "README.md").read_text()
    block = demo_block(ROOT / "docs" / "records" / "demo")
    assert replace_block(readme, block, DEMO_START, DEMO_END) == readme, (
        "README.md's demo block differs from docs/records/demo: run "
        "`python -m fedkt.evidence.results docs/suites --readme README.md`")
    # each kind's row says when it was measured: an old row cannot pass for a new one
    for record in demo_records(ROOT / "docs" / "records" / "demo"):
        row = next(line for line in block.splitlines() if line.startswith(f"| {record['kind']} |"))
        assert f"| {record['commit']}, {record['date']} |" in row, row


def test_each_demo_record_agrees_with_its_own_table():
    """A record that keeps the printed table holds the same final and round-0 values."""
    import json

    from fedkt.evidence.results import demo_records

    records = demo_records(ROOT / "docs" / "records" / "demo")
    kinds = {r["kind"] for r in records}
    assert {"bf16, AMX", "bf16, AVX512-BF16", "fp32, AVX2"} <= kinds
    for record in records:
        for line in record.get("table") or []:
            cells = re.split(r"\s{2,}", line.strip())
            if cells[0] in record["rows"]:
                want = record["rows"][cells[0]]
                assert (float(cells[2]), float(cells[3])) == (want["round0"], want["final"]), (
                    f"{record['file']}: {cells[0]}")
        assert json.loads(json.dumps(record))  # plain data


def test_the_readme_lists_every_file_a_run_writes():
    from fedkt.tracking.folder import WRITTEN

    text = (ROOT / "README.md").read_text()
    block = text.split("A run writes `runs/<name>/`:", 1)[1].split("```", 2)[1]
    listed = {line.split()[0].rstrip("/").split("/")[0] for line in block.splitlines()
              if line.strip() and not line.startswith(" ")}
    assert set(WRITTEN) <= listed, f"README's run folder lacks {sorted(set(WRITTEN) - listed)}"
