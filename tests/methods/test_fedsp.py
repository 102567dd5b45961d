"""FedSP (Dong et al., EMNLP Findings 2023): auxiliary model, prompts, phases, payloads."""

from __future__ import annotations

import copy

import pytest
import torch

from fedkt.config import ModelConfig, TrainingConfig, apply_overrides, parse_config
from fedkt.federated.payload import loads
from fedkt.methods import get_method
from fedkt.methods.fedsp.training import (
    align_auxiliary,
    align_params,
    capture_local_knowledge,
    get_prompts,
    prompt_param,
    set_prompts,
)
from fedkt.models.adapters import apply_peft, text_prefix
from fedkt.models.auxiliary import (
    VirtualLayer,
    aux_param_groups,
    aux_state,
    build_auxiliary,
    config_dict,
    cut_state,
    layer_list_path,
    make_spec,
    prompts_for_aux,
    prompts_into_llm,
)
from fedkt.models.causal_lm import load_causal_lm
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.train.lm import LM
from tests.conftest import needs_models, run_data_of
from tests.support.fault_injection import client_faults

torch.set_num_threads(1)
PREFIX = TrainingConfig(peft="prefix", prefix_tokens=4)
TINY = {name: {"num_layers": 4} for name in ("tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-opt")}


def fedsp_config(run_dir, *overrides: str, method: str = "fedsp"):
    extra = {"kd_steps": 8, "kd_lr": 5e-3, "align_steps": 2, "align_lr": 5e-3, "kd_cache": False}
    data = {
        "name": "fedsp-test", "seed": 0, "rounds": 2, "output_dir": str(run_dir),
        "method": {"name": method, "prompt_steps": 2, "prompt_lr": 1e-2,
                   "server_prompt_steps": 2, "prompt_init": "text",
                   **(extra if method != "fedprompt" else {})},
        "server": {"name": "tiny-llama", "tiny": TINY["tiny-llama"]},
        "clients": {"num_clients": 2},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "holdout", "test_size": 16, "public_fraction": 0.2},
                 "max_private_per_client": 16, "max_public": 16, "max_length": 48},
        "training": {"lr": 5e-3, "batch_size": 8, "prefix_tokens": 4},
        "runtime": {"torch_threads": 1},
        "eval": {"batch_size": 16, "clients": False, "plots": False},
    }
    return parse_config(apply_overrides(data, list(overrides)), "fedsp test config")


def llm(name: str = "tiny-llama"):
    model, tok = load_causal_lm(ModelConfig(name=name, tiny=TINY[name]), seed=0)
    return model, tok


def aux_of(model, n=1, position="bot", shared=True):
    spec = make_spec(model.config.num_hidden_layers, n, position, shared)
    return build_auxiliary(config_dict(model), cut_state(model, spec), spec), spec


def ids(*rows):
    x = torch.tensor(rows)
    return {"input_ids": x, "attention_mask": torch.ones_like(x)}


class Capturing(LocalTransport):
    """LocalTransport that keeps every request it delivered (parsed)."""

    def __init__(self, root):
        super().__init__(root)
        self.requests: list[dict] = []

    def exchange(self, requests, timeout):
        self.requests.append({cid: loads(b) for cid, b in requests.items()})
        return super().exchange(requests, timeout)


