"""The label-free setting: public data without labels, choice knowledge, the controls
(shuffled, marginal, self, none) and the receiving-side options for FedMKT, LLM2SLM and
FedCoLLM."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from safetensors.torch import load_file

import fedkt.data.splits as splits_module
from fedkt.alignment import choices
from fedkt.config import ConfigError
from fedkt.data.splits import run_data
from fedkt.federated.payload import Payload, dumps
from fedkt.methods import get_method
from fedkt.methods.fedavg.algorithm import average_client_adapters
from fedkt.runtime.base import RuntimeClients, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport

torch.set_num_threads(1)
cotune_module = importlib.import_module("fedkt.methods.fedcollm.cotune")

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


def _rows_by_arm(make_config, method, arms):
    """Each arm (name: overrides) run whole, one round: its metric rows (no timings)."""
    rows = {}
    for name, extra in arms.items():
        cfg = label_free(make_config, method, *extra, name=name)
        run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
        rows[name] = _metric_rows(cfg)
    return rows


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


@pytest.mark.parametrize("teacher", ["shuffled", "marginal"])
@pytest.mark.parametrize("method", ["fedmkt", "llm2slm"])
def test_shuffled_and_marginal_teachers_send_the_same_bytes(make_config, method, teacher):
    """shuffled: the sender's rows permuted; marginal: every row the sender's mean
    posterior (exactly), in the same bytes as the real teacher's."""
    two = "clients.models=[{name: tiny-gpt2}, {name: tiny-qwen2}]"
    real_cfg = label_free(make_config, method, two, "clients.num_clients=2", name="real")
    shuf_cfg = label_free(make_config, method, two, "clients.num_clients=2",
                          f"method.teacher={teacher}", name=teacher)
    _, real = _one_round(real_cfg)
    _, shuf = _one_round(shuf_cfg)
    def knowledge(reply):  # its tensors, not its metrics (whose JSON text varies with the
        # losses' digits: 7.2186455726623535 against 7.215810775756836 with AVX512-BF16)
        return {k: v for k, v in reply.items()
                if k != "metrics" and isinstance(v, dict | torch.Tensor)}

    for (handler, sent_r, got_r), (_, sent_s, got_s) in zip(real, shuf, strict=True):
        for cid in sent_r:  # every request and every reply's knowledge has the same size
            assert len(dumps(sent_r[cid])) == len(dumps(sent_s[cid])), (handler, cid)
            assert (len(dumps(knowledge(got_r[cid]))) == len(dumps(knowledge(got_s[cid])))), \
                (handler, cid)
    (_, _, up_r), (_, down_r, _) = real
    (_, _, up_s), (_, down_s, _) = shuf
    def same_but(p_r, p_s):
        if teacher == "marginal":  # every row the mean of the real teacher's rows
            assert torch.equal(p_s, choices.marginal(p_r)) and not torch.equal(p_r, p_s)
            assert all(torch.equal(row, p_r.double().mean(0).float()) for row in p_s)
        else:  # the same rows, in another order
            assert _rows_sorted(p_r) == _rows_sorted(p_s) and not torch.equal(p_r, p_s)

    if method == "fedmkt":  # clients' posteriors (the same local training in both arms)
        for cid in up_r:
            same_but(up_r[cid]["choices"]["posteriors"], up_s[cid]["choices"]["posteriors"])
    else:  # LLM2SLM's frozen LLM: its S_0
        same_but(down_r[0]["s0"]["posteriors"], down_s[0]["s0"]["posteriors"])


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


def _client_adapters(cfg):
    """Each client's latest adapter on its disk (file names sort by round and step)."""
    out = {}
    for path in sorted(default_state_root(cfg).rglob("adapter.r*.safetensors")):
        out[path.parent.name] = load_file(str(path))
    return out


