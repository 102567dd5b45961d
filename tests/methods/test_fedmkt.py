"""FedMKT: DualMinCE, top-K transport, KD gradients, alignment cache, runs (real tiny models)."""

from __future__ import annotations

import math

import pytest
import torch

from fedkt.alignment import TopKLogits
from fedkt.alignment import bridge as bridge_module
from fedkt.alignment.bridge import TokenBridge
from fedkt.alignment.knowledge import (
    PublicSet,
    knowledge_set,
    pack_topk,
    packed_entries,
    unpack_topk,
    vocab_size,
)
from fedkt.alignment.targets import Received, build_targets, kd_loss, to_receiver
from fedkt.config import ConfigError
from fedkt.config.method_settings import ReceivingOptions
from fedkt.federated.payload import Payload, PayloadError, dumps, loads
from fedkt.infra.precision import autocast
from fedkt.methods import get_method
from fedkt.methods.fedmkt.config import FedMKTConfig
from fedkt.methods.fedmkt.distill import distill, dual_min_ce
from fedkt.methods.fedmkt.knowledge import other_losses
from fedkt.runtime.base import RuntimeClients, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.train.lm import client_lm, lm_batches
from fedkt.train.optim import grad_norm
from tests.conftest import run_data_of

torch.set_num_threads(1)

LLM = "server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}"
HETERO = "clients.models=[{name: tiny-gpt2}, {name: tiny-qwen2}]"


def mkt_config(make_config, *overrides, method="fedmkt", name="run"):
    """2 clients with different tokenizers and architectures, a tiny-llama server."""
    return make_config(LLM, HETERO, "data.split={scheme: fedmkt, test_size: 16}",
                       "data.max_public=12", "data.max_private_per_client=16",
                       "training.lora.target_modules=all-linear", "method.top_k=8",
                       *overrides, method=method, name=name)


class Recording(RuntimeClients):
    """RuntimeClients that keeps every call: (handler, messages sent, replies received)."""

    def call(self, handler, messages, *, evaluate=None):
        replies = super().call(handler, messages, evaluate=evaluate)
        self.calls = [*getattr(self, "calls", []), (handler, messages, replies)]
        snapshot = {cid: dict(m) for cid, m in self.traffic.metrics.items()}
        self.metric_log = [*getattr(self, "metric_log", []), snapshot]  # after each call
        return replies


def _rows(rows, participant, split="train"):
    return [r for r in rows if r["participant"] == participant and r["split"] == split]


# ----------------------------------------------------------------------- Algorithm 2


def test_dual_min_ce_on_a_hand_made_case():
    own = torch.tensor([1.0, 2.0, 3.0, 0.5, 2.0, 1.0, 4.0])
    others = torch.tensor([
        [1.5, 1.0, 3.0, 0.4, math.inf, 1.0, 2.0],
        [0.9, 1.5, 2.9, 0.6, math.nan, 1.2, 2.0],
    ])
    got = dual_min_ce(own, others)
    # 0: client 1 is best (0.9 < 1.0); 1: client 0 (1.0 < 2.0); 2: client 1 (2.9 < 3.0);
    # 3: client 0 (0.4 < 0.5); 4: nothing sent -> own; 5: tie with own -> own (strict);
    # 6: tie between clients -> the lower index.
    assert got.tolist() == [1, 0, 1, 0, -1, -1, 0]
    # A better own loss keeps the own knowledge everywhere; no other model: own everywhere.
    assert dual_min_ce(torch.zeros(7), others).tolist() == [-1] * 7
    assert dual_min_ce(own, torch.zeros(0, 7)).tolist() == [-1] * 7
    with pytest.raises(ValueError, match="other_losses"):
        dual_min_ce(own, torch.zeros(2, 6))


def _topk(values, ids, lengths, losses, vocab=10):
    n = len(lengths)
    return TopKLogits(sample_ids=torch.arange(n), values=torch.tensor(values, dtype=torch.float16),
                      indices=torch.tensor(ids, dtype=torch.int32),
                      lengths=torch.tensor(lengths, dtype=torch.int32), vocab_size=vocab,
                      losses=torch.tensor(losses, dtype=torch.float32))


