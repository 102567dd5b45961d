"""Datasets of fedkt's shipped lm-evaluation-harness tasks: the vendored JSONL files.

Each task's ``custom_dataset`` reads its vendored file through ``datasets``' local
``json`` loader with an absolute path, so the tasks work offline and from any working
folder (``lm_eval --include_path fedkt/eval/harness_tasks`` included).
"""

from __future__ import annotations

import json
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


def hub_schema(row: dict[str, Any]) -> dict[str, Any]:
    """An ARC / CommonsenseQA row as shipped (``question.stem``, ``question.choices``) in
    the hub's schema that lm-eval's own tasks read (``allenai/ai2_arc``,
    ``tau/commonsense_qa``): ``question`` the stem, ``choices`` ``{"text", "label"}``."""
    question = row["question"]
    out = {"id": row["id"], "question": question["stem"],
           "choices": {"text": [c["text"] for c in question["choices"]],
                       "label": [c["label"] for c in question["choices"]]},
           "answerKey": row["answerKey"]}
    if "question_concept" in question:
        out["question_concept"] = question["question_concept"]
    return out


def _vendored_qa(relative: str) -> Any:
    import datasets

    path = VENDORED / relative
    if not path.is_file():
        raise FileNotFoundError(f"fedkt harness task: vendored data file {path} is missing")
    with path.open(encoding="utf-8") as fh:
        rows = [hub_schema(json.loads(line)) for line in fh if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def arc_easy(**kwargs: Any) -> Any:
    """AI2 ARC-Easy, the official test split (2,376 questions), split ``test``."""
    return _vendored_qa("arc/ARC-Easy/test.jsonl")


def arc_challenge(**kwargs: Any) -> Any:
    """AI2 ARC-Challenge, the official test split (1,170 questions), split ``test``."""
    return _vendored_qa("arc/ARC-Challenge/test.jsonl")


def commonsense_qa(**kwargs: Any) -> Any:
    """CommonsenseQA's labelled dev split (1,221 questions), split ``test``."""
    return _vendored_qa("commonsenseqa/dev.jsonl")