def _equal(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["fedmkt", "llm2slm"])
def test_no_exchange_arm_is_the_round_without_its_kd_step(make_config, method):
    """teacher: none: the adapters after the round are those of local training and the
    LLM's own-data epochs alone; nothing but the loss travels, no KD step runs."""
    cfg = label_free(make_config, method, "method.teacher=none", name="none")
    server = get_method(method).server(cfg, cfg.run_dir)
    server.setup()
    recording = Recording(cfg, LocalTransport(default_state_root(cfg)))
    recording.start_round(1, evaluate=False)
    server_metrics = server.round(1, recording)
    calls = recording.calls
    # the same round without steps 2-7: local training, then the LLM's own data
    ref_cfg = label_free(make_config, method, name="ref")
    ref = get_method(method).server(ref_cfg, ref_cfg.run_dir)
    ref.setup()
    clients = RuntimeClients(ref_cfg, LocalTransport(default_state_root(ref_cfg)))
    clients.start_round(1, evaluate=False)
    clients.call("train_and_share", {cid: Payload(share=False) for cid in clients.ids})
    ref.learn_own_data(1)
    assert _equal(server.adapter, ref.adapter)
    assert not _equal(server.adapter, server.llm.initial)  # the own-data epochs ran
    mine, theirs = _client_adapters(cfg), _client_adapters(ref_cfg)
    assert mine and mine.keys() == theirs.keys()
    assert all(_equal(mine[c], theirs[c]) for c in mine)
    # bytes and steps: the requests say share: false, S_0 never travels, replies carry
    # their metrics only (the loss among them); every client reports 0 KD steps
    (h1, sent1, got1), (h2, sent2, got2) = calls
    assert (h1, h2) == ("train_and_share", "distill")
    assert all(dict(m) == {"share": False} for m in sent1.values())
    assert all(set(r) == {"metrics"} and "train/loss" in r["metrics"] for r in got1.values())
    assert all(dict(m) == {} for m in sent2.values())
    assert all(set(r) == {"metrics"} for r in got2.values())  # they go to the client's row
    assert all(recording.traffic.metrics[c]["train/kd_steps"] == 0 for c in got2)
    assert "train/server_own_loss" in server_metrics
    assert server_metrics.get("train/kd_steps", 0) == 0 and "train/kd_loss" not in server_metrics


def test_fedcollm_no_exchange_arm_skips_co_tuning_only(make_config):
    cfg = label_free(make_config, "fedcollm", "clients.num_clients=2", "method.teacher=none",
                     name="none")
    server = get_method("fedcollm").server(cfg, cfg.run_dir)
    server.setup()
    clients = RuntimeClients(cfg, LocalTransport(default_state_root(cfg)))
    clients.start_round(1, evaluate=False)
    metrics = server.round(1, clients)
    assert metrics["train/cotune_steps"] == 0 and metrics["train/theta_shift_cotune"] == 0
    ref_cfg = label_free(make_config, "fedcollm", "clients.num_clients=2", name="ref")
    ref = get_method("fedcollm").server(ref_cfg, ref_cfg.run_dir)
    ref.setup()
    ref_clients = RuntimeClients(ref_cfg, LocalTransport(default_state_root(ref_cfg)))
    ref_clients.start_round(1, evaluate=False)
    theta, _ = average_client_adapters(ref, ref_clients, ref.theta)  # steps 1-3: FedAvg
    ref.learn_own_data(1)  # the LLM's own-data epochs
    assert _equal(server.theta, theta) and _equal(server.omega, ref.omega)
    assert not _equal(server.omega, server.llm.initial)


def test_fedcollm_marginal_teacher_is_the_others_mean_posterior(make_config, monkeypatch):
    seen = {"knowledge": [], "targets": []}
    real_knowledge, real_distill = cotune_module.choice_knowledge, cotune_module.distill_choices

    def knowledge(*args, **kwargs):
        seen["knowledge"].append(real_knowledge(*args, **kwargs))
        return seen["knowledge"][-1]

    def distill(cfg, lm, records, targets, taken, **kwargs):
        seen["targets"].append(targets)
        return real_distill(cfg, lm, records, targets, taken, **kwargs)

    monkeypatch.setattr(cotune_module, "choice_knowledge", knowledge)
    monkeypatch.setattr(cotune_module, "distill_choices", distill)
    _one_round(label_free(make_config, "fedcollm", "method.teacher=marginal"))
    p_f, p_g = seen["knowledge"]
    t_f, t_g = seen["targets"]
    assert torch.equal(t_f, choices.marginal(p_g)) and torch.equal(t_g, choices.marginal(p_f))
    assert all(torch.equal(row, p_g.double().mean(0).float()) for row in t_f)


RECEIVING = ("method.temperature=2", "method.receiving={rehearsal_ratio: 1, anchor_weight: "
             "0.5, t_squared: true, take: confident, teacher_confidence: 0.2, "
             "learner_confidence: 1.0}")