def _select(own, others):
    """FedMKT's selection (Algorithm 2) for build_targets, as its server makes it."""
    return dual_min_ce(own.losses, other_losses(others, own))


def _targets(own, other, omask, public, **kw):
    received = [Received.projected(other, omask)]
    t = build_targets(own, received, public, _select(own, received), **kw)
    ids, vals, mask = t.batch(torch.arange(len(public)), own.values.shape[1])
    return t, ids, vals, mask


def test_build_targets_algorithm_2_and_appendix_b_3d():
    # 2 samples, 3 positions, K = 2.  Own knowledge: ids 1, 2 everywhere.
    own = _topk([[[1, 0]] * 3] * 2, [[[1, 2]] * 3] * 2, [3, 2], [1.0, 1.0])
    # The other model beats own on sample 0 only; its position 1 has no alignment.
    other = _topk([[[5, 4]] * 3] * 2, [[[7, 8]] * 3] * 2, [3, 2], [0.5, 3.0])
    omask = torch.tensor([[True, False, True], [True, True, False]])
    public = PublicSet([{"input_ids": [1, 6, 3]}, {"input_ids": [1, 2]}], 0)
    # Default (the paper): sample 1 is not in S~ (Algorithm 2, line 10); sample 0's
    # unaligned position 1 gets a one-hot target on its ground-truth next token (3).
    t, ids, vals, mask = _targets(own, other, omask, public)
    assert t.selection.tolist() == [0, -1]
    assert t.fraction_from_others() == 0.5
    assert mask.tolist() == [[True, True, True], [False, False, False]]
    assert ids[0, :, 0].tolist() == [7, 3, 7]
    assert vals[0, 0].tolist() == [5, 4]
    assert ids[0, 1].tolist() == [3, 0] and vals[0, 1, 0] == 0  # one-hot: one live slot
    assert float(torch.softmax(vals[0, 1].float(), -1)[0]) == 1.0
    # Options: the learner's own top-K where unaligned; FATE-LLM's fallback to own.
    _, ids, _, mask = _targets(own, other, omask, public, unaligned="own")
    assert ids[0, :, 0].tolist() == [7, 1, 7] and mask[0].tolist() == [True] * 3
    _, ids, _, mask = _targets(own, other, omask, public, unaligned="skip")
    assert mask[0].tolist() == [True, False, True]
    _, ids, _, mask = _targets(own, other, omask, public, fallback_to_own=True, unaligned="own")
    assert mask.tolist() == [[True, True, True], [True, True, False]]  # 2nd: length 2
    assert ids[1, :2, 0].tolist() == [1, 1]
    with pytest.raises(ValueError, match="unaligned"):
        build_targets(own, [], public, _select(own, []), unaligned="zero")


def test_teacher_top1_agreement_diagnostic():
    # Sample 0 takes the other model's logits at positions 0-1 (position 2 is the last one:
    # it predicts nothing); sample 1 keeps its own (not in S~) and does not count.
    own = _topk([[[1, 0]] * 3] * 2, [[[1, 2]] * 3] * 2, [3, 2], [1.0, 1.0])
    other = _topk([[[5, 4], [4, 5], [5, 4]], [[5, 4]] * 3],
                  [[[6, 8], [3, 8], [7, 8]], [[2, 8]] * 3], [3, 2], [0.5, 3.0])
    omask = torch.tensor([[True, True, False], [True, True, False]])
    public = PublicSet([{"input_ids": [1, 6, 3], "labels": [-100, -100, 3]},
                            {"input_ids": [1, 2], "labels": [-100, 2]}], 0)
    t, *_ = _targets(own, other, omask, public)
    # Position 0: top-1 6 = next token 6 (a prompt token); position 1: the top-1 is id 8
    # by value (5 > 4), not slot 0's id 3, and the next token (3, a target) is missed.
    assert t.diagnostics() == {"kd_teacher_top1": 0.5, "kd_teacher_top1_target": 0.0}
    assert t.counts["teacher"] == 2 and t.counts["one_hot"] == 0


def test_fedmkt_config_defaults_follow_the_paper():
    cfg = FedMKTConfig()
    assert cfg.fallback_to_own is False and cfg.unaligned == "one_hot" and cfg.ft_weight == 0.9


# ----------------------------------------------------------------------- transport


