"""Compute nothing twice (fedkt.eval.reuse): a stored evaluation or knowledge set stands in for
its computation only when everything that decides it is the same, and nothing in a run's
results shows whether it did, but the seconds it spared."""

from __future__ import annotations

import functools
import gzip
import json
import threading
from pathlib import Path

import pytest
import torch

from fedkt.eval import predictions, reuse
from fedkt.eval.evaluate import evaluate_causal_lm
from fedkt.infra import environment
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import time_breakdown, without_timings
from tests.conftest import run_data_of, suite_claims_text


def _run(cfg) -> list[dict]:
    return run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)


def _prediction_bytes(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted((run_dir / "predictions").rglob("*.json.gz"))}


def _spy_forward(monkeypatch) -> list[int]:
    """Count forward passes of every tiny Llama (the class the tiny models use)."""
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    calls: list[int] = []
    real = LlamaForCausalLM.forward

    @functools.wraps(real)  # the same signature: callers that read it see the real one
    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "forward", counted)
    return calls


def test_identical_clients_round0_runs_the_model_once_and_rows_match_reuse_off(
        make_config, monkeypatch, reuse_store):
    """Round 0 of two clients and the server, all on the same initial model: one
    evaluation runs the model, the other two read it; every row and prediction file
    equals a run with eval.reuse off, but for timings."""
    calls = _spy_forward(monkeypatch)
    small = ("rounds=1", "data.max_private_per_client=8")
    on = make_config(*small, name="on")
    rows_on = _run(on)
    forwards_on = len(calls)
    calls.clear()
    off = make_config(*small, "eval.reuse=false", name="off")
    rows_off = _run(off)
    forwards_off = len(calls)

    round0 = [r for r in rows_on if r["round"] == 0]
    assert {r["participant"] for r in round0} == {"server", "client_0", "client_1"}
    saved = [r for r in round0 if r.get("eval_saved_seconds")]
    assert len(saved) == 2, round0  # the first evaluation ran, two reused it
    assert all(r["eval_saved_seconds"] > 0 for r in saved)
    # After training the clients' adapters differ: round 1 recomputes every evaluation.
    assert not any(r.get("eval_saved_seconds") for r in rows_on if r["round"] == 1)
    assert not any(v for r in rows_off for k, v in r.items() if k.endswith("_saved_seconds"))
    assert without_timings(rows_on) == without_timings(rows_off)
    assert _prediction_bytes(on.run_dir) == _prediction_bytes(off.run_dir)
    # fedkt report / suite.md: what reuse spared, beside the phases (not in the wall time)
    spared = sum(r["eval_saved_seconds"] for r in saved)
    assert time_breakdown(rows_on)["saved"] == pytest.approx(spared)
    assert time_breakdown(rows_off)["saved"] == 0.0
    # Round 0 of the off run scored the test set three times, the on run once.
    assert forwards_off > forwards_on > 0
    per_eval = (forwards_off - forwards_on) / 2
    assert per_eval == int(per_eval) and per_eval > 0
    assert len(list((reuse_store / "eval").glob("*.json.gz"))) == 1 + 2 + 1  # r0, r1 x2, server


def test_a_second_run_reuses_every_evaluation_with_the_same_rows(make_config, monkeypatch):
    """The same config again (another arm's shared start, or the same suite run again)
    reads every evaluation; its rows and prediction files are the first run's."""
    first = make_config("rounds=1", "data.max_private_per_client=8", name="a")
    rows_a = _run(first)
    calls = _spy_forward(monkeypatch)
    second = make_config("rounds=1", "data.max_private_per_client=8", name="b")
    before = reuse.stats()
    rows_b = _run(second)
    after = reuse.stats()
    evals = [r for r in rows_b if r["split"] == "test"]
    assert after["reused"] - before["reused"] == len(evals) and after["computed"] == before[
        "computed"]
    assert without_timings(rows_a) == without_timings(rows_b)
    assert _prediction_bytes(first.run_dir) == _prediction_bytes(second.run_dir)
    # only training ran the model (its steps and nothing else)
    steps = sum(r.get("steps", 0) for r in rows_b if r["split"] == "train")
    assert 0 < len(calls) <= steps + 2 * 8


