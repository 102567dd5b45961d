"""Secure aggregation: Flower's SecAgg+ workflow and client mod on the local and Flower runtimes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from safetensors.torch import load_file

from fedkt.config import ConfigError
from fedkt.federated.payload import loads
from fedkt.runner import run
from fedkt.runtime.base import RoundError, default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.runtime.secagg import REST
from fedkt.tracking.folder import SERVER_STATE
from tests.conftest import final_test_rows
from tests.support.fault_injection import client_faults

SECURE = ("secure_aggregation.enabled=true", "secure_aggregation.max_weight=64")
THREE = ("clients.num_clients=3", "rounds=1")
# SecAgg+ quantises w/max_weight * x to 2 * clipping_range / quantization_range; with
# <= 32 examples per client and max_weight 64 the error per value stays below this.
ATOL = 3 * (2 * 8.0 / 2**22) * 64 / 8


def _state(cfg, rnd=None):
    rnd = rnd or cfg.rounds
    return load_file(str(cfg.run_dir / "checkpoints" / f"round_{rnd:04d}" / SERVER_STATE))


class SpyTransport(LocalTransport):
    """The local transport, keeping every SecAgg+ message the server receives."""

    def __init__(self, state_root):
        super().__init__(state_root)
        self.received = []

    def secagg_grid(self, cids):
        grid, nodes = super().secagg_grid(cids)
        inner = grid.send_and_receive

        def spy(messages, timeout=None):
            replies = inner(messages, timeout)
            self.received += replies
            return replies

        grid.send_and_receive = spy
        return grid, nodes


def test_secure_fedavg_equals_plain_and_the_server_sees_only_masked_vectors(make_config):
    plain = make_config(*THREE, name="plain")
    rows_plain = run_job(plain, LocalTransport(default_state_root(plain)), quiet=True)
    cfg = make_config(*THREE, *SECURE, name="secure")
    spy = SpyTransport(default_state_root(cfg))
    rows = run_job(cfg, spy, quiet=True)

    a, b = _state(plain), _state(cfg)
    assert set(a) == set(b)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert 0 < diff < ATOL  # the plain mean up to SecAgg+'s quantisation, not bit-equal
    assert final_test_rows(rows)["server"]["accuracy"] == final_test_rows(rows_plain)["server"][
        "accuracy"]

    # What the server received: keys, encrypted shares, masked vectors, key shares; the
    # adapters themselves (which the plain run's clients sent) appear nowhere.
    stages = [r.content.config_records[RECORD_KEY_CONFIGS] for r in spy.received]
    masked = [[bytes_to_ndarray(x) for x in c[Key.MASKED_PARAMETERS]] for c in stages
              if Key.MASKED_PARAMETERS in c]
    assert len(masked) == 3 and len(spy.received) == 4 * 3  # 4 stages x 3 clients
    for r in spy.received:
        assert all(not len(rec) for rec in r.content.array_records.values())
        rest = r.content.config_records.get("fitres.metrics", {}).get(REST)
        if rest is not None:
            assert "adapter" not in loads(rest)  # the rest of the reply: numbers only
    for vectors in masked:
        values = np.concatenate([v.ravel() for v in vectors[1:]]).astype(np.float64)
        # uniform over [0, 2**32): mean 2**31, std 2**32 / sqrt(12)
        assert abs(values.mean() / 2**31 - 1) < 0.05
        assert abs(values.std() / (2**32 / 12**0.5) - 1) < 0.05
    # Secure traffic is counted per client and exceeds the plain adapter exchange.
    sent = [r["bytes_sent"] for r in rows if r["participant"] == "client_0" and r["split"] == "train"]
    sent_plain = [r["bytes_sent"] for r in rows_plain
                  if r["participant"] == "client_0" and r["split"] == "train"]
    assert sent[0] > sent_plain[0]


class DroppingTransport(LocalTransport):
    """The local transport, where ``drop`` clients vanish after sending their keys and
    shares: their masked vectors never arrive (a dropout in SecAgg+'s stage 2)."""

    def __init__(self, state_root, drop):
        super().__init__(state_root)
        self.drop = set(drop)

    def secagg_grid(self, cids):
        grid, nodes = super().secagg_grid(cids)
        inner, gone = grid.send_and_receive, {nodes[c] for c in self.drop if c in nodes}

        def lossy(messages, timeout=None):
            replies = inner(messages, timeout)
            return [r for r in replies if not (
                r.metadata.src_node_id in gone and not r.has_error()
                and Key.MASKED_PARAMETERS in r.content.config_records[RECORD_KEY_CONFIGS])]

        grid.send_and_receive = lossy
        return grid, nodes


def test_a_client_dropping_out_within_the_threshold_is_recovered(make_config):
    over = ("clients.num_clients=4", "rounds=1", "clients.min_replies=3")
    plain = make_config(*over, name="plain")
    with client_faults("fedavg", "1:1"):  # the plain run without client 1
        run_job(plain, LocalTransport(default_state_root(plain)), quiet=True)
    cfg = make_config(*over, *SECURE, name="secure")
    rows = run_job(cfg, DroppingTransport(default_state_root(cfg), drop=[1]), quiet=True)
    a, b = _state(plain), _state(cfg)
    # The survivors' mean: client 1's pairwise masks were rebuilt from its neighbours'
    # shares of its key and removed.
    assert max((a[k] - b[k]).abs().max().item() for k in a) < ATOL
    row = next(r for r in rows if r["participant"] == "client_1" and r["split"] == "train")
    assert "no reply" in row["excluded"]
    server = next(r for r in rows if r["participant"] == "server" and r["split"] == "train")
    assert server["clients_replied"] == 3


def test_a_failing_client_adds_nothing_and_is_excluded_with_its_reason(make_config):
    over = ("clients.num_clients=3", "rounds=1", "clients.min_replies=2")
    plain = make_config(*over, name="plain")
    cfg = make_config(*over, *SECURE, name="secure")
    with client_faults("fedavg", "1:1"):  # client 1's handler raises in round 1
        run_job(plain, LocalTransport(default_state_root(plain)), quiet=True)
        rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    a, b = _state(plain), _state(cfg)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < ATOL  # weight 0: no effect
    row = next(r for r in rows if r["participant"] == "client_1" and r["split"] == "train")
    assert "injected fault" in row["excluded"]


def test_a_weight_above_max_weight_is_refused_by_the_client(make_config):
    cfg = make_config(*THREE, "secure_aggregation.enabled=true",
                      "secure_aggregation.max_weight=4", name="secure")
    with pytest.raises(RoundError, match=r"client 0: weight \d+ \(num_examples\) exceeds "
                                         r"secure_aggregation.max_weight 4"):
        run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)


