"""FedCoLLM: mutual-KL gradients, (secure) adapter averaging, communication, runs."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from fedkt.evidence.paired_table import baseline_report
from fedkt.federated.payload import Payload, nbytes
from fedkt.methods import get_method
from fedkt.methods.fedavg.algorithm import average_client_adapters
from fedkt.methods.fedcollm.cotune import (
    CrossTokenizerKL,
    cotune_losses,
    kd_gradient_ratios,
    kd_mask,
    mutual_kl,
)
from fedkt.runtime.base import RuntimeClients, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import RunRecorder
from fedkt.tracking.folder import SERVER_STATE
from fedkt.train.lm import evaluate_lm, lm_batches, server_lm
from fedkt.train.losses import kl_div
from tests.conftest import run_data_of

torch.set_num_threads(1)

LLM = "server={name: tiny-llama, tiny: {hidden_size: 96, num_layers: 3}}"
LLM_OTHER_TOKENIZER = "server={name: tiny-gpt2, tiny: {hidden_size: 96}}"
DIRICHLET = ("clients.num_clients=3", "data.partition={scheme: dirichlet, alpha: 0.5}",
             "data.max_private_per_client=null")


class Recording(RuntimeClients):
    """RuntimeClients that keeps every reply the server received, per handler."""

    def call(self, handler, messages, *, evaluate=None):
        replies = super().call(handler, messages, evaluate=evaluate)
        self.calls = [*getattr(self, "calls", []), (handler, replies)]
        return replies


def fedcollm_config(make_config, *overrides, name="run"):
    return make_config(LLM, "data.split.public_fraction=0.2", "data.max_public=16",
                       "training.lora.target_modules=all-linear", *overrides,
                       method="fedcollm", name=name)


def _server(cfg):
    server = get_method(cfg.method.name).server(cfg, cfg.run_dir)
    server.setup()
    return server


def _clients(cfg, rnd=1):
    clients = Recording(cfg, LocalTransport(default_state_root(cfg)))
    clients.start_round(rnd)
    return clients


def _randomise(lm, seed):
    """Non-zero LoRA A and B, so every adapter tensor can receive a gradient."""
    gen = torch.Generator().manual_seed(seed)
    lm.reset({k: 0.05 * torch.randn(v.shape, generator=gen) for k, v in lm.initial.items()})


def _grads(loss, *models):
    params = [[p for p in m.parameters() if p.requires_grad] for m in models]
    flat = torch.autograd.grad(loss, [p for ps in params for p in ps], retain_graph=True,
                               allow_unused=True, materialize_grads=True)
    out, i = [], 0
    for ps in params:
        out.append(flat[i:i + len(ps)])
        i += len(ps)
    return out


# ----------------------------------------------------------------------- Eqs. 4-6


def _cotune_parts(cfg, server, seed=1):
    llm, slm = server.llm, server.slm
    _randomise(llm, seed)
    _randomise(slm, seed + 1)
    batch = lm_batches(cfg, slm.tokenizer, server.data().public[:8], seed=0, data=run_data_of(cfg))[0]
    llm.model.eval()
    slm.model.eval()  # no dropout: repeated forward passes see the same function
    return batch, cotune_losses(llm.model, slm.model, batch, batch, cfg.method)


def test_each_adapter_descends_only_its_own_loss(make_config):
    """Algorithm 1 lines 16-17: grad_omega of Eq. 6 is grad L^f, grad_theta is grad L^g."""
    cfg = fedcollm_config(make_config)
    server = _server(cfg)
    assert server.bridge is None, "same tokenizer: no alignment"
    assert cfg.method.cotune_gradients == "own"
    llm, slm = server.llm, server.slm
    batch, parts = _cotune_parts(cfg, server)
    lam = cfg.method.kd_weight
    mask = kd_mask(batch, "target")
    assert mask.sum() == (batch["labels"] != -100).sum()  # target positions, shifted by one
    # L^f and L^g written out by hand: CE plus lambda * KL(other, a constant || self).
    f_out, g_out = llm.model(**batch), slm.model(**batch)
    l_f = f_out.loss + lam * kl_div(g_out.logits.detach(), f_out.logits, 1.0, mask)
    l_g = g_out.loss + lam * kl_div(f_out.logits.detach(), g_out.logits, 1.0, mask)
    torch.testing.assert_close(parts.llm, l_f)
    torch.testing.assert_close(parts.slm, l_g)
    torch.testing.assert_close(parts.total, parts.llm + parts.slm)
    got_f, got_g = _grads(parts.total, llm.model, slm.model)
    want_f, _ = _grads(l_f, llm.model, slm.model)
    _, want_g = _grads(l_g, llm.model, slm.model)
    for got, want in [*zip(got_f, want_f, strict=True), *zip(got_g, want_g, strict=True)]:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)
    assert all(g.abs().sum() > 0 for g in got_f) and all(g.abs().sum() > 0 for g in got_g)
    # The logged diagnostic: the KD term's gradient norm over the task loss's, per adapter.
    ratios = kd_gradient_ratios(parts, [p for p in llm.model.parameters() if p.requires_grad],
                                [p for p in slm.model.parameters() if p.requires_grad])
    for name, kd, ft, model in (("llm", parts.kd_llm, parts.ft_llm, llm.model),
                                ("slm", parts.kd_slm, parts.ft_slm, slm.model)):
        (g_kd,) = _grads(lam * kd, model)
        (g_ft,) = _grads(ft, model)
        want = torch.sqrt(sum((g ** 2).sum() for g in g_kd)) / torch.sqrt(
            sum((g ** 2).sum() for g in g_ft))
        assert ratios[f"kd_grad_ratio_{name}"] == pytest.approx(float(want), rel=1e-4)
    # The KD terms are the dense KL on the response positions, each teaching its student.
    with torch.no_grad():
        f, g = f_out.logits, g_out.logits
    torch.testing.assert_close(parts.kd_slm, kl_div(f, g, 1.0, mask), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(parts.kd_llm, kl_div(g, f, 1.0, mask), rtol=1e-4, atol=1e-6)


def test_t_squared_scales_both_kd_terms_by_t_squared(make_config):
    """receiving.t_squared (an extension): L^f = L_FT^f + lambda T**2 KL_T(g || f), and the
    same for L^g; the KL terms themselves (as logged) are those at T."""
    parts = {}
    for t2 in (False, True):
        cfg = fedcollm_config(make_config, "method.temperature=2", "method.kd_weight=0.5",
                              f"method.receiving.t_squared={str(t2).lower()}", name=f"t{t2}")
        _, parts[t2] = _cotune_parts(cfg, _server(cfg))
    plain, squared = parts[False], parts[True]
    torch.testing.assert_close(squared.kd_llm, plain.kd_llm)
    torch.testing.assert_close(squared.kd_slm, plain.kd_slm)
    assert float(plain.kd_llm) > 0 and float(plain.kd_slm) > 0
    torch.testing.assert_close(squared.llm, squared.ft_llm + 0.5 * 4 * squared.kd_llm)
    torch.testing.assert_close(squared.slm, squared.ft_slm + 0.5 * 4 * squared.kd_slm)
    torch.testing.assert_close(plain.llm, plain.ft_llm + 0.5 * plain.kd_llm)


def test_joint_gradients_also_train_each_adapter_on_the_other_kd_term(make_config):
    """``cotune_gradients: joint`` (the former default) differs from the paper's update by
    exactly the other model's KD term: grad_omega = grad L^f + lambda grad_omega KL(f||g)."""
    cfg = fedcollm_config(make_config, "method={name: fedcollm, cotune_gradients: joint}")
    server = _server(cfg)
    llm, slm = server.llm, server.slm
    batch, parts = _cotune_parts(cfg, server)
    lam = cfg.method.kd_weight
    mask = kd_mask(batch, "target")
    f_out, g_out = llm.model(**batch), slm.model(**batch)
    l_f = f_out.loss + lam * kl_div(g_out.logits.detach(), f_out.logits, 1.0, mask)
    other = lam * kl_div(f_out.logits, g_out.logits.detach(), 1.0, mask)  # the SLM's term
    got_f, _ = _grads(parts.total, llm.model, slm.model)
    own_f, _ = _grads(l_f, llm.model, slm.model)
    extra_f, _ = _grads(other, llm.model, slm.model)
    for got, own, extra in zip(got_f, own_f, extra_f, strict=True):
        torch.testing.assert_close(got, own + extra, rtol=1e-4, atol=1e-7)
    # ... which is not zero: the joint variant is a different update.
    assert sum(e.norm() for e in extra_f) > 1e-3 * sum(o.norm() for o in own_f)
    # The KD terms' values are the same in both variants.
    own_cfg = fedcollm_config(make_config, name="own")
    _, own_parts = _cotune_parts(own_cfg, _server(own_cfg))
    torch.testing.assert_close(parts.kd_llm, own_parts.kd_llm)
    torch.testing.assert_close(parts.kd_slm, own_parts.kd_slm)


