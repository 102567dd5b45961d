"""fedsp/arc_easy_qwen: the paper's ARC-Easy setting (Table 2) on a 24-layer LLM."""

from __future__ import annotations

import torch

from fedkt.config import load_config
from fedkt.configs.catalog import resolve_config
from fedkt.data.splits import run_data
from fedkt.methods import get_method
from fedkt.models.auxiliary import VirtualLayer, unwrap

torch.set_num_threads(1)


def arc_easy_qwen():
    return load_config(resolve_config("fedsp/arc_easy_qwen"))


def test_config_is_the_papers_setting_and_its_data_split():
    cfg = arc_easy_qwen()
    m = cfg.method
    assert (cfg.method.name, cfg.server.name, cfg.clients.num_clients) == (
        "fedsp", "qwen2.5-0.5b", 10)
    assert (m.aux_layers, m.layer_position, m.cross_layer_sharing) == (1, "bot", True)
    assert (m.distill, m.kd_steps, m.kd_lr, m.alternating) == (True, 5000, 5e-4, True)
    assert (cfg.training.batch_size, cfg.training.prefix_tokens) == (16, 40)
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    # ARC-Easy train (2,251) cut 11 ways: the server's share is one client's
    assert len(fd.public) == 204 and [len(p) for p in fd.private] == [204] * 10
    # the test set is 1,000 of ARC-Easy's official test questions, none of them trained on
    assert len(fd.test) == 1000
    train_ids = {r["id"] for r in fd.public} | {r["id"] for p in fd.private for r in p}
    test_ids = {r["id"] for r in fd.test}
    assert len(test_ids) == 1000 and not train_ids & test_ids


def test_a_24_layer_llm_gets_the_papers_auxiliary_cut(tmp_path, monkeypatch):
    """With the config's method settings, a 24-layer LLM (a tiny Qwen2 of Qwen2.5-0.5B's
    depth) gets its bottom layer (the paper's layer 1 of 24) run 24 times."""
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path / "cache"))
    cfg = arc_easy_qwen()
    server = cfg.server.model_copy(update={"name": "tiny-qwen2", "tiny": {"num_layers": 24}})
    cfg = cfg.model_copy(update={"server": server})
    srv = get_method("fedsp").server(cfg, tmp_path / "run")
    srv.setup()
    assert srv.spec.source_layers == (0,) and srv.spec.llm_depth == 24
    assert srv.spec.mapping == (0,) * 24 and srv.spec.slots == tuple(range(24))
    virtual = [m for m in srv.aux.model.modules() if isinstance(m, VirtualLayer)]
    assert len(virtual) == 24
    llm_layer = unwrap(srv.llm.model).model.layers[0]
    real = {id(p) for v in virtual for p in v.layer.parameters()}
    assert len(real) == len(list(llm_layer.parameters()))  # one real layer, shared 24 times
    for (name, p), q in zip(llm_layer.named_parameters(), virtual[0].layer.parameters(),
                            strict=True):
        assert torch.equal(p, q), name  # and it is the LLM's bottom layer
    # the prompts plug into both models: 40 tokens x 24 layers x key|value x kv width
    c = srv.aux_config
    kv_width = c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"]
    assert srv.prompts.shape == (40, 24 * 2 * kv_width)