# --------------------------------------------------------------------------- the model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_auxiliary_is_a_strict_much_smaller_subset_of_the_llm(name):
    model, _ = llm(name)
    aux, spec = aux_of(model, 1, "mid")
    assert spec.source_layers == (1,) and spec.depth == 4 and spec.mapping == (0, 0, 0, 0)
    llm_state = model.state_dict()
    state = aux_state(aux)
    path = layer_list_path(model)
    for key, value in state.items():  # every weight is the LLM's own (layer 0 <- LLM layer 1)
        src = key.replace(f"{path}.0.", f"{path}.1.")
        assert torch.equal(value, llm_state[src]), key
    n_aux = sum(p.numel() for p in aux.parameters())
    n_llm = sum(p.numel() for p in model.parameters())
    layer = sum(p.numel() for p in model.get_submodule(path)[0].parameters())
    assert n_aux == n_llm - 3 * layer  # 3 of 4 layers gone, nothing added
    print(f"{name}: auxiliary model {n_aux:,} of the LLM's {n_llm:,} parameters")
    virtual = aux.get_submodule(path)
    assert len(virtual) == 4 and all(isinstance(v, VirtualLayer) for v in virtual)
    assert len({id(v.layer) for v in virtual}) == 1  # one real layer, shared 4 times
    assert aux.config.num_hidden_layers == 4


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-opt"])
def test_forward_runs_all_virtual_layers_each_with_its_own_prefix(name):
    model, _ = llm(name)
    aux, spec = aux_of(model, 1, "top")
    paux = apply_peft(aux, PREFIX, seed=1)
    pllm = apply_peft(copy.deepcopy(model), PREFIX, seed=1)
    assert prompt_param(paux).shape == prompt_param(pllm).shape  # L prefixes, as the LLM's
    real = aux.get_submodule(layer_list_path(aux))[0].layer
    seen = []
    attn = next(m for m in real.modules() if hasattr(m, "layer_idx"))
    hook = real.register_forward_pre_hook(lambda m, a: seen.append(attn.layer_idx))
    with torch.no_grad():
        out = paux(**ids([5, 6, 7, 8]), use_cache=True)
    hook.remove()
    assert seen == [0, 1, 2, 3]  # L calls of the one real layer, each at its own cache slot
    cache = out.past_key_values
    assert len(cache.layers) == 4 and all(layer.keys.shape[-2] == 4 + 4 for layer in cache.layers)
    # The same as an unshared model whose 4 layers are copies of the cut layer, same prompts.
    twin = copy.deepcopy(model)
    layers = twin.get_submodule(layer_list_path(twin))
    for i in range(4):
        layers[i] = copy.deepcopy(model.get_submodule(layer_list_path(model))[3])
        for m in layers[i].modules():
            if hasattr(m, "layer_idx"):
                m.layer_idx = i
    ptwin = apply_peft(twin, PREFIX, seed=2)
    prompts = torch.randn_like(prompt_param(paux))
    set_prompts(paux, prompts)
    set_prompts(ptwin, prompts)
    with torch.no_grad():
        a, b = paux(**ids([5, 6, 7, 8])).logits, ptwin(**ids([5, 6, 7, 8])).logits
        torch.testing.assert_close(a, b)
        # every slot matters: changing one layer's prefix changes the output
        per = prompts.shape[1] // 4
        for k in range(4):
            p = prompts.clone()
            p[:, k * per:(k + 1) * per] += 1.0
            set_prompts(paux, p)
            assert not torch.allclose(paux(**ids([5, 6, 7, 8])).logits, a)
    # With all L layers "cut" and shared 1:1 the auxiliary model is the LLM itself.
    full, _ = aux_of(model, 4, "bot")
    pfull, pllm = apply_peft(full, PREFIX, seed=3), apply_peft(copy.deepcopy(model), PREFIX, seed=4)
    set_prompts(pfull, prompts)
    set_prompts(pllm, prompts)
    with torch.no_grad():
        torch.testing.assert_close(pfull(**ids([9, 3, 4])).logits, pllm(**ids([9, 3, 4])).logits)