def test_cross_tokenizer_kl_is_aligned_top_k_and_reaches_both_models(make_config):
    cfg = fedcollm_config(make_config, LLM_OTHER_TOKENIZER, "method={name: fedcollm, top_k: 16}")
    server = _server(cfg)
    assert isinstance(server.bridge, CrossTokenizerKL)
    llm, slm = server.llm, server.slm
    _randomise(llm, 3)
    _randomise(slm, 4)
    llm.model.eval()
    slm.model.eval()
    records = server.data().public[:4]
    f_batch = lm_batches(cfg, llm.tokenizer, records, seed=0, data=run_data_of(cfg))[0]
    g_batch = lm_batches(cfg, slm.tokenizer, records, seed=0, data=run_data_of(cfg))[0]
    parts = cotune_losses(llm.model, slm.model, f_batch, g_batch, cfg.method, server.bridge)
    for term, student in ((parts.kd_slm, slm), (parts.kd_llm, llm)):
        assert torch.isfinite(term) and term.item() > 0
        g_llm, g_slm = _grads(term, llm.model, slm.model)
        # The paper's update: each aligned KD term reaches its student only.
        assert sum(g.abs().sum() for g in g_llm) > 0 if student is llm else all(
            g.abs().sum() == 0 for g in g_llm)
        assert sum(g.abs().sum() for g in g_slm) > 0 if student is slm else all(
            g.abs().sum() == 0 for g in g_slm)

    # With one tokenizer on both sides and K = |V| the aligned top-K KL is the exact KL.
    tok = slm.tokenizer
    bridge = CrossTokenizerKL(tok, tok, top_k=len(tok))
    with torch.no_grad():
        a = slm.model(**g_batch).logits
        b = a + torch.randn(a.shape, generator=torch.Generator().manual_seed(0))
    got = bridge.mutual_kl(a, b, g_batch, g_batch, "target", 2.0)
    want = mutual_kl(a, b, 2.0, kd_mask(g_batch, "target"))
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-4, atol=1e-5)
    # Across tokenizers it is the KL of the mapped, merged top-K distribution, both for
    # K*K below the vocabulary (pairwise merge) and above it (vocabulary buffer).
    with torch.no_grad():
        f = llm.model(**f_batch).logits
    for k in (8, 60):
        bridge = CrossTokenizerKL(llm.tokenizer, tok, top_k=k)
        g_from_f, f_from_g = bridge.f2g.align_batch(f_batch, g_batch)
        got = bridge.mutual_kl(f, a, f_batch, g_batch, "all", 1.5)
        f2g, g2f = (torch.from_numpy(b.vocab_map) for b in (bridge.f2g, bridge.g2f))
        want = (_reference_kl(f, a, g_from_f, f2g, kd_mask(g_batch, "all"), 1.5, k),
                _reference_kl(a, f, f_from_g, g2f, kd_mask(f_batch, "all"), 1.5, k))
        torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-4, atol=1e-5)
        assert all(x.item() > 0 for x in got)


