"""Datasets of fedkt's shipped lm-evaluation-harness tasks: the vendored JSONL files.

Each task's ``custom_dataset`` reads its vendored file through ``datasets``' local
``json`` loader with an absolute path, so the tasks work offline and from any working
folder (``lm_eval --include_path fedkt/eval/harness_tasks`` included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VENDORED = Path(__file__).resolve().parents[2] / "data" / "vendored"


def _vendored_json(relative: str) -> Any:
    import datasets

    path = VENDORED / relative
    if not path.is_file():
        raise FileNotFoundError(f"fedkt harness task: vendored data file {path} is missing")
    return datasets.load_dataset("json", data_files={"test": str(path)})


def intent_recognition(**kwargs: Any) -> Any:
    """BIG-bench intent_recognition (SNIPS), all 693 utterances, split ``test``."""
    return _vendored_json("bigbench/intent_recognition/all.jsonl")


def social_iqa(**kwargs: Any) -> Any:
    """BIG-bench social_iqa, all 1,954 questions, split ``test``."""
    return _vendored_json("bigbench/social_iqa/all.jsonl")