@pytest.mark.parametrize("method", ["fedmkt", "fedcollm"])
def test_receiving_options_read_no_withheld_public_label(make_config, monkeypatch, method):
    """With every receiving option on, poisoned public labels change nothing while they
    are withheld: rehearsal reads only the receiver's own records."""
    clean = label_free(make_config, method, *RECEIVING, name="clean")
    rows = run_job(clean, LocalTransport(default_state_root(clean)), quiet=True)
    train = [r for r in rows if r["split"] == "train"]
    key = "rehearsal_steps" if method == "fedmkt" else "cotune_rehearsal_steps_llm"
    assert any(r.get(key, 0) > 0 for r in train), key  # the options did run
    _poison(monkeypatch)
    dirty = label_free(make_config, method, *RECEIVING, name="dirty")
    run_job(dirty, LocalTransport(default_state_root(dirty)), quiet=True)
    assert _metric_rows(dirty) == _metric_rows(clean)
    monkeypatch.undo()
    splits_module._SPLITS_CACHE.clear()


def test_controls_and_receiving_options_refuse_what_they_cannot_act_on(make_config):
    base = (LLM, SLM, "data.split={scheme: fedmkt, test_size: 16}")
    choice = ("method.knowledge=choices", "method.selection=entropy")
    bad = [  # (method, overrides, the field the error must name)
        ("fedmkt", ("method.teacher=marginal",), "knowledge: choices"),
        ("fedcollm", ("method.teacher=marginal",), "knowledge: choices"),
        ("fedmkt", ("method.receiving.take=confident",), "method.receiving.take"),
        ("fedcollm", ("method.receiving.anchor_weight=1",), "method.receiving.anchor_weight"),
        ("fedmkt", (*choice, "method.teacher=none", "method.receiving.anchor_weight=1"),
         "method.receiving.anchor_weight"),
        ("fedcollm", ("method.knowledge=choices", "method.teacher=none",
                      "method.receiving.t_squared=true"), "method.receiving.t_squared"),
        # the LLM rehearses on the server's own records: without them, refused
        ("fedmkt", (*choice, "method.receiving.rehearsal_ratio=1"),
         "method.receiving.rehearsal_ratio"),
        ("fedcollm", ("method.knowledge=choices", "method.receiving.rehearsal_ratio=1"),
         "data.split.server_size"),
        ("fedmkt", (*choice, "method.receiving.teacher_confidence=1.5"), "teacher_confidence"),
        ("fedmkt", (*choice, "method.teacher=nobody"), "teacher"),
    ]
    for i, (method, overrides, field) in enumerate(bad):
        with pytest.raises(ConfigError) as err:
            make_config(*base, *overrides, method=method, name=f"bad{i}")
        assert field in str(err.value), (method, overrides, str(err.value))
    # accepted: none on top-K logits, T**2 on top-K logits, LLM2SLM's rehearsal (its LLM
    # does not receive), and every option with choices and server records
    for i, (method, overrides) in enumerate([
            ("fedmkt", ("method.teacher=none",)), ("fedcollm", ("method.teacher=none",)),
            ("fedmkt", ("method.temperature=2", "method.receiving.t_squared=true")),
            ("llm2slm", (*choice, "method.receiving.rehearsal_ratio=1")),
            ("fedmkt", (*choice, "data.split.server_size=20", *RECEIVING))]):
        make_config(*base, *overrides, method=method, name=f"ok{i}")


@pytest.mark.parametrize("side", ["server", "clients"])
def test_teacher_from_replaces_one_senders_knowledge_only(make_config, side):
    """``teacher_from``: the control replaces what one side sends and leaves the other's as
    the real arm's. ``server``: the clients' uploads are the real arm's, and the LLM, which
    learnt from them as in the real arm, sends its S_0 permuted; ``clients``: the uploads are
    permuted, and the LLM sends the S_0 that the both-sides control permutes, as it is."""
    two = "clients.models=[{name: tiny-gpt2}, {name: tiny-qwen2}]"
    runs = {}
    for arm, extra in {"real": (), "both": ("method.teacher=shuffled",),
                       side: ("method.teacher=shuffled", f"method.teacher_from={side}")}.items():
        cfg = label_free(make_config, "fedmkt", two, "clients.num_clients=2", *extra, name=arm)
        (_, _, up), (_, down, _) = _one_round(cfg)[1]
        runs[arm] = ({cid: r["choices"]["posteriors"] for cid, r in up.items()},
                     down[0]["s0"]["posteriors"])
    (up_real, s0_real), (up_both, s0_both), (up, s0) = runs["real"], runs["both"], runs[side]
    for cid in up_real:
        if side == "server":
            assert torch.equal(up[cid], up_real[cid])
        else:
            assert torch.equal(up[cid], up_both[cid]) and not torch.equal(up[cid], up_real[cid])
    twin = s0_real if side == "server" else s0_both  # the S_0 of the same LLM, as it is / shuffled
    assert _rows_sorted(s0) == _rows_sorted(twin) and not torch.equal(s0, twin)
    if side == "clients":  # its LLM learnt from the permuted uploads, not the real ones
        assert not torch.equal(s0, s0_real)