def _reference_kl(t_logits, s_logits, pos, vocab_map, s_mask, temperature, k):
    """Position by position: KL(top-K of t scattered into s's vocabulary || softmax(s))."""
    values, ids = torch.topk(t_logits[..., :len(vocab_map)].float(), k)
    terms = []
    for b, j in zip(*torch.nonzero(s_mask & (pos >= 0), as_tuple=True), strict=True):
        p = torch.softmax(values[b, pos[b, j]] / temperature, -1).double()
        dense = torch.zeros(s_logits.shape[-1], dtype=torch.float64)
        dense.index_add_(0, vocab_map[ids[b, pos[b, j]]], p)
        log_q = torch.log_softmax(s_logits[b, j].double() / temperature, -1)
        keep = dense > 0
        terms.append((dense[keep] * (dense[keep].log() - log_q[keep])).sum())
    return torch.stack(terms).mean().float()


# --------------------------------------------------------------------- aggregation


def test_global_adapter_is_the_plain_mean_unless_weighted(make_config):
    """Algorithm 1 line 13: theta = (1/K) sum_k theta_k; ``weighted: true`` weights by n_k."""
    cfg = fedcollm_config(make_config, *DIRICHLET)
    assert cfg.method.weighted is False
    server = _server(cfg)
    clients = _clients(cfg)
    theta, metrics = average_client_adapters(server, clients, server.theta)
    replies = clients.calls[0][1]
    sizes = [r["num_examples"] for r in replies.values()]
    assert len(set(sizes)) > 1, "dirichlet partition should give unequal clients"
    for key, value in theta.items():
        expected = sum(r["adapter"][key].double() for r in replies.values()) / len(replies)
        torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-7)
    assert metrics["train/loss"] > 0
    cfg2 = fedcollm_config(make_config, *DIRICHLET, "method.weighted=true", name="weighted")
    server2, clients2 = _server(cfg2), _clients(cfg2)
    theta2, _ = average_client_adapters(server2, clients2, server2.theta)
    for key, value in theta2.items():
        expected = sum(n * r["adapter"][key].double() for n, r in
                       zip(sizes, replies.values(), strict=True)) / sum(sizes)
        torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-7)
    assert any(not torch.allclose(theta[k], theta2[k]) for k in theta)