def test_the_key_changes_with_the_adapter_the_weights_and_the_settings(make_config):
    from fedkt.train.lm import client_lm, train_lm

    cfg = make_config()
    lm = client_lm(cfg, 0)
    start = reuse.model_digest(lm.model)
    assert reuse.model_digest(lm.model) == start  # stable
    train_lm(cfg, lm, cfg_records(cfg), seed=0, data=run_data_of(cfg))
    trained = reuse.model_digest(lm.model)
    assert trained != start  # a trained adapter: a new key, never the stale evaluation
    lm.reset()
    assert reuse.model_digest(lm.model) == start  # back to the initial adapter
    # A frozen base weight changed in place (its version counter moves): a new key too.
    frozen = next(p for p in lm.model.parameters() if not p.requires_grad)
    kept = frozen.detach().clone()
    with torch.no_grad():
        frozen[0].add_(1.0)
    changed = reuse.model_digest(lm.model)
    with torch.no_grad():
        frozen.copy_(kept)
    assert changed != start
    assert reuse.model_digest(lm.model) == start
    # The LoRA scaling is no weight: the PEFT config is in the key.
    lm.model.peft_config["default"].lora_alpha += 1
    try:
        assert reuse.model_digest(lm.model) != start
    finally:
        lm.model.peft_config["default"].lora_alpha -= 1


def _lora_pairs(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    return [(m.lora_A["default"], m.lora_B["default"]) for m in model.modules()
            if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {})]


def test_a_fresh_adapter_is_keyed_by_its_shape_until_b_moves(make_config):
    """PEFT starts LoRA's B at zero, so a fresh adapter's A (another seed's draw) changes no
    output: an evaluation's key ignores its values.  Once B moves, A decides outputs and is
    keyed.  A training's key always holds A: training moves B along it."""
    from fedkt.train.lm import client_lm

    lm = client_lm(make_config(), 0)
    pairs = _lora_pairs(lm.model)
    assert pairs and all(not b.weight.any() for _, b in pairs)
    fresh = reuse.model_digest(lm.model, outputs=True)
    training = reuse.model_digest(lm.model)
    with torch.no_grad():
        for a, _ in pairs:
            a.weight.normal_()  # another seed's A
    assert reuse.model_digest(lm.model, outputs=True) == fresh
    assert reuse.model_digest(lm.model) != training
    a0, b0 = pairs[0]
    with torch.no_grad():
        b0.weight[0, 0] = 1e-3  # one adapter's B moves: its A now decides outputs
    moved = reuse.model_digest(lm.model, outputs=True)
    assert moved != fresh
    with torch.no_grad():
        a0.weight.mul_(2.0)
    assert reuse.model_digest(lm.model, outputs=True) != moved
    with torch.no_grad():  # B back at zero: inert again, unless A is not finite
        b0.weight.zero_()
        assert reuse.model_digest(lm.model, outputs=True) == fresh
        a0.weight[0, 0] = float("nan")  # 0 * NaN is NaN: such an A decides outputs
    assert reuse.model_digest(lm.model, outputs=True) != fresh