def test_too_many_dropouts_fail_the_round_cleanly(make_config):
    cfg = make_config(*THREE, *SECURE, "clients.min_replies=1",
                      "secure_aggregation.reconstruction_threshold=3", name="secure")
    with pytest.raises(RoundError, match="secure aggregation halted in round 1.*client 1"):
        run_job(cfg, DroppingTransport(default_state_root(cfg), drop=[1, 2]), quiet=True)


def test_secure_aggregation_is_refused_where_the_server_needs_each_upload(make_config):
    with pytest.raises(ConfigError, match="secure_aggregation.enabled: method 'standalone'"):
        make_config("secure_aggregation.enabled=true", method="standalone")
    with pytest.raises(ConfigError, match="secure_aggregation"):
        make_config("secure_aggregation.enabled=true", "secure_aggregation.num_shares=2")


# Four Ray workers with a dropout: the slowest default test (1-5 min on 2 cores); the same
# protocol runs in-process above and flower-sim's parity with local in test_flower_sim.
@pytest.mark.slow
def test_flower_simulation_runs_the_same_protocol_with_the_same_numbers(make_config):
    over = ("clients.num_clients=4", "rounds=1", "clients.min_replies=3", *SECURE)
    local = make_config(*over, name="local")
    sim = make_config(*over, "runtime.name=flower-sim", name="sim")
    # Client 2 drops out in round 1, here and in the simulation's worker processes.
    with client_faults("fedavg", "2:1", workers=True):
        rows_local = run_job(local, LocalTransport(default_state_root(local)), quiet=True)
        rows = run(sim, quiet=True)
    a, b = _state(local), _state(sim)
    # Same Flower workflow and mod, same seeded stochastic rounding, the same dropout
    # recovery: the same aggregate, bit for bit.
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    for got in (rows_local, rows):
        excluded = {r["participant"]: r["excluded"] for r in got if r.get("excluded")}
        assert list(excluded) == ["client_2"] and "injected fault" in excluded["client_2"]


@pytest.mark.parametrize("method", ["fedkd", "fedsp"])
def test_fedkd_updates_and_fedsp_prompts_are_securely_averaged(tmp_path, method):
    """FedKD: dense low-rank reconstructions are summed (the download stays compressed);
    FedSP: the prompts (Eq. 1). Both give the plain run's model up to quantisation."""
    if method == "fedkd":
        from tests.methods.test_fedkd import fedkd_config as make
        over = ("rounds=1",)
    else:
        from tests.methods.test_fedsp import fedsp_config as make
        over = ("rounds=1", "method.server_prompt_steps=0")
    plain = make(tmp_path / "plain", *over) if method == "fedsp" else make(tmp_path, *over,
                                                                            name="plain")
    secure = (make(tmp_path / "secure", *over, *SECURE) if method == "fedsp"
              else make(tmp_path, *over, *SECURE, name="secure"))
    for cfg in (plain, secure):
        run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    a, b = _state(plain), _state(secure)
    floats = [k for k in a if a[k].is_floating_point()]
    assert floats and set(a) == set(b)
    diff = max((a[k] - b[k]).abs().max().item() for k in floats)
    assert diff < ATOL


@pytest.mark.slow
def test_deployed_secure_fedavg_matches_local(tmp_path):
    """A real SuperLink and SuperNodes: SecAgg+ across processes, the local run's numbers."""
    from fedkt.runtime.flower_deploy import free_port, start_superlink, start_supernode, submit_job
    from tests.conftest import small_config

    local = small_config(tmp_path / "local", *SECURE, "rounds=1")
    run_job(local, LocalTransport(default_state_root(local)), quiet=True)
    port = free_port()
    procs = [start_superlink("127.0.0.1", port, flwr_home=tmp_path / "home" / "link",
                             log_file=tmp_path / "logs" / "superlink.log")]
    try:
        for cid in range(2):
            procs.append(start_supernode(cid, 2, f"127.0.0.1:{port}",
                                         state_dir=tmp_path / "state" / f"node{cid}",
                                         flwr_home=tmp_path / "home" / f"node{cid}",
                                         log_file=tmp_path / "logs" / f"supernode{cid}.log"))
        deployed = small_config(tmp_path / "deployed", *SECURE, "rounds=1", "runtime.name=flower",
                                f"runtime.flower.superlink=127.0.0.1:{port}")
        submit_job(deployed, quiet=True)
    finally:
        for proc in reversed(procs):
            proc.stop()
    a, b = _state(local), _state(deployed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