def test_next_round_broadcasts_the_cotuned_adapter(make_config):
    """Step 5: round t+1 sends the co-tuned theta, not the plain average of round t."""
    cfg = fedcollm_config(make_config, "rounds=2")
    server = _server(cfg)
    first = _clients(cfg, 1)
    server.round(1, first)
    replies = first.calls[0][1]
    average = {k: sum(r["adapter"][k] for r in replies.values()) / len(replies)
               for k in server.theta}
    cotuned = {k: v.clone() for k, v in server.theta.items()}
    assert any(not torch.allclose(cotuned[k], average[k]) for k in cotuned)

    class Sent(Recording):
        def call(self, handler, messages, *, evaluate=None):
            self.sent = [*getattr(self, "sent", []), (handler, messages)]
            return super().call(handler, messages, evaluate=evaluate)

    second = Sent(cfg, LocalTransport(default_state_root(cfg)))
    second.start_round(2)
    server.round(2, second)
    handler, messages = second.sent[0]
    assert handler == "train"
    for msg in messages.values():
        got = msg.state("adapter", like=cotuned, source="server")
        for k, v in cotuned.items():
            torch.testing.assert_close(got[k], v)


def _received_tensors(clients):
    for handler, replies in clients.calls:
        for cid, reply in replies.items():
            for key, value in reply.items():
                items = value.items() if isinstance(value, dict) else [(None, value)]
                for sub, t in items:
                    if isinstance(t, torch.Tensor):
                        yield handler, cid, key, sub, t


def test_secure_aggregation_gives_the_plain_weighted_mean(make_config):
    """SecAgg+ (runtime/secagg.py) leaves FedCoLLM's step 3 unchanged up to quantisation."""
    plain_cfg = fedcollm_config(make_config, *DIRICHLET, "method.weighted=true", name="plain")
    plain_server, plain_clients = _server(plain_cfg), _clients(plain_cfg)
    theta_plain, _ = average_client_adapters(plain_server, plain_clients, plain_server.theta)
    cfg = fedcollm_config(make_config, *DIRICHLET, "method.weighted=true",
                          "secure_aggregation.enabled=true",
                          "secure_aggregation.max_weight=256", name="sec")
    server, clients = _server(cfg), _clients(cfg)
    theta, metrics = average_client_adapters(server, clients, server.theta)
    assert not hasattr(clients, "calls")  # no plain call: only SecAgg+ messages went out
    assert metrics["train/loss"] > 0
    # Quantisation step of SecAgg+: 2 * clipping_range / quantization_range per unit weight.
    step = 2 * 8.0 / 2**22 * 256 / min(r["num_examples"] for r in plain_clients.calls[0][1].values())
    for key, value in theta.items():
        assert value.dtype == theta_plain[key].dtype
        torch.testing.assert_close(value, theta_plain[key], rtol=0, atol=3 * step)


# ---------------------------------------------------------------- full runs, config


