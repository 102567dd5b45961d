"""The papers' own tasks as built-in datasets: ARC-Easy, ARC-Challenge, CommonsenseQA.

Their counts per split, the licence files that ship with them, and the prompt and
choices each record is posed with (lm-evaluation-harness 0.4.x's ``arc_easy`` /
``arc_challenge`` / ``commonsense_qa``; tests/eval/test_harness_paper_tasks.py checks them
against lm-eval's own task definitions).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fedkt.cli import main
from fedkt.config import DatasetConfig
from fedkt.data import DataError, list_builtin, load_dataset_records
from fedkt.data.builtin import VENDORED
from fedkt.data.formatting import lm_pair, mc_view

# name -> {split: rows}: the official splits, all shipped.
COUNTS = {
    "arc_easy": {"train": 2251, "dev": 570, "test": 2376},
    "arc_challenge": {"train": 1119, "dev": 299, "test": 1170},
    "commonsense_qa": {"train": 9741, "dev": 1221},
}
FILES = {"arc_easy": "arc/ARC-Easy", "arc_challenge": "arc/ARC-Challenge",
         "commonsense_qa": "commonsenseqa"}
LICENCES = {"arc_easy": ("arc/LICENSE.md", "CC BY-SA 4.0"),
            "arc_challenge": ("arc/LICENSE.md", "CC BY-SA 4.0"),
            "commonsense_qa": ("commonsenseqa/LICENSE.md", "MIT")}


def _raw(name: str, split: str) -> list[dict]:
    path = VENDORED / FILES[name] / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_every_split_ships_whole_with_its_licence(name: str) -> None:
    for split, n in COUNTS[name].items():
        ds = load_dataset_records(DatasetConfig(name=f"{name}:{split}"))
        assert ds.task == "multiple_choice" and len(ds.records) == n, split
        assert len({r["extra"]["source_id"] for r in ds.records}) == n  # no duplicates
    with pytest.raises(DataError, match="splits: " + ", ".join(COUNTS[name])):
        load_dataset_records(DatasetConfig(name=f"{name}:validation"))
    licence, kind = LICENCES[name]
    text = (VENDORED / licence).read_text(encoding="utf-8")
    assert kind in text and "Citation" in text
    assert kind in list_builtin()[name] and licence in list_builtin()[name]


def test_fedkt_list_shows_them_with_their_licences(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name, (licence, kind) in LICENCES.items():
        line = next(x for x in out.splitlines() if x.strip().startswith(name + " "))
        assert kind in line and licence in line


@pytest.mark.parametrize("name", ["arc_easy", "arc_challenge"])
def test_arc_is_posed_as_lm_eval_poses_it(name: str) -> None:
    """Context ``Question: {stem}\\nAnswer:``, the choice texts after one space, the gold
    choice the one whose label is ``answerKey``: labels A..E or 1..4, 3 to 5 choices."""
    seen_labels, seen_sizes = Counter(), Counter()
    for split in COUNTS[name]:
        ds = load_dataset_records(DatasetConfig(name=f"{name}:{split}"))
        for raw, rec in zip(_raw(name, split), ds.records, strict=True):
            q = raw["question"]
            context, conts, gold = mc_view(rec, ds.task, ds.label_names, ds.template)
            assert context == f"Question: {q['stem']}\nAnswer:"
            assert conts == [" " + c["text"] for c in q["choices"]]
            assert q["choices"][gold]["label"] == raw["answerKey"]
            assert lm_pair(rec, ds.task, ds.label_names, ds.template) == (
                context, conts[gold])
            seen_labels["".join(c["label"] for c in q["choices"])] += 1
            seen_sizes[len(conts)] += 1
    assert {"ABCD", "1234"} <= set(seen_labels)
    assert {3, 4, 5} <= set(seen_sizes)  # the odd sizes are posed the same way


def test_commonsense_qa_is_posed_as_lm_eval_poses_it() -> None:
    """The five answers lettered in the prompt, the letters A..E as the choices."""
    for split in COUNTS["commonsense_qa"]:
        ds = load_dataset_records(DatasetConfig(name=f"commonsense_qa:{split}"))
        golds = Counter()
        for raw, rec in zip(_raw("commonsense_qa", split), ds.records, strict=True):
            q = raw["question"]
            context, conts, gold = mc_view(rec, ds.task, ds.label_names, ds.template)
            options = "".join(f"{c['label']}. {c['text']}\n" for c in q["choices"])
            assert context == f"Question: {q['stem'].strip()}\n{options}Answer:"
            assert conts == [" A", " B", " C", " D", " E"]
            assert "ABCDE"[gold] == raw["answerKey"]
            golds[gold] += 1
        assert sorted(golds) == [0, 1, 2, 3, 4]


def test_a_user_template_and_test_split_config() -> None:
    """A run config takes the train split as the data and the test split as the test set;
    a user's template still reads the record's fields."""
    from fedkt.config import parse_config

    cfg = parse_config({"name": "t", "method": "zero_shot",
                        "clients": {"num_clients": 1, "models": [{"name": "tiny-llama"}]},
                        "data": {"dataset": {"name": "arc_easy"},
                                 "split": {"test_dataset": {"name": "arc_easy:test"}}}},
                       "test")
    assert cfg.data.split.test_dataset.name == "arc_easy:test"
    ds = load_dataset_records(DatasetConfig(name="arc_challenge:dev",
                                            template="Q: {prompt}\n{options}\nA:"))
    context, _, _ = mc_view(ds.records[0], ds.task, ds.label_names, ds.template)
    assert context.startswith("Q: ") and "\nA. " in context and context.endswith("\nA:")
