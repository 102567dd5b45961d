"""FedAvg and the non-collaborative baselines, through the real local runtime."""

from __future__ import annotations

import torch

from fedkt.methods import get_method
from fedkt.runtime.base import RuntimeClients, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport


class Recording(RuntimeClients):
    """RuntimeClients that keeps what the server received."""

    def call(self, handler, messages, *, evaluate=None):
        self.replies = super().call(handler, messages, evaluate=evaluate)
        return self.replies


def _server_and_clients(cfg):
    server = get_method(cfg.method.name).server(cfg, cfg.run_dir)
    server.setup()
    clients = Recording(cfg, LocalTransport(default_state_root(cfg)))
    return server, clients


def test_fedavg_global_adapter_is_example_weighted_mean(make_config):
    cfg = make_config("clients.num_clients=3", "data.partition={scheme: dirichlet, alpha: 0.5}",
                      "data.max_private_per_client=null")
    server, clients = _server_and_clients(cfg)
    before = {k: v.clone() for k, v in server.adapter.items()}
    clients.start_round(1)
    server.round(1, clients)
    sizes = [r["num_examples"] for r in clients.replies.values()]
    assert len(set(sizes)) > 1, "dirichlet partition should give unequal clients"
    for key, value in server.adapter.items():
        expected = sum(n * r["adapter"][key].double() for n, r in
                       zip(sizes, clients.replies.values(), strict=True)) / sum(sizes)
        torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(before[k], server.adapter[k]) for k in before)
    # Unweighted averaging differs when the clients differ in size.
    cfg2 = make_config("clients.num_clients=3", "data.partition={scheme: dirichlet, alpha: 0.5}",
                       "data.max_private_per_client=null",
                       "method={name: fedavg, weighted: false}", name="unweighted")
    server2, clients2 = _server_and_clients(cfg2)
    clients2.start_round(1)
    server2.round(1, clients2)
    key = next(iter(server.adapter))
    assert not torch.allclose(server.adapter[key], server2.adapter[key])


def test_fedavg_improves_on_its_start(make_config):
    rows = run_job(cfg := make_config("rounds=3", "training.lora.target_modules=all-linear",
                                      "training.lr=5e-3"),
                   LocalTransport(default_state_root(cfg)), quiet=True)
    server = [r for r in rows if r["participant"] == "server" and r["split"] == "test"]
    assert server[-1]["loss"] < server[0]["loss"]


def test_standalone_keeps_each_adapter_on_its_client(make_config):
    cfg = make_config("rounds=2", method="standalone")
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    root = default_state_root(cfg)
    saved = {cid: sorted((root / f"client_{cid}").glob("adapter.*")) for cid in (0, 1)}
    assert all(len(files) == 2 for files in saved.values())  # rounds 1 and 2
    from safetensors.torch import load_file

    a, b = (load_file(str(saved[c][-1])) for c in (0, 1))
    assert any(not torch.equal(a[k], b[k]) for k in a), "clients must not share adapters"
    # Only metrics travel: replies are tiny compared to an adapter.
    adapter_bytes = sum(t.numel() * t.element_size() for t in a.values())
    train = [r for r in rows if r["participant"].startswith("client") and r["split"] == "train"]
    assert all(r["bytes_sent"] < adapter_bytes / 4 for r in train)
    # Round 2 continues from round 1's adapter: its training loss is lower.
    losses = {(r["participant"], r["round"]): r["loss"] for r in train}
    assert all(losses[(f"client_{c}", 2)] < losses[(f"client_{c}", 1)] for c in (0, 1))


def test_centralized_pools_data_and_zero_shot_evaluates_untouched(make_config):
    cfg = make_config("rounds=1", method="centralized")
    server = get_method("centralized").server(cfg, cfg.run_dir)
    server.setup()
    data = server.data()
    assert len(server.records) == sum(len(p) for p in data.private) + len(data.public)
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    assert {r["participant"] for r in rows} == {"server"}
    zs_cfg = make_config("rounds=1", "server={name: tiny-llama}", method="zero_shot", name="zs")
    zs = run_job(zs_cfg, LocalTransport(default_state_root(zs_cfg)), quiet=True)
    tests = {r["participant"]: r for r in zs if r["split"] == "test"}
    assert set(tests) == {"server", "client_0", "client_1"}
    # Untrained, identical models on the same test set score the same.
    assert tests["client_0"]["loss"] == tests["client_1"]["loss"] == tests["server"]["loss"]
    central = [r for r in rows if r["split"] == "test"][-1]
    assert central["loss"] < tests["server"]["loss"]