def test_knowledge_losses_take_a_few_rows_at_a_time_and_are_the_same_to_the_bit(
        make_config, monkeypatch):
    """The per-sample losses of a knowledge set are computed on chunks of rows (a whole
    batch of a 152k-token vocabulary took 12-15 GB), with each row's loss unchanged."""
    from fedkt.alignment import knowledge as knowledge_module

    cfg = mkt_config(make_config)
    lm = client_lm(cfg, 0)
    server = get_method("fedmkt").server(cfg, cfg.run_dir)
    public = PublicSet.build(cfg, lm.tokenizer, server.data().public, data=run_data_of(cfg))
    widths: list[int] = []
    rows_losses = knowledge_module._rows_losses

    def spy(logits, labels, reduction):
        widths.append(logits.shape[0])
        return rows_losses(logits, labels, reduction)

    monkeypatch.setattr(knowledge_module, "_rows_losses", spy)
    whole = knowledge_set(lm, public, 8, batch_size=8, reduction="sum")
    assert max(widths) == 8
    widths.clear()
    row = max(public.lengths) * vocab_size(lm.tokenizer)  # at least one row's logits
    monkeypatch.setattr(knowledge_module, "LOSS_CHUNK_ELEMENTS", 2 * row + 1)
    chunked = knowledge_set(lm, public, 8, batch_size=8, reduction="sum")
    assert 1 <= max(widths) <= 2 and len(widths) > len(public) // 8
    assert torch.equal(whole.losses, chunked.losses)
    assert torch.equal(whole.values, chunked.values)


def test_topk_travels_packed_at_six_bytes_an_entry_and_is_validated(make_config):
    cfg = mkt_config(make_config)
    lm = client_lm(cfg, 0)
    server = get_method("fedmkt").server(cfg, cfg.run_dir)
    public = PublicSet.build(cfg, lm.tokenizer, server.data().public, data=run_data_of(cfg))
    vocab = vocab_size(lm.tokenizer)
    s = knowledge_set(lm, public, 8, batch_size=8)
    s.validate(vocab, 8, "client 0")
    assert s.lengths.tolist() == public.lengths and torch.isfinite(s.losses).all()
    packed = pack_topk(s)
    entries, tensor_bytes = packed_entries(packed)
    assert entries == sum(public.lengths) * 8  # no padding travels
    assert tensor_bytes / entries == 6
    wire = dumps(Payload(topk=packed, vocab_size=vocab, k=8))
    # Besides 6 bytes an entry: 16 per sample (id, length, loss) and one small header.
    assert 0 < len(wire) - tensor_bytes - 16 * len(public) < 512
    back = unpack_topk(loads(wire).state("topk"), vocab, 8, "client 0")
    valid = torch.arange(s.values.shape[1])[None, :] < s.lengths[:, None]
    assert torch.equal(back.values[valid], s.values[valid])
    assert torch.equal(back.indices[valid], s.indices[valid])
    assert torch.equal(back.losses, s.losses)

    def corrupt(**change):
        return {**packed, **change}

    bad_id = packed["indices"].clone()
    bad_id[3, 1] = vocab
    nan = packed["values"].clone()
    nan[0, 0] = float("nan")
    cases = {
        "indices": corrupt(indices=bad_id),
        "values": corrupt(values=nan),
        "'values' has shape": corrupt(values=packed["values"][:, :4]),
        "dtype": corrupt(values=packed["values"].float()),
        "'losses'": corrupt(losses=packed["losses"][:-1]),
    }
    for what, bad in cases.items():
        with pytest.raises(PayloadError, match=f"client 0.*{what}"):
            unpack_topk(bad, vocab, 8, "client 0")
    with pytest.raises(PayloadError, match="K"):
        unpack_topk(packed, vocab, 4, "client 0")
    # Lengths that do not match the public set tokenized with the sender's tokenizer
    # (two samples of different lengths swapped: the packed shapes still agree).
    other = client_lm(cfg, 1).tokenizer
    receiver = PublicSet.build(cfg, other, server.data().public, data=run_data_of(cfg))
    lengths = packed["lengths"].clone()
    j = int((lengths != lengths[0]).nonzero()[0, 0])
    lengths[0], lengths[j] = lengths[j].clone(), lengths[0].clone()
    swapped = unpack_topk(corrupt(lengths=lengths), vocab, 8, "client 0")
    with pytest.raises(PayloadError, match="client 0.*'lengths'.*public sample 0"):
        to_receiver(swapped, lm.tokenizer, public, other, receiver, "client 0")
    ok = to_receiver(back, lm.tokenizer, public, other, receiver, "client 0")
    assert ok.losses.tolist() == back.losses.tolist() and ok.aligns is not None
    _, _, pmask = ok.rows(torch.arange(len(receiver)), max(receiver.lengths))
    width = torch.tensor(receiver.lengths)[:, None]
    assert not pmask[torch.arange(pmask.shape[1])[None, :] >= width].any()