def test_prompts_round_trip_between_llm_and_auxiliary_with_identical_shapes():
    model, _ = llm("tiny-llama")  # grouped-query attention: 4 heads, 2 key/value heads
    pllm = apply_peft(copy.deepcopy(model), PREFIX, seed=0)
    aux, spec = aux_of(model, 2, "mid")
    paux = apply_peft(aux, PREFIX, seed=0)
    kv_dim = model.config.num_key_value_heads * (model.config.hidden_size
                                                 // model.config.num_attention_heads)
    assert prompt_param(pllm).shape == prompt_param(paux).shape == (4, 4 * 2 * kv_dim)
    p = torch.randn(4, 4 * 2 * kv_dim)
    set_prompts(paux, prompts_for_aux(p, spec))  # LLM -> aux -> LLM, unchanged
    back = prompts_into_llm(torch.zeros_like(p), get_prompts(paux), spec)
    set_prompts(pllm, back)
    assert torch.equal(get_prompts(pllm), p)
    # Without sharing the auxiliary model covers only the slots of its own layers.
    flat, fspec = aux_of(model, 2, "mid", shared=False)
    pflat = apply_peft(flat, PREFIX, seed=0)
    assert fspec.slots == (1, 2) and prompt_param(pflat).shape == (4, 2 * 2 * kv_dim)
    sub = prompts_for_aux(p, fspec)
    set_prompts(pflat, sub)
    merged = prompts_into_llm(torch.zeros_like(p), get_prompts(pflat), fspec).view(4, 4, -1)
    assert torch.equal(merged[:, 1:3], p.view(4, 4, -1)[:, 1:3])
    assert not merged[:, [0, 3]].any()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_text_init_prompts_equal_the_text_in_front(name):
    model, tok = llm(name)
    pm = apply_peft(model, PREFIX, seed=0)
    set_prompts(pm, text_prefix(pm, tok, "Text: play some jazz\nLabel: PlayMusic", 4))
    prefix = list(tok("Text: play some jazz\nLabel: PlayMusic")["input_ids"])[:4]
    with torch.no_grad():
        a = pm(**ids([7, 8, 9])).logits
        b = pm.get_base_model()(input_ids=torch.tensor([prefix + [7, 8, 9]])).logits[:, 4:]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_shared_prefix_init_text_starts_fedsp_from_the_same_prompts(tmp_path):
    def prompts(*overrides):
        cfg = fedsp_config(tmp_path, *overrides, method="fedprompt")
        server = get_method("fedprompt").server(cfg, cfg.run_dir)
        server.setup()
        return server.prompts

    text = prompts()  # method.prompt_init: text
    shared = prompts("method.prompt_init=random", "training.prefix_init=text")
    random = prompts("method.prompt_init=random")
    torch.testing.assert_close(shared, text, rtol=0, atol=0)
    assert not torch.allclose(random, text)


def test_each_alternating_phase_changes_only_what_it_should(tmp_path):
    cfg = fedsp_config(tmp_path)
    model, tok = llm("tiny-llama")
    aux, _ = aux_of(model, 1, "bot")
    lm = LM(apply_peft(aux, cfg.training.model_copy(update={"peft": "prefix"}), seed=0), tok, {})
    groups = aux_param_groups(lm.model)
    records = [{"text": "play some jazz", "label": 1}, {"text": "will it rain", "label": 2}] * 4

    def snap():
        return ({n: p.detach().clone() for n, p in lm.model.named_parameters()},
                get_prompts(lm.model))

    flags = [p.requires_grad for p in lm.model.parameters()]
    before, prompts0 = snap()
    align_auxiliary(cfg, lm, records, steps=2, seed=0, params=align_params(lm.model, "layers"),
                    lr=1e-2, data=run_data_of(cfg))  # (i): prompts frozen, layers + final norm trained
    mid, prompts1 = snap()
    assert torch.equal(prompts0, prompts1)
    layer_ids = {id(p) for p in groups["layers"]}
    for n, p in lm.model.named_parameters():
        if "prompt_encoder" in n:
            continue
        changed = not torch.equal(before[n], mid[n])
        assert changed == (id(p) in layer_ids), n  # embeddings/head untouched
    capture_local_knowledge(cfg, lm, records, steps=2, seed=0, lr=1e-2, data=run_data_of(cfg))  # (ii)
    after, prompts2 = snap()
    assert not torch.equal(prompts1, prompts2)
    assert all(torch.equal(mid[n], after[n]) for n in after if "prompt_encoder" not in n)
    assert flags == [p.requires_grad for p in lm.model.parameters()]  # restored


# --------------------------------------------------------------------------- the method


def test_fedsp_ships_only_the_cut_once_then_prompts(tmp_path):
    cfg = fedsp_config(tmp_path / "run", "method.layer_position=mid")
    transport = Capturing(default_state_root(cfg))
    rows = run_job(cfg, transport, quiet=True)
    model, _ = llm("tiny-llama")
    path = layer_list_path(model)
    setup = [r for call in transport.requests for r in call.values() if "aux_model" in r]
    assert len(setup) == 2  # once per client, round 1 only
    sent = setup[0]["aux_model"]
    llm_state = model.state_dict()
    assert {k for k in sent if not k.startswith(path)} == {
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert {k.split(".")[2] for k in sent if k.startswith(path)} == {"0"}  # one layer
    # The layer shipped is the distilled LLM layer 1 (mid of 4); no other layer travels.
    others = [v for k, v in llm_state.items() if k.startswith(path)
              and k.split(".")[2] in {"0", "2", "3"}]
    for key, value in sent.items():
        assert not any(v.shape == value.shape and torch.equal(v, value) for v in others), key
    untouched = [k for k in sent if "embed" in k or "lm_head" in k]
    assert untouched and all(torch.equal(sent[k], llm_state[k]) for k in untouched)
    n_sent = sum(v.numel() for v in sent.values())
    assert n_sent < sum(p.numel() for p in model.parameters()) * 0.7
    trains = [r for call in transport.requests for r in call.values() if "prompts" in r]
    assert len(trains) == 4 and all(set(r) == {"prompts", "aux_id", "_fedkt"} for r in trains)
    assert trains[0]["prompts"].shape == (4, 4 * 2 * 32)
    server = {(r["round"], r["split"]): r for r in rows if r["participant"] == "server"}
    assert server[(1, "train")]["kd_loss"] < server[(1, "train")]["kd_loss_first"]  # Eq. 2
    assert server[(2, "train")]["bytes_sent"] < server[(1, "train")]["bytes_sent"] / 20
    assert {"accuracy", "loss"} <= set(server[(2, "test")])
    clients = [r for r in rows if r["participant"] == "client_0" and r["split"] == "train"]
    assert all("align_loss" in r for r in clients)
    # Resume: a fresh server with the checkpoint holds the same prompts and auxiliary model.
    srv = get_method("fedsp").server(cfg, cfg.run_dir)
    srv.setup()
    from safetensors.torch import load_file

    state = load_file(str(sorted((cfg.run_dir / "checkpoints").glob("*/server.safetensors"))[-1]))
    srv.load_state_dict(state)
    assert torch.equal(srv.prompts, state["prompts"]) and srv.aux_id == trains[-1]["aux_id"]


@pytest.mark.parametrize("method,overrides", [
    ("fedprompt", ()),
    ("fedprompt_single", ()),
    ("fedsp", ("method.cross_layer_sharing=false", "method.aux_layers=2")),
])
def test_baselines_and_ablations_run(tmp_path, method, overrides):
    cfg = fedsp_config(tmp_path / method, "rounds=1", *overrides, method=method)
    transport = Capturing(default_state_root(cfg))
    rows = run_job(cfg, transport, quiet=True)
    sent = [r for call in transport.requests for r in call.values()]
    trains = [r for r in sent if "prompts" in r]
    kv2 = 2 * 32
    if method == "fedprompt":  # clients hold the LLM: no model travels
        assert not any("aux_model" in r for r in sent)
        assert trains[0]["prompts"].shape == (4, 4 * kv2)
    elif method == "fedprompt_single":
        assert len([r for r in sent if "aux_model" in r]) == 2
        assert not any(k.startswith("kd_") for r in rows for k in r)  # no distillation
        assert not any("align_loss" in r for r in rows)  # no alignment
    else:  # without sharing: depth 2, the mean of the LLM prompts' 2-layer blocks travels
        assert trains[0]["prompts"].shape == (4, 2 * kv2)
    assert any(r["participant"] == "server" and r["split"] == "test" for r in rows)


def test_distillation_is_cached_by_content_and_identity_map_stays_fixed(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path / "cache"))
    cfg = fedsp_config(tmp_path / "a", "method.kd_cache=true", "method.kd_map=identity")
    first = get_method("fedsp").server(cfg, cfg.run_dir)
    first.setup()
    stats = first.distill(1)
    assert stats["kd_loss"] < stats["kd_loss_first"] and "kd_cached" not in stats
    assert torch.equal(first.w_s.weight, torch.eye(first.w_s.weight.shape[0]))
    again = get_method("fedsp").server(cfg, cfg.run_dir)
    again.setup()
    assert again.distill(1)["kd_cached"] == 1
    assert again.aux_id == first.aux_id  # the very same distilled auxiliary model
    other = fedsp_config(tmp_path / "b", "method.kd_cache=true", "method.kd_steps=7")
    third = get_method("fedsp").server(other, other.run_dir)
    third.setup()
    assert "kd_cached" not in third.distill(1)  # other settings: distilled anew


def test_config_rejects_alignment_of_a_whole_llm_and_missing_server_data(tmp_path):
    from fedkt.config import ConfigError

    with pytest.raises(ConfigError, match="distill: false"):
        fedsp_config(tmp_path, "method.alternating=true", method="fedprompt")
    cfg = fedsp_config(tmp_path, "data.split.public_fraction=0.0")
    with pytest.raises(ValueError, match="public_fraction"):
        get_method("fedsp").server(cfg, cfg.run_dir).setup()


# --------------------------------------------------------------------------- real model


@pytest.mark.slow
@needs_models("smollm2-135m")
def test_smollm2_auxiliary_model_and_prompts():
    model, tok = load_causal_lm(ModelConfig(name="smollm2-135m"), seed=0)
    training = TrainingConfig(peft="prefix")  # 40 virtual tokens, the paper's
    aux, spec = aux_of(model, 1, "bot")
    n_aux, n_llm = sum(p.numel() for p in aux.parameters()), sum(p.numel() for p in model.parameters())
    print(f"SmolLM2-135M: auxiliary model {n_aux:,} of {n_llm:,} parameters")
    assert spec.depth == 30 and n_aux < 0.25 * n_llm
    paux = apply_peft(aux, training, seed=0)
    text = "Question: Tracy went home. What will Tracy do next?\nAnswer: sleep\n\n" * 4
    pllm = apply_peft(model, training, seed=0)
    prompts = text_prefix(pllm, tok, text, 40)
    assert prompts.shape == prompt_param(paux).shape == prompt_param(pllm).shape == (40, 11520)
    set_prompts(paux, prompts)
    set_prompts(pllm, prompts)
    x = ids(list(tok(" What does Tracy need to do?")["input_ids"]))
    prefix = list(tok(text)["input_ids"])[:40]
    with torch.no_grad():
        logits = paux(**x).logits
        assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
        torch.testing.assert_close(
            pllm(**x).logits,
            model(input_ids=torch.tensor([prefix + x["input_ids"][0].tolist()])).logits[:, 40:],
            rtol=1e-3, atol=1e-3)


def test_a_client_failing_setup_is_excluded_and_gets_the_model_next_round(tmp_path):
    cfg = fedsp_config(tmp_path / "run", "clients.num_clients=3", "clients.min_replies=2")
    transport = Capturing(default_state_root(cfg))
    with client_faults("fedsp", "1:1"):  # client 1 fails every call of round 1
        rows = run_job(cfg, transport, quiet=True)
    setups = [cid for call in transport.requests for cid, r in call.items() if "aux_model" in r]
    assert setups == [0, 1, 2, 1]  # round 1 to everyone (1 fails), round 2 to client 1 again
    trained = {(r["round"], r["participant"]) for r in rows
               if r["split"] == "train" and "excluded" not in r and r["participant"] != "server"}
    assert trained == {(1, "client_0"), (1, "client_2"), (2, "client_0"), (2, "client_1"),
                       (2, "client_2")}
