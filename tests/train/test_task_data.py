"""A causal LM's training pairs and evaluation read the task (its label names, template)
from the run's data the caller passes, not from a copy that ``fedkt.train.lm`` builds
itself."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

from fedkt.train.lm import lm_pairs
from tests.conftest import ROOT, run_data_of, small_config


def test_training_pairs_follow_the_task_of_the_data_passed(tmp_path: Path):
    cfg = small_config(tmp_path)
    data = run_data_of(cfg)
    assert data.task == "classification" and data.label_names
    records = data.private[0][:3]
    plain = lm_pairs(cfg, records, data=data)
    renamed = replace(data, label_names=[f"class {i}" for i in range(len(data.label_names))])
    got = lm_pairs(cfg, records, data=renamed)
    assert [p for p, _ in got] == [p for p, _ in plain]  # the same prompts ...
    want = [f" class {r['label']}" for r in records]
    assert [t for _, t in got] == want != [t for _, t in plain]  # ... the passed names


def test_train_lm_reads_no_split_of_its_own():
    """``fedkt/train/lm.py`` names none of the functions that build a run's data."""
    tree = ast.parse((ROOT / "fedkt" / "train" / "lm.py").read_text(encoding="utf-8"))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & {"run_data", "client_splits", "make_splits"}
