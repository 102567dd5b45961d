"""FedKD (Wu et al. 2022) and its encoder baselines, on tiny-bert and vendored TweetEval.

Runs go through the real local runtime (payloads serialised, client state on disk).
The one slow test runs a round on the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fedkt.config import ConfigError, apply_overrides, parse_config
from fedkt.federated.compression import (
    decompress_state,
    encode_update,
    energy_rank,
    from_payload,
    threshold_schedule,
)
from fedkt.methods import get_method
from fedkt.methods.base import ClientContext
from fedkt.methods.fedkd.losses import fedkd_losses
from fedkt.methods.fedkd.models import FedKDModels, layer_pairs
from fedkt.runtime.base import RoundError, RuntimeClients, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.train.encoder import text_batches, trainable_state
from tests.conftest import load_benchmark, needs_models
from tests.support.fault_injection import client_faults


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def fedkd_config(tmp_path, *overrides: str, method: str = "fedkd", name: str = "run"):
    data = {
        "name": name, "seed": 0, "rounds": 1, "output_dir": str(tmp_path / name),
        "method": {"name": method},
        "clients": {"num_clients": 2, "models": [{"name": "tiny-bert", "tiny": {"num_layers": 4}}]},
        "data": {"dataset": {"name": "tweeteval_hate", "max_records": 200},
                 "split": {"test_size": 16},
                 "partition": {"scheme": "dirichlet", "alpha": 1.0, "min_size": 8},
                 "max_private_per_client": 16, "max_length": 32},
        "training": {"lr": 1e-3, "batch_size": 8, "betas": [0.9, 0.999], "warmup_ratio": 0.0},
        "runtime": {"torch_threads": 1},
        "eval": {"batch_size": 16, "plots": False},
    }
    return parse_config(apply_overrides(data, list(overrides)), "test config")


class Recording(RuntimeClients):
    """RuntimeClients that keeps the requests sent and replies received, per handler."""

    def call(self, handler, messages, *, evaluate=None):
        replies = super().call(handler, messages, evaluate=evaluate)
        self.sent = getattr(self, "sent", {})
        self.replies = getattr(self, "replies", {})
        self.sent[handler], self.replies[handler] = messages, replies
        return replies


def server_and_clients(cfg):
    server = get_method(cfg.method.name).server(cfg, cfg.run_dir)
    server.setup()
    return server, Recording(cfg, LocalTransport(default_state_root(cfg)))


def client_ctx(cfg, cid: int, rnd: int) -> ClientContext:
    return ClientContext(cfg=cfg, cid=cid, rnd=rnd, step=0,
                         state_dir=default_state_root(cfg) / f"client_{cid}")


def test_layer_pairs_default_and_configured():
    # official mapping: student l <-> teacher l * L_t / L_s (last to last)
    assert layer_pairs(6, 2, None) == [(1, 3), (2, 6)]
    assert layer_pairs(12, 4, None) == [(1, 3), (2, 6), (3, 9), (4, 12)]
    assert layer_pairs(6, 2, [1, 4]) == [(1, 1), (2, 4)]
    assert layer_pairs(6, 2, [0, 6]) == [(2, 6)]  # 0: student layer 1 unmatched
    with pytest.raises(ConfigError, match="outside"):
        layer_pairs(6, 2, [1, 7])


def test_config_checks(tmp_path):
    with pytest.raises(ValueError, match="layer_map has 1 entries"):
        fedkd_config(tmp_path, "method={name: fedkd, layer_map: [2]}")
    cfg = fedkd_config(tmp_path, "data.dataset={name: social_iqa}", "data.partition.scheme=iid")
    with pytest.raises(ConfigError, match="classification task"):
        server_and_clients(cfg)


def _models_and_batch(cfg):
    models = FedKDModels.build(cfg, 2)
    records = [{"text": "what a lovely day", "label": 0}, {"text": "you are all awful", "label": 1},
               {"text": "nothing to see here", "label": 0}]
    return models, text_batches(models.tokenizer, records, 3, 32, None)[0]


def test_gradients_reach_teacher_student_and_w_h(tmp_path):
    cfg = fedkd_config(tmp_path)
    models, batch = _models_and_batch(cfg)
    assert models.pairs == [(1, 2), (2, 4)] and len(models.projections) == 2
    for mod in (models.teacher, models.student):  # dropout off: the same graph twice
        mod.eval()
    out = fedkd_losses(models, cfg.method, batch)
    assert out.hidden.item() > 0 and out.teacher_kd.item() >= 0 and out.student_kd.item() >= 0
    out.joint.backward()
    named = {"teacher": models.teacher, "student": models.student, "W_h": models.projections}
    for label, mod in named.items():
        grads = {n: p.grad for n, p in mod.named_parameters() if p.requires_grad}
        assert grads and all(g is not None for g in grads.values()), label
        assert sum(g.abs().sum().item() for g in grads.values()) > 0, label
    groups = models.param_groups(1e-4, 3e-4)  # method.student_lr
    assert [g["lr"] for g in groups] == [1e-4, 3e-4]
    assert {id(p) for p in groups[1]["params"]} == {
        id(p) for p in models.student.parameters() if p.requires_grad}
    assert sum(len(g["params"]) for g in groups) == len(models.parameters())
    # embeddings are frozen (official code): they neither train nor travel
    assert all(not p.requires_grad for n, p in models.student.named_parameters()
               if "embeddings" in n)
    # the one backward of `joint` gives each model the gradient of its own total (Eqs. 6-7)
    for which, mod in (("teacher", models.teacher), ("student", models.student)):
        params = [p for p in mod.parameters() if p.requires_grad]
        own = torch.autograd.grad(getattr(fedkd_losses(models, cfg.method, batch), which), params)
        for p, g in zip(params, own, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-7)


def test_hidden_loss_matches_configured_teacher_layer(tmp_path):
    # The student is the teacher's first two layers with W_h = I: matched to teacher
    # layers 1 and 2 its hidden states and attention maps equal the teacher's (loss 0);
    # the default pairs (teacher layers 2 and 4) differ.
    same = fedkd_config(tmp_path, "method={name: fedkd, layer_map: [1, 2]}")
    models, batch = _models_and_batch(same)
    models.teacher.eval()
    models.student.eval()
    assert fedkd_losses(models, same.method, batch).hidden.item() == pytest.approx(0, abs=1e-10)
    models, batch = _models_and_batch(fedkd_config(tmp_path))
    models.teacher.eval()
    models.student.eval()
    assert fedkd_losses(models, fedkd_config(tmp_path).method, batch).hidden.item() > 1e-3
    off = fedkd_config(tmp_path, "method={name: fedkd, hidden_loss: false, attention_loss: false}")
    models, batch = _models_and_batch(off)
    assert len(models.projections) == 0
    assert fedkd_losses(models, off.method, batch).hidden.item() == 0


def test_eq_5_wiring_by_hand(tmp_path):
    # One unpadded sentence: Eq. 5 is (sum_l MSE(H_t[m(l)], H_s[l] W_l) + sum_l
    # MSE(A_t[m(l)], A_s[l])) / (L_t^t + L_s^t), with m = (2, 4) and the task losses CE.
    cfg = fedkd_config(tmp_path)
    models = FedKDModels.build(cfg, 2)
    with torch.no_grad():
        for w in models.projections:
            w.weight.mul_(0.5)  # W_h != I
    batch = text_batches(models.tokenizer, [{"text": "you are all awful", "label": 1}], 1, 32,
                         None)[0]
    models.teacher.eval()
    models.student.eval()
    out = fedkd_losses(models, cfg.method, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        t = models.teacher(**inputs, output_hidden_states=True, output_attentions=True)
        s = models.student(**inputs, output_hidden_states=True, output_attentions=True)
        ce_t = torch.nn.functional.cross_entropy(t.logits, batch["labels"])
        ce_s = torch.nn.functional.cross_entropy(s.logits, batch["labels"])
        mse = sum(((t.hidden_states[m] - models.projections[i](s.hidden_states[i + 1])) ** 2)
                  .mean() + ((t.attentions[m - 1] - s.attentions[i]) ** 2).mean()
                  for i, m in enumerate((2, 4)))
    assert out.teacher_task.item() == pytest.approx(ce_t.item(), rel=1e-5)
    assert out.hidden.item() == pytest.approx((mse / (ce_t + ce_s)).item(), rel=1e-4)


def test_benchmark_fedkd_table_by_hand():
    bench = load_benchmark("svd_compression")
    g = torch.Generator().manual_seed(0)
    rank2 = torch.randn(20, 2, generator=g) @ torch.randn(2, 10, generator=g)
    update = {"w": rank2, "b": torch.ones(10)}
    records = [{"round": 1, "role": "upload", "T": 0.95, "update": update},
               {"round": 1, "role": "upload", "T": 0.95, "update": update},
               {"round": 1, "role": "download", "T": 0.95, "update": update}]
    rows = [{"round": 1, "participant": f"client_{c}", "split": "train", "step_seconds": 2.0}
            for c in (0, 1)]
    (line,) = bench.fedkd_table(records, rows)
    # dense 20 * 10 + 10 floats = 840 B; sent rank-2 factors (40 + 2 + 20) * 4 + 40 = 288 B
    assert line["upload_dense_mb"] == pytest.approx(840e-6)
    assert line["upload_mb"] == pytest.approx(288e-6) and line["download_mb"] == pytest.approx(288e-6)
    assert line["upload_ratio"] == pytest.approx(840 / 288)
    assert line["step_seconds"] == 2.0
    share = (line["upload_compress_s"] + line["download_reconstruct_s"]) / 2.0
    assert line["client_svd_share_of_step"] == pytest.approx(share)


def test_round_sends_svd_factors_and_keeps_clients_equal_to_the_server(tmp_path):
    cfg = fedkd_config(tmp_path, "rounds=4")
    server, clients = server_and_clients(cfg)
    initial = {k: v.clone() for k, v in server.global_state.items()}
    clients.start_round(1, evaluate=True)
    metrics = server.round(1, clients)
    T = threshold_schedule(0, 4)  # Eq. 9, round 1 of 4: T_start
    assert metrics["train/T"] == pytest.approx(0.95) == pytest.approx(T)
    assert clients.sent["train"][0]["T"] == pytest.approx(T)
    replies = clients.replies["train"]
    updates, weights = [], []
    for cid, reply in replies.items():
        comp = from_payload(reply["update"])
        assert set(comp) == set(initial)  # only the student's trainable weights travel
        factored = [c for c in comp.values() if c.is_factored]
        assert factored and all(not c.is_factored for k, c in comp.items()
                                if initial[k].dim() == 1)
        # the client kept exactly the smallest rank whose energy exceeds T (Eq. 8)
        ctx = client_ctx(cfg, cid, 2)
        teacher = ctx.load_state("teacher")
        assert teacher is not None and any("layer.3." in k for k in teacher)
        for c in factored:
            assert c.U.shape[1] == c.rank == c.Vh.shape[0] and c.rank < min(c.U.shape[0],
                                                                            c.Vh.shape[1])
        updates.append(decompress_state(comp))
        weights.append(reply["num_examples"])
        assert "test/f1" in clients.traffic.metrics[cid]  # the teacher was evaluated
    # server: weighted mean of the reconstructed updates, compressed again with T, applied
    mean = {k: sum(w * u[k].double() for w, u in zip(weights, updates, strict=True))
            / sum(weights) for k in initial}
    agg = decompress_state(from_payload(encode_update({k: v.float() for k, v in mean.items()}, T)))
    for key, value in server.global_state.items():
        torch.testing.assert_close(value, initial[key] + agg[key], rtol=1e-5, atol=1e-6)
    adopted = clients.sent["adopt"][0]["update"]
    for key, c in from_payload(adopted).items():
        if c.is_factored:
            s = torch.linalg.svdvals(mean[key].reshape(mean[key].shape[0], -1))
            assert c.rank == energy_rank(s, T)
    # every client holds the same global student as the server, at version 1
    for cid in clients.ids:
        saved = client_ctx(cfg, cid, 2).cached("global", 1)
        assert saved is not None and server.holdings.holds(cid, "global", 1)
        for key, value in saved.items():
            assert torch.equal(value, server.global_state[key]), key
    # the upload is smaller than the dense update
    assert metrics["train/upload_ratio"] > 1 and metrics["train/download_ratio"] > 1
    # resume: the checkpointed state restores the same global student and version
    again, _ = server_and_clients(cfg)
    again.load_state_dict(server.state_dict())
    assert again.version == 1
    assert all(torch.equal(again.global_state[k], v) for k, v in server.global_state.items())


def test_failed_client_is_resent_the_whole_student(tmp_path):
    cfg = fedkd_config(tmp_path, "rounds=2", "clients.min_replies=1", "eval.every=5")
    with client_faults("fedkd", "1:1"):  # client 1 fails in round 1
        rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    failed = [r for r in rows if r["participant"] == "client_1" and r.get("excluded")]
    assert [r["round"] for r in failed] == [1]
    server, _ = server_and_clients(cfg)
    files = sorted(cfg.run_dir.glob("checkpoints/*/server.safetensors"))
    server.load_state_dict(load_file(str(files[-1])))
    # round 2 sent client 1 the whole student; after its adopt call all agree at version 2
    assert server.version == 2
    held = json.loads(files[-1].with_name("holdings.json").read_text())
    assert held == {"0": {"global": "2"}, "1": {"global": "2"}}
    for cid in (0, 1):
        saved = client_ctx(cfg, cid, 3).cached("global", 2)
        assert saved is not None
        for key, value in saved.items():
            assert torch.equal(value, server.global_state[key]), (cid, key)
    test = [r for r in rows if r["participant"] == "server" and r["split"] == "test"]
    assert [r["round"] for r in test] == [0, 2]  # round 0 (eval.round0), then eval.every


@pytest.mark.slow  # FedKD's resume is checked by the conformance test
def test_resume_after_a_failed_round_is_exact(tmp_path):
    full = fedkd_config(tmp_path, "rounds=2", "eval.every=5", name="full")
    run_job(full, LocalTransport(default_state_root(full)), quiet=True)
    cfg = fedkd_config(tmp_path, "rounds=2", "eval.every=5", name="crashed")
    with client_faults("fedkd", "0:2,1:2"), pytest.raises(RoundError):  # both fail in round 2
        run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), resume=True, quiet=True)
    a = load_file(str(sorted(full.run_dir.glob("checkpoints/*/server.safetensors"))[-1]))
    b = load_file(str(sorted(cfg.run_dir.glob("checkpoints/*/server.safetensors"))[-1]))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["round"] for r in rows if r["participant"] == "server" and r["split"] == "train"] \
        == [1, 2]


def test_fedavg_encoder_is_exact_weighted_mean_at_student_size(tmp_path):
    cfg = fedkd_config(tmp_path, "method={name: fedavg_encoder, layers: 2}")
    server, clients = server_and_clients(cfg)
    initial = {k: v.clone() for k, v in server.global_state.items()}
    assert not any("layer.2." in k for k in initial)  # student size: 2 of 4 layers
    clients.start_round(1)
    server.round(1, clients)
    replies = clients.replies["train"]
    sizes = [r["num_examples"] for r in replies.values()]
    for key, value in server.global_state.items():
        mean = sum(n * decompress_state(from_payload(r["update"]))[key].double()
                   for n, r in zip(sizes, replies.values(), strict=True)) / sum(sizes)
        torch.testing.assert_close(value.double(), initial[key].double() + mean,
                                   rtol=1e-5, atol=1e-6)
    assert all(not c.is_factored for c in from_payload(next(iter(replies.values()))["update"])
               .values())  # uncompressed unless compress: true


def test_local_and_centralized_baselines_run(tmp_path):
    for method in ("standalone_encoder", "centralized_encoder"):
        cfg = fedkd_config(tmp_path, f"method={{name: {method}, layers: 2}}", name=method)
        rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
        tests = [r for r in rows if r["split"] == "test"]
        who = {"standalone_encoder": {"client_0", "client_1"}, "centralized_encoder": {"server"}}
        assert {r["participant"] for r in tests} == who[method]
        assert all(0 <= r["f1"] <= 1 and "precision" in r for r in tests)


@pytest.mark.slow
@needs_models("all-minilm-l6-v2")
def test_fedkd_round_on_real_minilm(tmp_path):
    cfg = fedkd_config(tmp_path, "clients.models=[{name: all-minilm-l6-v2}]",
                       "data.max_private_per_client=8", "eval.clients=false")
    server, clients = server_and_clients(cfg)
    assert sum(1 for k in server.global_state if k.endswith("attention.self.query.weight")) == 2
    clients.start_round(1)
    metrics = server.round(1, clients)
    assert metrics["train/upload_ratio"] > 1
    teacher = client_ctx(cfg, 0, 2).load_state("teacher")
    assert sum(1 for k in teacher if k.endswith("attention.self.query.weight")) == 6
    assert trainable_state(server.student).keys() == server.global_state.keys()
