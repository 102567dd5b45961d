"""The built-in datasets: their catalog (vendored files, fields, splits, label names).

``data.dataset.name`` picks one (``intent_recognition``, ``tweeteval_hate:test``, ...);
:func:`list_builtin` lists them with their splits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedkt.data.dataset import DataError

__all__ = ["VENDORED", "Builtin", "list_builtin", "read_label_file", "resolve_builtin"]

VENDORED = Path(__file__).resolve().parent / "vendored"


@dataclass(frozen=True)
class Builtin:
    """One built-in dataset: where its files are and how its fields map to fedkt's."""

    description: str
    task: str
    folder: str
    splits: tuple[str, ...]  # first one is the default
    fields: dict[str, str]
    label_names: tuple[str, ...] | None = None
    label_file: str | None = None  # tab-separated "id<TAB>name" lines
    split_fields: dict[str, dict[str, str]] = field(default_factory=dict)
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    template: str | None = None


_INTENTS = (
    "add_to_playlist",
    "book_restaurant",
    "get_weather",
    "play_music",
    "search_screening_event",
    "search_creative_work",
    "rate_book",
)


def _intent_row(row: dict[str, Any]) -> dict[str, Any]:
    """BIG-bench intent_recognition row -> classification row over the 7 intents."""
    if list(row.get("choices", [])) != list(_INTENTS):
        raise DataError(f"unexpected intent choices {row.get('choices')!r}")
    text = str(row.get("input", ""))
    text = text.removeprefix("Utterance:").strip()
    return {"text": text, "label": row.get("label")}


def _choice_index(row: dict[str, Any], labels: list[Any]) -> int:
    """Index of an ARC / CommonsenseQA row's ``answerKey`` among its choice labels."""
    key = row.get("answerKey")
    if key not in labels:
        raise DataError(f"answerKey {key!r} is not one of the choice labels {labels}")
    return labels.index(key)


def _qa_parts(row: dict[str, Any]) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """An ARC / CommonsenseQA row's ``question`` object, choice texts and choice labels."""
    question = row.get("question")
    choices = question.get("choices") if isinstance(question, dict) else None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise DataError("expected question.choices, a list of {label, text} objects")
    return question, [c.get("text") for c in choices], [c.get("label") for c in choices]


def _arc_row(row: dict[str, Any]) -> dict[str, Any]:
    """ARC row -> multiple choice: the stem, the choice texts, the gold index (labels are
    ``A``.. or ``1``..), as lm-evaluation-harness's ``arc_easy`` / ``arc_challenge`` pose it."""
    question, texts, labels = _qa_parts(row)
    return {"question": question.get("stem"), "choices": texts,
            "label": _choice_index(row, labels), "source_id": row.get("id")}


def _csqa_row(row: dict[str, Any]) -> dict[str, Any]:
    """CommonsenseQA row -> multiple choice as lm-evaluation-harness's ``commonsense_qa``
    poses it: the lettered answers in the prompt (``option_lines``), the letters as the
    choices."""
    question, texts, labels = _qa_parts(row)
    if labels != list(_CSQA_LETTERS):
        raise DataError(f"expected choice labels {list(_CSQA_LETTERS)}, got {labels}")
    lines = "\n".join(f"{k}. {t}" for k, t in zip(_CSQA_LETTERS, texts, strict=True))
    return {"question": question.get("stem"), "choices": list(_CSQA_LETTERS),
            "label": _choice_index(row, labels), "option_lines": lines,
            "concept": question.get("question_concept"), "source_id": row.get("id")}


_CSQA_LETTERS = ("A", "B", "C", "D", "E")


def _arc(level: str, counts: str) -> Builtin:
    """ARC-``level`` (Easy, Challenge) as lm-evaluation-harness's ``arc_<level>`` poses it."""
    return Builtin(
        description=f"AI2 ARC-{level} science questions, lm-eval's arc_{level.lower()} prompt; "
        f"{counts} (licence CC BY-SA 4.0, arc/LICENSE.md)",
        task="multiple_choice",
        folder=f"arc/ARC-{level}",
        splits=("train", "dev", "test"),
        fields={"prompt": "question", "choices": "choices", "label": "label"},
        convert=_arc_row,
        template="Question: {prompt}\nAnswer:",
    )


def _banking77_names() -> tuple[str, ...]:
    """Banking77's 77 intents in label order, readable: "card arrival" for ``card_arrival``
    (lower case, without the source's stray "?" of ``reverted_card_payment?``)."""
    path = VENDORED / "banking77" / "categories.json"
    names = json.loads(path.read_text(encoding="utf-8"))
    return tuple(str(c).replace("_", " ").lower().rstrip("?").strip() for c in names)


_BANKING77 = _banking77_names()


# CLINC150's 10 domains in order, each its 15 intents (the vendored domains.json).
_CLINC150_DOMAINS: dict[str, list[str]] = json.loads(
    (VENDORED / "clinc150" / "domains.json").read_text(encoding="utf-8"))
# Its 150 intents in label order (the domains in order), readable: "pin change".
_CLINC150 = tuple(n.replace("_", " ") for names in _CLINC150_DOMAINS.values() for n in names)


