"""The label-free setting (issue 27): public data without labels, choice knowledge, and
the shuffled-teacher and no-exchange controls for FedMKT, LLM2SLM and FedCoLLM."""

from __future__ import annotations

import json

import pytest
import torch

import fedkt.data.splits as splits_module
from fedkt.config import ConfigError
from fedkt.data.splits import run_data
from fedkt.methods import get_method
from fedkt.payload import dumps
from fedkt.runner import run_job
from fedkt.runtime.base import RuntimeClients, default_state_root
from fedkt.runtime.local import LocalTransport

torch.set_num_threads(1)

LLM = "server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}"
SLM = "clients.models=[{name: tiny-gpt2}]"
# the server labels intents 0-2, the clients 3-6; public (unlabelled) and test hold all 7
DISJOINT = ("data.split={scheme: fedmkt, test_size: 16, server_size: 60}",
            "data.classes={server: '0-2', private: '3-6'}", "data.max_public=8",
            "data.max_private_per_client=12", "data.public_labels=false",
            "training.lora.target_modules=all-linear")
LABEL_FREE = {
    "fedmkt": ("method.knowledge=choices", "method.selection=entropy", "method.ft_weight=0"),
    "llm2slm": ("method.knowledge=choices", "method.selection=always", "method.ft_weight=0"),
    "fedcollm": ("method.knowledge=choices", "method.ft_weight=0", "method.kd_weight=1"),
}


def label_free(make_config, method, *overrides, name="run"):
    return make_config(LLM, SLM, *DISJOINT, *LABEL_FREE[method], "rounds=1", *overrides,
                       method=method, name=name)


def _metric_rows(cfg):
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "seconds" not in k and "time" not in k
             and k != "compute_cpu"} for r in rows]


def test_every_path_that_reads_a_public_label_is_refused(make_config):
    base = (LLM, SLM, *DISJOINT)
    cases = {
        "fedmkt": [("method.ft_weight", ("method.knowledge=choices",
                                         "method.selection=entropy")),
                   ("method.knowledge", ("method.ft_weight=0",)),
                   ("method.selection", ("method.knowledge=choices", "method.ft_weight=0")),
                   ("method.unaligned", ("method.ft_weight=0",))],
        "llm2slm": [("method.ft_weight", ("method.knowledge=choices",
                                          "method.selection=entropy"))],
        "fedcollm": [("method.ft_weight", ("method.knowledge=choices",)),
                     ("method.knowledge", ("method.ft_weight=0",))],
    }
    for method, checks in cases.items():
        for key, overrides in checks:
            with pytest.raises(ConfigError, match=r"data\.public_labels") as err:
                make_config(*base, *overrides, method=method, name=f"{method}-{key}")
            assert key in str(err.value), (method, key, str(err.value))
    # the other readers of public labels: centralized's pooling, FedSP's server data and a
    # prefix started from the public pairs
    for method, extra, key in (("centralized", (), "method.include_public"),
                               ("fedsp", (), "data.public_labels"),
                               ("fedavg", ("training.peft=prefix", "training.prefix_init=text"),
                                "training.prefix_init")):
        models = () if method == "fedsp" else (SLM,)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            make_config(LLM, *models, *DISJOINT, *extra, method=method, name=f"x-{method}")
    # the same settings with labels are fine; a shuffled teacher needs choice knowledge
    make_config(LLM, SLM, "data.split={scheme: fedmkt, test_size: 16}", method="fedmkt")
    for method in ("fedmkt", "fedcollm"):
        with pytest.raises(ConfigError, match="knowledge: choices"):
            make_config(LLM, SLM, "method.teacher=shuffled", method=method, name=f"s-{method}")


def _poison(monkeypatch):
    """Every public record's label moved to another class before the data reaches a method."""
    real = splits_module.make_splits

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        out["public"] = [{**r, "label": (r["label"] + 1) % 7} for r in out["public"]]
        return out

    monkeypatch.setattr(splits_module, "make_splits", poisoned)
    splits_module._SPLITS_CACHE.clear()


@pytest.mark.parametrize("method", ["fedmkt", "llm2slm", "fedcollm"])
def test_poisoned_public_labels_change_nothing_while_withheld(make_config, monkeypatch, method):
    clean = label_free(make_config, method, name="clean")
    run_job(clean, LocalTransport(default_state_root(clean)), quiet=True)
    _poison(monkeypatch)
    dirty = label_free(make_config, method, name="dirty")
    assert all("label" not in r for r in run_data(dirty.data, 1, dirty.seed).public)
    run_job(dirty, LocalTransport(default_state_root(dirty)), quiet=True)
    assert _metric_rows(dirty) == _metric_rows(clean)
    monkeypatch.undo()
    splits_module._SPLITS_CACHE.clear()