# ----------------------------------------------------------------------- alignment + KD


def test_alignment_is_cached_and_kd_gradients_reach_the_lora_weights(make_config, monkeypatch,
                                                                      tmp_path):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path / "cache"))
    bridge_module._ALIGN_MEMORY.clear()
    cfg = mkt_config(make_config, "method.ft_weight=0.0")
    server = get_method("fedmkt").server(cfg, cfg.run_dir)
    server.setup()
    client = client_lm(cfg, 0)  # tiny-gpt2: another architecture and tokenizer
    records = server.data().public
    c_pub = PublicSet.build(cfg, client.tokenizer, records, data=run_data_of(cfg))
    s_k = knowledge_set(client, c_pub, 8, batch_size=8)
    aligned = to_receiver(s_k, client.tokenizer, c_pub, server.llm.tokenizer,
                              server.public, "client 0")
    proj_ids, _, mask = aligned.rows(torch.arange(len(server.public)),
                                     max(server.public.lengths))
    # Computed once per (public set, tokenizer pair): in memory and on disk.
    files = list((tmp_path / "cache" / "alignments").glob("fedmkt-*.npz"))
    assert len(files) == 1 and len(bridge_module._ALIGN_MEMORY) == 1
    stamp = files[0].stat().st_mtime_ns
    first = TokenBridge(client.tokenizer, server.llm.tokenizer).align_corpus(c_pub, server.public)
    bridge_module._ALIGN_MEMORY.clear()
    again = TokenBridge(client.tokenizer, server.llm.tokenizer).align_corpus(c_pub, server.public)
    assert files[0].stat().st_mtime_ns == stamp  # read back, not recomputed
    assert all((a.logit_map == b.logit_map).all() for a, b in zip(first, again, strict=True))
    assert 0.5 < mask[:, :-1].float().mean() < 1.0  # most positions aligned, not all
    assert int(proj_ids.max()) < vocab_size(server.llm.tokenizer)

    # The client's logits win every sample where its loss is lower: make it so.
    own = server.own_knowledge()
    aligned.losses = own.losses - 1.0
    targets = build_targets(own, [aligned], server.public, _select(own, [aligned]))
    assert targets.fraction_from_others() == 1.0
    llm = server.llm
    gen = torch.Generator().manual_seed(0)
    llm.reset({k: 0.05 * torch.randn(v.shape, generator=gen) for k, v in llm.initial.items()})
    batch = lm_batches(cfg, llm.tokenizer, records[:8], seed=0, data=run_data_of(cfg))[0]
    llm.model.train()
    out = llm.model(**batch)
    kd = kd_loss(targets, out, batch, temperature=1.0, positions="all")
    params = [p for p in llm.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(kd, params)
    assert len(params) > 0 and all(g.abs().sum() > 0 for g in grads)
    # The logged KD share: ||grad (1 - lam) L_KD|| / ||grad lam L_FT|| on the first batch,
    # as a hand computation on the same batch, dropout draw and precision gives it.
    lam_cfg = cfg.model_copy(update={"method": cfg.method.model_copy(update={"ft_weight": 0.7})})
    first = lm_batches(lam_cfg, llm.tokenizer, records, seed=5, data=run_data_of(lam_cfg))[0]
    torch.manual_seed(5)
    with autocast(lam_cfg.training, "cpu"):
        out = llm.model(**first)
        kd_part = 0.3 * kd_loss(targets, out, first, temperature=1.0, positions="all")
        ft_part = 0.7 * out.loss.float()
    want = grad_norm(kd_part, params) / grad_norm(ft_part, params)
    start = llm.trainable()
    got = distill(lam_cfg, llm, records, targets, epochs=1, lr=1e-2, seed=5, desc="kd", data=run_data_of(lam_cfg))
    assert got["kd_grad_ratio"] == pytest.approx(want, rel=1e-3) and want > 0
    lam1 = cfg.model_copy(update={"method": cfg.method.model_copy(update={"ft_weight": 1.0})})
    assert distill(lam1, llm.reset(start), records, targets, epochs=1, lr=1e-2, seed=5,
                       desc="kd", data=run_data_of(lam1))["kd_grad_ratio"] == 0.0  # the control: no KD gradient
    # receiving.t_squared (an extension): at T = 2, L_KD and so its gradient are 4x
    hot = [lam_cfg.model_copy(update={"method": lam_cfg.method.model_copy(update={
        "temperature": 2.0, "receiving": ReceivingOptions(t_squared=t2)})}) for t2 in (0, 1)]
    plain, squared = (distill(c, llm.reset(start), records, targets, epochs=1, lr=1e-2, seed=5,
                              desc="kd", data=run_data_of(c))["kd_grad_ratio"] for c in hot)
    assert squared == pytest.approx(4 * plain, rel=1e-5) and plain > 0
    assert 0.0 <= got["kd_teacher_top1"] <= 1.0
    llm.reset(start)
    # lam = 0: training on L_KD alone moves the LLM towards the client's distribution.
    before = float(kd.detach())
    distill(cfg, llm, records, targets, epochs=3, lr=1e-2, seed=0, desc="kd", data=run_data_of(cfg))
    llm.model.eval()
    with torch.no_grad():
        after = float(kd_loss(targets, llm.model(**batch), batch, temperature=1.0,
                                  positions="all"))
    assert after < before - 0.05


# ----------------------------------------------------------------------- runs


def test_fedmkt_hetero_rounds_transfer_both_ways(make_config):
    cfg = mkt_config(make_config, "rounds=2")
    server = get_method("fedmkt").server(cfg, cfg.run_dir)
    server.setup()
    start = {k: v.clone() for k, v in server.adapter.items()}
    clients = Recording(cfg, LocalTransport(default_state_root(cfg)))
    clients.start_round(1, evaluate=True)
    metrics = server.round(1, clients)
    (h1, _, up), (h2, sent, _) = clients.calls
    assert (h1, h2) == ("train_and_share", "distill")
    # Uplink: each client's S_k in its own token space (different vocabularies).
    vocabs = {c: r["vocab_size"] for c, r in up.items()}
    assert vocabs[0] != vocabs[1]
    assert metrics["train/topk_bytes_per_entry"] == 6.0
    # the server row's loss is the clients' mean of the loss they report once, among their
    # metrics (no reply field repeats it); the LLM's own objective (L2) has its key
    assert not any("train_loss" in r or "kd_loss" in r for r in up.values())
    assert metrics["train/loss"] == pytest.approx(
        sum(r["metrics"]["train/loss"] for r in up.values()) / len(up))
    assert metrics["train/server_loss"] > 0 and metrics["train/server_loss"] != metrics["train/loss"]
    assert metrics["train/topk_entries"] == sum(
        r["topk"]["values"].numel() for r in up.values())
    assert 0.0 <= metrics["train/kd_from_clients"] <= 1.0
    assert metrics["train/kd_grad_ratio"] > 0 and 0 <= metrics["train/kd_teacher_top1"] <= 1
    assert any(not torch.equal(start[k], server.adapter[k]) for k in start)  # step 5
    root = default_state_root(cfg)
    for cid in (0, 1):
        names = {p.name.split(".")[0] for p in (root / f"client_{cid}").iterdir()}
        assert names == {"adapter", "own_topk", "s0"}
    assert set(clients.traffic.metrics[0]) >= {"train/kd_loss", "train/kd_from_server",
                                               "test/accuracy"}
    # Downlink: the same S_0 (the LLM's tokens) to both clients, after the LLM trained.
    assert torch.equal(sent[0]["s0"]["indices"], sent[1]["s0"]["indices"])
    assert sent[0]["vocab_size"] == vocab_size(server.llm.tokenizer)
    assert torch.equal(sent[0]["s0"]["losses"], server.own_knowledge().losses)

    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    for cid in (0, 1):
        train = _rows(rows, f"client_{cid}")
        assert len(train) == 2
        # The run's accounting: what the client sent is 6 bytes per top-K entry it shared
        # plus 16 per sample and two messages' headers and metrics.
        extra = [r["bytes_sent"] - 6 * r["topk_entries"] - 16 * 12 for r in train]
        assert all(0 < e < 4096 for e in extra), extra
        assert all(r["topk_bytes_per_entry"] == 6.0 for r in train)
        assert len(_rows(rows, f"client_{cid}", "test")) == 3  # rounds 0 (eval.round0), 1 and 2
    assert len(_rows(rows, "server", "test")) == 3


def test_llm2slm_keeps_the_llm_frozen_and_sends_s0_once(make_config):
    cfg = mkt_config(make_config, "rounds=2", method="llm2slm")
    assert cfg.method.llm_training is False
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    server = _rows(rows, "server", "test")
    assert server[0]["loss"] == server[1]["loss"]  # the LLM never trains
    for cid in (0, 1):
        r1, r2 = _rows(rows, f"client_{cid}")
        assert "topk_entries" not in r1  # nothing shared upward
        assert r1["bytes_sent"] < 5_000
        assert r2["bytes_received"] < r1["bytes_received"] / 5  # S_0 kept on the client
        assert r2["kd_loss"] > 0
    # The frozen LLM's adapter in the checkpoint is the initial one.
    state = get_method("llm2slm").server(cfg, cfg.run_dir)
    state.setup()
    from safetensors.torch import load_file

    saved = load_file(str(cfg.run_dir / "checkpoints" / "round_0002" / "server.safetensors"))
    assert all(torch.equal(saved[f"llm.{k}"], v) for k, v in state.adapter.items())


def test_homogeneous_post_fedavg_evaluates_the_averaged_adapter_and_lr_per_model(
        make_config, monkeypatch):
    import fedkt.train.lm as T

    seen: list[float] = []
    real = T.make_optimizer

    def spy(params, tcfg, total, lr=None):
        seen.append(lr or tcfg.lr)
        return real(params, tcfg, total, lr=lr)

    monkeypatch.setattr(T, "make_optimizer", spy)
    cfg = mkt_config(make_config, "clients.models=[{name: tiny-gpt2, lr: 0.005}]",
                     "server.lr=0.001", "method.post_fedavg=true", "method.client_kd_epochs=0.5")
    assert cfg.training.lr == 0.002
    server = get_method("fedmkt").server(cfg, cfg.run_dir)
    server.setup()
    clients = Recording(cfg, LocalTransport(default_state_root(cfg)))
    clients.start_round(1, evaluate=True)
    server.round(1, clients)
    # D.1: the LLM trains at server.lr, each SLM (private data and KD) at its own lr.
    assert sorted(set(seen)) == [0.001, 0.005] and len(seen) == 5
    (h1, _, _), (h2, _, distilled), (h3, sent, _) = clients.calls
    assert (h1, h2, h3) == ("train_and_share", "distill", "adopt")
    adapters = [r["adapter"] for r in distilled.values()]
    assert any(not torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    for k, v in server.global_adapter.items():  # equal sizes: the plain mean
        torch.testing.assert_close(v, (adapters[0][k] + adapters[1][k]) / 2)
    # Test metrics: measured after the averaging, on the averaged adapter (not before).
    after_distill, after_adopt = clients.metric_log[1], clients.metric_log[2]
    assert "train/kd_loss" in after_distill[0]
    assert not any(k.startswith("test/") for m in after_distill.values() for k in m)
    assert all(torch.equal(sent[c]["adapter"][k], server.global_adapter[k])
               for c in (0, 1) for k in server.global_adapter)
    from fedkt.train.lm import evaluate_lm

    want = evaluate_lm(cfg, client_lm(cfg, 0).reset(server.global_adapter),
                            server.data().test, data=run_data_of(cfg))["loss"]
    assert [after_adopt[c]["test/loss"] for c in (0, 1)] == pytest.approx([want] * 2)
    # Resume: the server's state brings back the LLM adapter and the global SLM adapter.
    again = get_method("fedmkt").server(cfg, cfg.run_dir)
    again.setup()
    again.load_state_dict(server.state_dict())
    assert all(torch.equal(again.adapter[k], v) for k, v in server.adapter.items())
    assert all(torch.equal(again.global_adapter[k], v) for k, v in server.global_adapter.items())


def test_config_checks(make_config):
    bad = mkt_config(make_config, "method.post_fedavg=true", name="bad")
    with pytest.raises(ConfigError, match="post_fedavg"):
        get_method("fedmkt").server(bad, bad.run_dir).setup()
    no_public = make_config(LLM, HETERO, method="fedmkt", name="nopub")
    with pytest.raises(ConfigError, match="public"):
        get_method("fedmkt").server(no_public, no_public.run_dir).setup()
    with pytest.raises(ConfigError, match=r"server_lr.*server\.lr"):
        mkt_config(make_config, "method.server_lr=0.1", name="moved")
    with pytest.raises(ConfigError, match=r"server\.lr"):
        mkt_config(make_config, "server.lr=0", name="zero")
    with pytest.raises(ConfigError, match=r"clients\.models\.1\.lr: method 'fedcollm'.*"
                                          r"\(set: clients\.models\[1\]\.lr\)"):
        make_config(LLM, "clients.models=[{name: tiny-gpt2}, {name: tiny-qwen2, lr: 0.1}]",
                    method="fedcollm", name="ignored")


@pytest.mark.slow  # FedMKT's and LLM2SLM's resume are checked by the conformance test
def test_resume_after_a_round_gives_the_same_numbers(make_config):
    full = mkt_config(make_config, "rounds=2", "clients.models=[{name: tiny-opt}, "
                      "{name: tiny-bloom}]", name="full")
    rows = run_job(full, LocalTransport(default_state_root(full)), quiet=True)
    cut = mkt_config(make_config, "rounds=1", "clients.models=[{name: tiny-opt}, "
                     "{name: tiny-bloom}]", name="cut")
    run_job(cut, LocalTransport(default_state_root(cut)), quiet=True)
    resumed_cfg = cut.model_copy(update={"rounds": 2})
    resumed = run_job(resumed_cfg, LocalTransport(default_state_root(cut)), resume=True,
                      quiet=True)

    def last(rs):
        # the server's train row: the clients' mean loss and the LLM's own (L2)
        return {(r["participant"], r["split"]): (r.get("loss"), r.get("server_loss"))
                for r in rs if r["round"] == 2}

    assert last(resumed) == last(rows) and len(last(rows)) == 6
    assert last(rows)[("server", "train")][1] is not None


def test_one_to_one_keeps_the_five_part_split(make_config):
    """D.2 / Table 1: one public part and one private part of a five-way split, for the
    single client (clients.participants: [k] with num_clients: 4), as one_to_one.yaml."""
    from fedkt.config import load_config
    from fedkt.configs.catalog import resolve_config
    from fedkt.data.splits import run_data

    shipped = load_config(resolve_config("fedmkt/one_to_one"))
    assert shipped.clients.num_clients == 4 and shipped.client_ids() == [0]
    assert shipped.data.split.scheme == "fedmkt"
    fd = run_data(shipped.data, 4, shipped.seed)
    sizes = [len(fd.public)] + [len(p) for p in fd.private]
    assert max(sizes) - min(sizes) <= 1  # five equal parts, one of them public

    cfg = mkt_config(make_config, "clients.num_clients=4", "clients.participants=[2]",
                     "clients.models=[{name: tiny-gpt2}]")
    server = get_method("fedmkt").server(cfg, cfg.run_dir)
    server.setup()
    clients = Recording(cfg, LocalTransport(default_state_root(cfg)))
    clients.start_round(1)
    metrics = server.round(1, clients)
    assert [(h, sorted(sent)) for h, sent, _ in clients.calls] == [
        ("train_and_share", [2]), ("distill", [2])]
    assert metrics["train/rejected_clients"] == 0
    # Client 2 trains on the same private part as in the four-client run.
    four = run_data(cfg.data, 4, cfg.seed)
    assert server.data().private[2] == four.private[2] and server.data().public == four.public