def clinc150_domains() -> dict[str, str]:
    """CLINC150's domains -> their labels as a class spec (``"banking"`` -> ``"0-14"``), for
    ``data.dataset.classes``."""
    return {d: f"{15 * i}-{15 * i + 14}" for i, d in enumerate(_CLINC150_DOMAINS)}


_BUILTINS: dict[str, Builtin] = {
    "dialogsum": Builtin(
        description="DialogSum dialogue summarisation (generation, Rouge-L); "
        "1,500 of 12,460 train and 200 of 500 test dialogues (test has 3 references)",
        task="generation",
        folder="dialogsum",
        splits=("train", "test"),
        fields={"prompt": "dialogue", "target": "summary"},
        split_fields={
            "test": {
                "prompt": "dialogue",
                "target": "summary1",
                "references": "summary1,summary2,summary3",
            }
        },
        template="Dialogue:\n{prompt}\nSummary:",
    ),
    "social_iqa": Builtin(
        description="Social IQa commonsense multiple choice (BIG-bench), all 1,954 questions",
        task="multiple_choice",
        folder="bigbench/social_iqa",
        splits=("all",),
        fields={"prompt": "input", "choices": "choices", "label": "label"},
    ),
    "arc_easy": _arc("Easy", "2,251 train, 570 dev, 2,376 test"),
    "arc_challenge": _arc("Challenge", "1,119 train, 299 dev, 1,170 test"),
    "commonsense_qa": Builtin(
        description="CommonsenseQA, lm-eval's commonsense_qa prompt (answer letters A-E); "
        "9,741 train, 1,221 dev (licence MIT, commonsenseqa/LICENSE.md)",
        task="multiple_choice",
        folder="commonsenseqa",
        splits=("train", "dev"),
        fields={"prompt": "question", "choices": "choices", "label": "label"},
        convert=_csqa_row,
        template="Question: {prompt}\n{option_lines}\nAnswer:",
    ),
    "intent_recognition": Builtin(
        description="SNIPS utterance intent (BIG-bench), 7 classes, all 693 utterances",
        task="classification",
        folder="bigbench/intent_recognition",
        splits=("all",),
        fields={"text": "text", "label": "label"},
        label_names=_INTENTS,
        convert=_intent_row,
    ),
    "banking77": Builtin(
        description="Banking77 online-banking query intent, 77 classes; all 10,003 train "
        "and 3,080 test queries (40 per intent)",
        task="classification",
        folder="banking77",
        splits=("train", "test"),
        fields={"text": "text", "label": "label"},
        label_names=_BANKING77,
    ),
    "clinc150": Builtin(
        description="CLINC150 task-oriented query intent, 150 classes in 10 domains of 15 "
        "(domain d: labels 15d-15d+14); all 22,500 in-scope train, val and test queries",
        task="classification",
        folder="clinc150",
        splits=("all",),
        fields={"text": "text", "label": "label"},
        label_names=_CLINC150,
    ),
    "tweeteval_hate": Builtin(
        description="TweetEval hate speech (2 classes); 3,000 of 9,000 train, "
        "999 val, 1,500 of 2,970 test tweets",
        task="classification",
        folder="tweeteval/hate",
        splits=("train", "val", "test"),
        fields={"text": "text", "label": "label"},
        label_file="mapping.txt",
    ),
    "tweeteval_offensive": Builtin(
        description="TweetEval offensive language (2 classes); 3,000 of 11,916 train, "
        "1,324 val, 860 test tweets",
        task="classification",
        folder="tweeteval/offensive",
        splits=("train", "val", "test"),
        fields={"text": "text", "label": "label"},
        label_file="mapping.txt",
    ),
}


def list_builtin() -> dict[str, str]:
    """Built-in dataset names -> one-line descriptions (with their splits)."""
    out = {}
    for name, b in _BUILTINS.items():
        splits = ", ".join(f"{name}:{s}" for s in b.splits[1:])
        more = f" [{b.task}; default split {b.splits[0]!r}" + (
            f"; also {splits}]" if splits else "]"
        )
        out[name] = b.description + more
    return out


def resolve_builtin(spec: str) -> tuple[str, Builtin, str]:
    """``name[:split]`` -> (name, its entry, the split); an unknown name or split is a
    :class:`DataError` listing the allowed ones."""
    name, _, split = spec.partition(":")
    if name not in _BUILTINS:
        raise DataError(
            f"unknown built-in dataset {name!r}; allowed: {', '.join(sorted(_BUILTINS))} "
            "(or give 'path' for a local file or 'hf_name' for a Hugging Face dataset)"
        )
    b = _BUILTINS[name]
    split = split or b.splits[0]
    if split not in b.splits:
        raise DataError(
            f"built-in dataset {name!r} has no split {split!r}; splits: {', '.join(b.splits)}"
        )
    return name, b, split


def read_label_file(path: Path) -> list[str]:
    """Class names from a ``id<TAB>name`` file whose ids are 0, 1, 2, ... in order."""
    names: list[str] = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            idx, _, name = line.partition("\t")
            if int(idx) != i:
                raise DataError(f"{path} line {i + 1}: expected label id {i}, got {idx!r}")
            names.append(name.strip())
    return names