def test_a_lora_variant_keeps_its_a_in_the_key():
    """DoRA normalises W + BA by its norm: no B-is-zero shortcut for a variant."""
    from peft import LoraConfig, get_peft_model

    from fedkt.models.tiny import build_tiny_causal_lm

    model = get_peft_model(build_tiny_causal_lm("tiny-llama")[0],
                           LoraConfig(r=4, target_modules="all-linear", use_dora=True))
    fresh = reuse.model_digest(model, outputs=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.normal_()
    assert reuse.model_digest(model, outputs=True) != fresh


def test_round0_of_another_training_seed_is_read_and_equals_its_computation(
        make_config, tmp_path):
    """Two seeds of one config on a saved checkpoint (pretrained weights: the seed draws
    only LoRA's A and the data order): the second's round 0 reads the first's evaluations,
    and its rows and prediction files equal the same seed run with eval.reuse off."""
    from fedkt.models.tiny import build_tiny_causal_lm

    model, tokenizer = build_tiny_causal_lm("tiny-llama")
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    small = ("rounds=1", "data.max_private_per_client=8", "data.split.folds=2",
             "data.split.fold=0",  # one test fold for both seeds, as a suite's fold
             f"clients.models=[{{name: {tmp_path / 'ckpt'}}}]")
    rows_first = _run(make_config(*small, "seed=1", name="first"))
    assert any(r["round"] == 0 for r in rows_first)
    on = make_config(*small, "seed=2", name="on")
    rows_on = _run(on)
    off = make_config(*small, "seed=2", "eval.reuse=false", name="off")
    rows_off = _run(off)
    round0 = [r for r in rows_on if r["round"] == 0 and r["split"] == "test"]
    assert len(round0) == 3 and all(r.get("eval_saved_seconds", 0) > 0 for r in round0)
    assert not any(r.get("eval_saved_seconds") for r in rows_on if r["round"] == 1)
    assert without_timings(rows_on) == without_timings(rows_off)
    assert _prediction_bytes(on.run_dir) == _prediction_bytes(off.run_dir)


def cfg_records(cfg) -> list[dict]:
    from fedkt.data.splits import run_data

    return run_data(cfg.data, cfg.clients.num_clients, cfg.seed).private[0][:8]


def test_after_training_the_evaluation_is_recomputed_not_reused(make_config, reuse_store):
    """The client's evaluation after local training (round 1) is computed even though an
    evaluation of the same client, items and settings (round 0) is stored, and its
    numbers differ from round 0's."""
    rows = _run(make_config("rounds=1", "training.lr=5e-2"))
    r0 = next(r for r in rows if r["round"] == 0 and r["participant"] == "client_0")
    r1 = next(r for r in rows if r["round"] == 1 and r["participant"] == "client_0"
              and r["split"] == "test")
    assert "eval_saved_seconds" not in r1
    assert r1["loss"] != r0["loss"]


def test_settings_and_precision_are_in_the_key(make_config):
    from fedkt.infra.precision import cpu_supports_bf16
    from fedkt.train.lm import client_lm, evaluate_lm

    cfg = make_config()  # training.precision: auto, bf16 on a CPU that has it, else fp32
    other = "fp32" if cpu_supports_bf16() else "bf16"
    lm = client_lm(cfg, 0)
    test = cfg_records(cfg)[:6]
    evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    for changed in (make_config("eval.batch_size=4", name="b4"),
                    make_config("data.max_length=16", name="ml"),
                    make_config(f"training.precision={other}", name="precision")):
        before = reuse.stats()
        evaluate_lm(changed, lm, test, data=run_data_of(changed))
        assert reuse.stats()["computed"] == before["computed"] + 1, changed
    before = reuse.stats()
    evaluate_lm(cfg, lm, test[:5], data=run_data_of(cfg))  # other test items
    evaluate_lm(cfg, lm, [{**test[0], "id": "other"}, *test[1:]], data=run_data_of(cfg))  # other ids
    assert reuse.stats()["computed"] == before["computed"] + 2
    before = reuse.stats()
    again = make_config(name="again")
    evaluate_lm(again, lm, test, data=run_data_of(again))  # the same again
    same = "bf16" if cpu_supports_bf16() else "fp32"  # what auto resolves to: the same
    same_cfg = make_config(f"training.precision={same}", name="same")
    evaluate_lm(same_cfg, lm, test, data=run_data_of(same_cfg))
    assert reuse.stats()["reused"] == before["reused"] + 2


def test_two_threads_racing_for_one_key_compute_it_once(make_config, reuse_store):
    """Two participants evaluating the same model at the same moment: the second waits
    for the first's entry (the cache's lock) and both return its metrics and table."""
    from fedkt.data.splits import run_data
    from fedkt.train.lm import client_lm

    cfg = make_config()
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    lm = client_lm(cfg, 0)
    records = fd.test[:6]
    started = threading.Barrier(2)
    results: list[tuple[dict, dict]] = [None, None]  # type: ignore[list-item]
    runs = []

    def evaluate(slot: int) -> None:
        with predictions.capture() as tables:
            started.wait()

            def compute() -> dict[str, float]:
                runs.append(slot)
                return evaluate_causal_lm(lm.model, lm.tokenizer, records, fd.task,
                                          fd.label_names)

            metrics = reuse.evaluation(True, lm.model, lm.tokenizer, {"records": records},
                                       compute)
        results[slot] = (metrics, {k: t.to_json() for k, t in tables.items()})

    threads = [threading.Thread(target=evaluate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(runs) == 1
    assert results[0] == results[1] and results[0][1]  # same metrics, same non-empty table
    entries = list((reuse_store / "eval").glob("*"))
    assert [p.suffix for p in entries if not p.name.endswith(".lock")] == [".gz"]
    data = json.loads(gzip.decompress(next(p for p in entries if p.suffix == ".gz")
                                      .read_bytes()))
    assert data["metrics"] == results[0][0]


def test_a_broken_entry_is_recomputed(make_config, reuse_store):
    from fedkt.train.lm import client_lm, evaluate_lm

    cfg = make_config()
    lm = client_lm(cfg, 0)
    test = cfg_records(cfg)[:4]
    first = evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    (entry,) = (reuse_store / "eval").glob("*.json.gz")
    entry.write_bytes(b"not gzip")
    before = reuse.stats()
    assert evaluate_lm(cfg, lm, test, data=run_data_of(cfg)) == first
    assert reuse.stats()["computed"] == before["computed"] + 1
    assert json.loads(gzip.decompress(entry.read_bytes()))["metrics"] == first


@pytest.mark.parametrize("value", [object(), {1, 2}])
def test_an_unkeyable_setting_is_an_error_a_set_is_not(value):
    if isinstance(value, set):
        assert reuse.digest({"x": value}) == reuse.digest({"x": {2, 1}})
    else:
        with pytest.raises(TypeError, match="cannot key a object"):
            reuse.digest({"x": value})


# Four CLI runs in subprocesses (minutes on 2 cores): the default run checks the same
# on/off equality in-process (test_identical_clients_round0_...).
@pytest.mark.slow
def test_a_suite_table_is_the_same_with_reuse_on_and_off_and_each_key_is_computed_once(
        tmp_path, reuse_store):
    """The quick suite (FedAvg vs standalone, tiny models), cut to one seed and round, run
    with --jobs 2 (both arms' round 0 race for the same keys) with eval.reuse on, then off:
    the table, the claims, every row (timings aside) and every prediction file are the
    same; with reuse on every stored evaluation was computed by exactly one process."""
    import os
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parents[2]
    suite = yaml.safe_load((root / "configs" / "suites" / "quick.yaml").read_text())
    suite["seeds"] = [0]
    suite["base"]["rounds"] = 1
    suite["base"]["data"]["split"]["test_size"] = 24
    suite["base"]["data"]["max_private_per_client"] = 8
    suite["base"]["eval"]["plots"] = False
    suite["claims"] = [c for c in suite["claims"] if "@" not in c]
    folders = {}
    for reuse_on in (True, False):
        suite["base"]["eval"]["reuse"] = reuse_on
        path = tmp_path / f"quick_{reuse_on}.yaml"
        path.write_text(yaml.safe_dump(suite))
        folders[reuse_on] = tmp_path / f"suite_{reuse_on}"
        done = subprocess.run(
            [sys.executable, "-m", "fedkt.cli", "suite", "run", str(path), "--output-dir",
             str(folders[reuse_on]), "--jobs", "2", "-q"], cwd=root, capture_output=True,
            text=True, timeout=900, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    def rows(folder: Path) -> dict[str, list[dict]]:
        return {str(p.parent.relative_to(folder)): without_timings(
            json.loads(line) for line in p.read_text().splitlines())
            for p in sorted(folder.glob("*/seed_*/metrics.jsonl"))}

    on, off = folders[True], folders[False]
    assert "| fedavg |" in suite_claims_text(on)
    assert suite_claims_text(on) == suite_claims_text(off)
    summary = {k: json.loads((f / "suite.json").read_text()) for k, f in folders.items()}
    assert summary[True]["table"] == summary[False]["table"]
    assert summary[True]["claims"] == summary[False]["claims"]
    assert rows(on) == rows(off) and len(rows(on)) == 2
    for arm in ("fedavg/seed_0", "standalone/seed_0"):
        assert _prediction_bytes(on / arm) == _prediction_bytes(off / arm)
    # Each evaluation either computed its entry or reused one (its participant's row of
    # that round says what it spared): as many entries as computed evaluations, so no key
    # was computed twice, by one run or by two runs at once.
    spared: dict[tuple, float] = {}
    tested: set[tuple] = set()
    for path in on.glob("*/seed_*/metrics.jsonl"):
        for r in map(json.loads, path.read_text().splitlines()):
            key = (path.parent.parent.name, r["round"], r["participant"])
            if r["split"] == "test":
                tested.add(key)
            spared[key] = spared.get(key, 0.0) + (r.get("eval_saved_seconds") or 0.0)
    computed = sorted(k for k in tested if not spared[k])
    entries = list((reuse_store / "eval").glob("*.json.gz"))
    assert len(entries) == len(computed) < len(tested), (computed, sorted(tested))
    assert not list((reuse_store / "eval").glob(".*tmp*"))  # no temporary left behind
    assert sum(k[1] == 0 for k in computed) == 1  # round 0: one model, scored once


def _mkt(make_config, *overrides, method="llm2slm", name="run"):
    return make_config("server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}",
                       "clients.models=[{name: tiny-gpt2}]",
                       "data.split={scheme: fedmkt, test_size: 8}", "data.max_public=8",
                       "data.max_private_per_client=8", "method.top_k=8", *overrides,
                       method=method, name=name)


def _same_topk(a, b) -> bool:
    return a.vocab_size == b.vocab_size and all(
        torch.equal(getattr(a, f), getattr(b, f))
        for f in ("sample_ids", "values", "indices", "lengths", "losses"))


def test_a_frozen_llms_knowledge_is_computed_once_and_a_trained_ones_again(make_config):
    """LLM2SLM's frozen LLM: its top-K logits on the public set are computed by the first
    server (one run, arm or suite) and read by the next, equal to a recomputation with
    reuse off; once the LLM's adapter changes (FedMKT trains it) they are computed again."""
    from fedkt.methods import get_method

    def server(cfg):
        s = get_method(cfg.method.name).server(cfg, cfg.run_dir)
        s.setup()
        return s

    cfg = _mkt(make_config)
    before = reuse.stats()
    first = server(cfg).own_knowledge()
    assert reuse.stats()["computed"] == before["computed"] + 1
    again = server(_mkt(make_config, name="other_arm")).own_knowledge()
    assert reuse.stats()["computed"] == before["computed"] + 1  # read, not computed
    assert reuse.stats()["reused"] == before["reused"] + 1
    fresh = server(_mkt(make_config, "eval.reuse=false", name="off")).own_knowledge()
    assert _same_topk(first, again) and _same_topk(first, fresh)
    trained = server(_mkt(make_config, method="fedmkt", name="fedmkt"))
    assert _same_topk(trained.own_knowledge(), first)  # same LLM before training: reused
    trained.adapter = {k: v + 0.01 for k, v in trained.adapter.items()}
    trained.s0 = None  # what a round of training does (FedMKTServer.round)
    computed = reuse.stats()["computed"]
    changed = trained.own_knowledge()
    assert reuse.stats()["computed"] == computed + 1
    assert not _same_topk(changed, first)


def test_choice_posteriors_are_reused_for_the_same_model_texts_and_temperature(make_config):
    from fedkt.alignment.choices import choice_knowledge
    from fedkt.data.splits import run_data
    from fedkt.train.lm import client_lm

    cfg = make_config()
    lm = client_lm(cfg, 0)
    records = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).test[:6]
    before = reuse.stats()
    p = choice_knowledge(cfg, lm, records, data=run_data_of(cfg))
    q = choice_knowledge(cfg, lm, records, data=run_data_of(cfg))
    assert reuse.stats()["reused"] == before["reused"] + 1 and torch.equal(p, q)
    warmer = choice_knowledge(cfg, lm, records, data=run_data_of(cfg), temperature=2.0)
    assert reuse.stats()["computed"] == before["computed"] + 2
    assert not torch.equal(warmer, p)
    off = make_config("eval.reuse=false", name="off")
    assert torch.equal(choice_knowledge(off, lm, records, data=run_data_of(off)), p)


def test_saved_seconds_are_their_own_clock_reported_beside_the_phases():
    from fedkt.infra import timing
    before = timing.clocks()
    with timing.phase("eval"):
        timing.saved("eval", 2.5)
    spent = timing.phase_seconds(before, timing.clocks())
    assert spent["eval_saved_seconds"] == pytest.approx(2.5)
    assert spent["eval_seconds"] < 1.0  # the spared time is not spent time
    with pytest.raises(ValueError, match="unknown saved phase 'align_saved'"):
        timing.saved("align", 1.0)


def test_an_unusable_store_never_stops_an_evaluation(make_config, monkeypatch, tmp_path):
    from fedkt.train.lm import client_lm, evaluate_lm

    cfg = make_config()
    lm = client_lm(cfg, 0)
    test = cfg_records(cfg)[:4]
    with predictions.capture() as wanted:
        off = make_config("eval.reuse=false", name="off")
        expected = evaluate_lm(off, lm, test, data=run_data_of(off))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(reuse.ENV, str(blocker))  # the store cannot be made
    with predictions.capture() as got:
        assert evaluate_lm(cfg, lm, test, data=run_data_of(cfg)) == expected
    assert got[""].to_json() == wanted[""].to_json()


def test_a_reused_table_goes_to_the_scope_of_its_caller(make_config):
    """FedSP evaluates its auxiliary model under scope 'aux': a table stored there is
    emitted unscoped to a caller without a scope, and back."""
    from fedkt.train.lm import client_lm, evaluate_lm

    cfg = make_config()
    lm = client_lm(cfg, 0)
    test = cfg_records(cfg)[:4]
    with predictions.capture() as first, predictions.scope("aux"):
        metrics = evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    before = reuse.stats()
    with predictions.capture() as second:
        assert evaluate_lm(cfg, lm, test, data=run_data_of(cfg)) == metrics
    with predictions.capture() as third, predictions.scope("aux"):
        evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    assert reuse.stats()["reused"] == before["reused"] + 2
    assert list(first) == ["aux"] and list(second) == [""] and list(third) == ["aux"]
    assert first["aux"].to_json() == second[""].to_json() == third["aux"].to_json()


def test_training_before_the_exchange_is_reused_with_identical_rows(
        make_config, reuse_store, monkeypatch, tmp_path):
    """FedMKT's arms of one seed share the clients' local training and the LLM's own-data
    epochs before the exchange: a second arm (another teacher) reads them from the store,
    and its rows and prediction files equal the same arm computed from an empty store; with
    training.reuse off nothing is stored or reused, and the models end the same."""
    common = ("server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}",
              "clients.models=[{name: tiny-llama}]",
              "data.split={scheme: fedmkt, test_size: 16, server_size: 16}",
              "data.max_public=8", "data.max_private_per_client=8", "data.public_labels=false",
              "method.knowledge=choices", "method.selection=entropy", "method.ft_weight=0",
              "rounds=1", "training.reuse=true")
    _run(make_config(*common, method="fedmkt", name="real"))
    before = reuse.stats()
    on = make_config(*common, "method.teacher=shuffled", method="fedmkt", name="on")
    rows_on = _run(on)
    after = reuse.stats()
    monkeypatch.setenv("FEDKT_REUSE_CACHE", str(tmp_path / "empty"))
    fresh = make_config(*common, "method.teacher=shuffled", method="fedmkt", name="fresh")
    rows_fresh = _run(fresh)
    assert without_timings(rows_on) == without_timings(rows_fresh)
    assert _prediction_bytes(on.run_dir) == _prediction_bytes(fresh.run_dir)
    off = make_config(*common, "method.teacher=shuffled", "training.reuse=false",
                      method="fedmkt", name="off")
    rows_off = _run(off)
    assert not (tmp_path / "empty" / "train").exists() or len(list(
        (tmp_path / "empty" / "train").glob("*.safetensors"))) == 3  # fresh's, none added
    assert _prediction_bytes(on.run_dir) == _prediction_bytes(off.run_dir)
    entries = sorted(p.name.split("-")[0] for p in (reuse_store / "train").glob("*.safetensors"))
    assert entries == ["train"] * 3  # the LLM's own-data epochs and each client's local epochs
    spared = [r for r in rows_on if r.get("train_saved_seconds")]
    assert {r["participant"] for r in spared} == {"server", "client_0", "client_1"}
    assert after["reused"] > before["reused"]
    assert not any(r.get("train_saved_seconds") for r in rows_off)


def test_a_repeated_distillation_is_reused_with_identical_rows(
        make_config, reuse_store, monkeypatch, tmp_path):
    """A control that replaces only what the LLM sends (teacher_from: server) repeats the
    real arm's distillation of the LLM: it reads that from the store (distill_saved_seconds
    on the server's row only), computes the clients' own, and its rows and prediction files
    equal the same arm's from an empty store and with training.reuse off."""
    common = ("server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}",
              "clients.models=[{name: tiny-llama}]",
              "data.split={scheme: fedmkt, test_size: 16, server_size: 16}",
              "data.max_public=8", "data.max_private_per_client=8", "data.public_labels=false",
              "method.knowledge=choices", "method.selection=always", "method.ft_weight=0",
              "rounds=1", "training.reuse=true")
    control = ("method.teacher=shuffled", "method.teacher_from=server")
    _run(make_config(*common, method="fedmkt", name="real"))
    entries = {p.name for p in (reuse_store / "distill").glob("*.safetensors")}
    assert len(entries) == 3  # the LLM's distillation and each client's
    on = make_config(*common, *control, method="fedmkt", name="on")
    rows_on = _run(on)
    added = {p.name for p in (reuse_store / "distill").glob("*.safetensors")} - entries
    assert len(added) == 2  # the clients learn from the shuffled LLM: their own
    spared = {r["participant"] for r in rows_on if r.get("distill_saved_seconds")}
    assert spared == {"server"}
    monkeypatch.setenv("FEDKT_REUSE_CACHE", str(tmp_path / "empty"))
    fresh = make_config(*common, *control, method="fedmkt", name="fresh")
    rows_fresh = _run(fresh)
    assert not any(r.get("distill_saved_seconds") for r in rows_fresh)
    off = make_config(*common, *control, "training.reuse=false", method="fedmkt", name="off")
    rows_off = _run(off)
    assert len(list((tmp_path / "empty" / "distill").glob("*.safetensors"))) == 3  # fresh's
    assert without_timings(rows_on) == without_timings(rows_fresh)

    def unsized(rows: list[dict]) -> list[dict]:  # the config rides in each request
        return [{k: v for k, v in r.items() if not k.startswith("bytes_")}
                for r in without_timings(rows)]

    assert unsized(rows_on) == unsized(rows_off)
    assert _prediction_bytes(on.run_dir) == _prediction_bytes(fresh.run_dir) \
        == _prediction_bytes(off.run_dir)


def test_no_stored_result_is_built_by_the_packages_the_key_leaves_out(make_config, reuse_store,
                                                                     monkeypatch):
    """The key's code leaves out fedkt/evidence (``fedkt.infra.environment.READERS``: it
    reads finished runs). A label-free FedMKT round builds every kind of entry
    (evaluations, trainings, knowledge sets, choice distillations), and no function of a
    left-out package runs while one is built, in any thread: a stored result never
    depends on their code."""
    import sys

    package = Path(environment.__file__).resolve().parents[1]
    readers = tuple(str(package / name) + "/" for name in environment.READERS)
    building: list[str] = []
    hits: list[str] = []
    real = reuse.cached

    def spy(path, build, *args, **kwargs):
        def traced(tmp):
            building.append(Path(path).parent.name)
            try:
                return build(tmp)
            finally:
                building.pop()
        return real(path, traced, *args, **kwargs)

    def profile(frame, event, arg):
        if event == "call" and building and frame.f_code.co_filename.startswith(readers):
            hits.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name} ({building[-1]})")

    monkeypatch.setattr(reuse, "cached", spy)
    cfg = make_config("server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}",
                      "clients.models=[{name: tiny-gpt2}]",
                      "data.split={scheme: fedmkt, test_size: 16, server_size: 60}",
                      "data.classes={server: '0-2', private: '3-6'}", "data.max_public=8",
                      "data.max_private_per_client=12", "data.public_labels=false",
                      "training.lora.target_modules=all-linear", "training.reuse=true",
                      "method.knowledge=choices", "method.selection=entropy",
                      "method.ft_weight=0", "rounds=1", "eval.round0=true", method="fedmkt")
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        _run(cfg)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    built = {p.name for p in reuse_store.iterdir() if any(p.iterdir())}
    assert {"eval", "knowledge", "train", "distill"} <= built, built
    assert not hits, hits[:5]