def test_poisoned_public_labels_do_change_a_labelled_run(make_config, monkeypatch):
    """The positive control of the test above: with labels, the same poison shows."""
    overrides = ("data.public_labels=true", "method.ft_weight=0.5",
                 "method.selection=dual_min_ce")
    clean = label_free(make_config, "fedmkt", *overrides, name="clean")
    run_job(clean, LocalTransport(default_state_root(clean)), quiet=True)
    _poison(monkeypatch)
    dirty = label_free(make_config, "fedmkt", *overrides, name="dirty")
    run_job(dirty, LocalTransport(default_state_root(dirty)), quiet=True)
    assert _metric_rows(dirty) != _metric_rows(clean)
    monkeypatch.undo()
    splits_module._SPLITS_CACHE.clear()


class Recording(RuntimeClients):
    """RuntimeClients that keeps every call: (handler, messages sent, replies received)."""

    def call(self, handler, messages, *, evaluate=None):
        replies = super().call(handler, messages, evaluate=evaluate)
        self.calls = [*getattr(self, "calls", []), (handler, messages, replies)]
        return replies


def _one_round(cfg):
    server = get_method(cfg.method.name).server(cfg, cfg.run_dir)
    server.setup()
    clients = Recording(cfg, LocalTransport(default_state_root(cfg)))
    clients.start_round(1, evaluate=False)
    server.round(1, clients)
    return server, clients.calls


def _rows_sorted(t):
    return sorted(map(tuple, t.tolist()))


@pytest.mark.parametrize("method", ["fedmkt", "llm2slm"])
def test_shuffled_teacher_sends_the_same_bytes_with_its_samples_permuted(make_config, method):
    two = "clients.models=[{name: tiny-gpt2}, {name: tiny-qwen2}]"
    real_cfg = label_free(make_config, method, two, "clients.num_clients=2", name="real")
    shuf_cfg = label_free(make_config, method, two, "clients.num_clients=2",
                          "method.teacher=shuffled", name="shuffled")
    _, real = _one_round(real_cfg)
    _, shuf = _one_round(shuf_cfg)
    def knowledge(reply):  # its tensors (its numbers' JSON text varies with their digits)
        return {k: v for k, v in reply.items() if isinstance(v, dict | torch.Tensor)}

    for (handler, sent_r, got_r), (_, sent_s, got_s) in zip(real, shuf, strict=True):
        for cid in sent_r:  # every request and every reply's knowledge has the same size
            assert len(dumps(sent_r[cid])) == len(dumps(sent_s[cid])), (handler, cid)
            assert (len(dumps(knowledge(got_r[cid]))) == len(dumps(knowledge(got_s[cid])))), \
                (handler, cid)
    (_, _, up_r), (_, down_r, _) = real
    (_, _, up_s), (_, down_s, _) = shuf
    if method == "fedmkt":  # clients' posteriors: the same rows, in another order
        for cid in up_r:
            p_r, p_s = up_r[cid]["choices"]["posteriors"], up_s[cid]["choices"]["posteriors"]
            assert _rows_sorted(p_r) == _rows_sorted(p_s) and not torch.equal(p_r, p_s)
    else:  # LLM2SLM's frozen LLM: its S_0 is the same up to the order of its rows
        s_r, s_s = down_r[0]["s0"]["posteriors"], down_s[0]["s0"]["posteriors"]
        assert _rows_sorted(s_r) == _rows_sorted(s_s) and not torch.equal(s_r, s_s)


def test_self_teacher_learns_nothing_from_the_other_side(make_config):
    """The no-exchange control: the LLM's adapter after a round does not depend on what
    the clients know (here: clients trained on other classes); with the real teacher it does."""
    def adapter(teacher, private, name):
        cfg = label_free(make_config, "fedmkt", f"method.teacher={teacher}",
                         f"data.classes.private='{private}'", name=name)
        server, _ = _one_round(cfg)
        return server.adapter

    a, b = adapter("self", "3-6", "self-a"), adapter("self", "4-5", "self-b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    c, d = adapter("real", "3-6", "real-a"), adapter("real", "4-5", "real-b")
    assert any(not torch.equal(c[k], d[k]) for k in c)


def test_fedcollm_co_tunes_by_kd_over_the_choices(make_config):
    cfg = label_free(make_config, "fedcollm", "clients.num_clients=2")
    server, calls = _one_round(cfg)
    rows = run_job(label_free(make_config, "fedcollm", name="run2"),
                   LocalTransport(default_state_root(cfg)), quiet=True)
    train = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
    assert train and train[0]["cotune_steps"] > 0 and "server_own_loss" in train[0]
    assert 0.0 <= train[0]["cotune_agreement"] <= 1.0
    assert train[0]["cotune_kd_llm"] >= 0 and train[0]["cotune_kd_slm"] >= 0