def test_run_ships_only_lora_adapters_and_both_models_learn(make_config):
    cfg = fedcollm_config(make_config, "rounds=2", "training.lr=5e-3",
                          "method={name: fedcollm, cotune_epochs: 2}")
    untouched = evaluate_lm(cfg, server_lm(cfg), _server(cfg).data().test, data=run_data_of(cfg))
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    server = _server(cfg)
    adapter_bytes = nbytes(Payload(adapter=server.theta))
    slm_params = sum(p.numel() for p in server.slm.model.parameters())
    lora_params = sum(v.numel() for v in server.theta.values())
    assert lora_params < 0.2 * slm_params
    train = [r for r in rows if r["participant"].startswith("client") and r["split"] == "train"]
    assert len(train) == 4
    for r in train:  # one adapter each way per round, plus a small envelope
        assert adapter_bytes <= r["bytes_sent"] < adapter_bytes + 8192
        assert adapter_bytes <= r["bytes_received"] < adapter_bytes + 8192
    tests = [r for r in rows if r["participant"] == "server" and r["split"] == "test"]
    slm_tests = [r for r in rows if r["participant"] == "global_slm" and r["split"] == "test"]
    assert {"accuracy", "loss"} <= set(tests[-1]) and {"accuracy", "loss"} <= set(slm_tests[-1])
    assert [r["round"] for r in tests] == [r["round"] for r in slm_tests] == [0, 1, 2]
    assert not any(k.startswith("slm_") for k in tests[-1])
    assert tests[-1]["loss"] < untouched["loss"]  # the LLM learnt on D_a
    server_train = [r for r in rows if r["participant"] == "server" and r["split"] == "train"]
    assert all(r["cotune_kd_slm"] > 0 and r["cotune_steps"] == 4 for r in server_train)
    for r in server_train:  # diagnostics: KD's gradient share, and how far theta moved
        assert r["cotune_kd_grad_ratio_llm"] > 0 and r["cotune_kd_grad_ratio_slm"] > 0
        assert r["theta_shift_local"] > 0 and r["theta_shift_cotune"] > 0
    for r in server_train:  # L^f pairs the LLM's CE with the LLM's own KD term
        lam = cfg.method.kd_weight
        assert r["cotune_llm"] == pytest.approx(r["cotune_ft_llm"] + lam * r["cotune_kd_llm"])
        assert r["cotune_slm"] == pytest.approx(r["cotune_ft_slm"] + lam * r["cotune_kd_slm"])
    # Resume: the final checkpoint restores the trained omega and theta, which score
    # exactly what the last round logged (a fresh server does not).
    rec = RunRecorder(cfg.run_dir, resume=True)
    assert rec.last_complete_round() == 2
    state = load_file(str(rec.checkpoint_dir(2) / SERVER_STATE))
    assert {k.split(".", 1)[0] for k in state} == {"llm", "slm"}
    restored = _server(cfg)
    initial = {"llm": dict(restored.omega), "slm": dict(restored.theta)}
    restored.load_state_dict(state)
    assert any(not torch.equal(restored.omega[k], initial["llm"][k]) for k in restored.omega)
    assert any(not torch.equal(restored.theta[k], initial["slm"][k]) for k in restored.theta)
    again = restored.evaluate(2)
    assert again["server"]["loss"] == pytest.approx(tests[-1]["loss"], rel=1e-5)
    assert again["global_slm"]["loss"] == pytest.approx(slm_tests[-1]["loss"], rel=1e-5)
    assert again["global_slm"]["accuracy"] == slm_tests[-1]["accuracy"]
    # fedkt report pairs each participant with its own round 0, the global SLM included.
    text = baseline_report([str(cfg.run_dir)], f"{cfg.run_dir}@0", "accuracy")
    assert "| global_slm | accuracy |" in text and "| server | accuracy |" in text


def test_config_errors_name_the_fix(make_config):
    with pytest.raises(ValueError, match="public_fraction"):
        _server(make_config(LLM, method="fedcollm"))
    with pytest.raises(ValueError, match="different"):
        _server(make_config("server={name: tiny-llama}", "data.split.public_fraction=0.2",
                            method="fedcollm", name="same"))
    with pytest.raises(ValueError, match="server LLM"):
        _server(make_config("data.split.public_fraction=0.2", method="fedcollm", name="none"))