def test_teacher_from_needs_a_sender_side_control(make_config):
    with pytest.raises(ConfigError, match="teacher_from: 'server'.*ignored"):
        label_free(make_config, "fedmkt", "method.teacher_from=server")


def test_teacher_from_clients_under_llm2slm_is_refused(make_config):
    """Without LLM training (llm2slm, or llm_training: false) the clients send the LLM
    nothing: a control of what they send is a no-op."""
    with pytest.raises(ConfigError, match=r"method\.teacher_from.*llm2slm the clients send"):
        label_free(make_config, "llm2slm", "method.teacher=shuffled",
                   "method.teacher_from=clients")
    with pytest.raises(ConfigError, match=r"method\.teacher_from.*llm_training: false"):
        label_free(make_config, "fedmkt", "method.teacher=shuffled",
                   "method.teacher_from=clients", "method.llm_training=false")
    cfg = label_free(make_config, "llm2slm", "method.teacher=shuffled",
                     "method.teacher_from=server")
    assert cfg.method.controls("server") and not cfg.method.controls("clients")


def test_client_kd_false_leaves_the_llm_as_it_is_and_the_clients_at_step_1(make_config):
    """``client_kd: false`` (a control of clients -> LLM): steps 6-7 skipped. In one round
    the LLM's rows are those of the same arm with them, to the digit; each client's are
    the no-exchange arm's (its model of step 1), with no S_0 sent and no KD step."""
    arm = ("method.teacher=shuffled", "method.teacher_from=clients",
           "method.receiving={rehearsal_ratio: 1, anchor_weight: 1}")
    rows = _rows_by_arm(make_config, "fedmkt", {
        "both": arm, "oneway": (*arm, "method.client_kd=false"),
        "none": ("method.teacher=none",)})

    def part(name, server):
        return [{k: v for k, v in r.items() if "bytes" not in k}
                for r in rows[name] if (r.get("participant") == "server") == server]

    both, oneway = part("both", True), part("oneway", True)
    tested = [r for r in oneway if r["split"] == "test"]
    assert len(tested) == 2 and tested == [r for r in both if r["split"] == "test"]
    assert part("both", False) != part("oneway", False)  # the clients' step 7 ran there only

    def client_tests(name):
        return [{k: v for k, v in r.items() if k.startswith("accuracy") or k == "loss"}
                for r in part(name, False) if r["split"] == "test"]

    assert client_tests("oneway") == client_tests("none") and client_tests("none")
    kd = [r.get("kd_steps") for r in part("oneway", False) if r["split"] == "train"]
    assert kd and set(kd) == {0}
    with pytest.raises(ConfigError, match=r"client_kd: false.*llm_training: false"):
        label_free(make_config, "llm2slm", "method.client_kd=false", name="x1")
    with pytest.raises(ConfigError, match=r"client_kd: false.*post_fedavg"):
        label_free(make_config, "fedmkt", "method.client_kd=false", "method.post_fedavg=true",
                   name="x2")


def test_llm_kd_false_leaves_the_slm_as_it_is_and_the_llm_before_co_tuning(make_config):
    """FedCoLLM's ``llm_kd: false`` (a control of LLM -> SLM): the LLM's side of co-tuning
    skipped. The global SLM's rows are those of the same arm with it, to the digit (its
    target is the LLM's posteriors from before co-tuning); the LLM's are the no-exchange
    arm's (its model after its own-data epochs)."""
    arm = ("clients.num_clients=2", "method.teacher=shuffled",
           "method.receiving={rehearsal_ratio: 1, anchor_weight: 1}")
    rows = _rows_by_arm(make_config, "fedcollm", {
        "both": arm, "oneway": (*arm, "method.llm_kd=false"),
        "none": ("clients.num_clients=2", "method.teacher=none")})

    def tests(name, who):
        return [{k: v for k, v in r.items() if "bytes" not in k} for r in rows[name]
                if r.get("participant") == who and r["split"] == "test"]

    assert len(tests("oneway", "global_slm")) == 2
    assert tests("oneway", "global_slm") == tests("both", "global_slm")
    assert tests("oneway", "server") == tests("none", "server") != tests("both", "server")
    train = [r for r in rows["oneway"] if r.get("participant") == "server"
             and r["split"] == "train"]
    assert train and all("cotune_kd_llm" not in r and r["cotune_steps"] > 0 for r in train)
    with pytest.raises(ConfigError, match=r"llm_kd: false.*knowledge: choices"):
        make_config(LLM, SLM, "method.llm_kd=false", method="fedcollm", name="x1")
