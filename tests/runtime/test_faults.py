"""Faulty clients: excluded with their reason, and the result equals a run without them."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from fedkt.config import ConfigError
from fedkt.runtime.base import RoundError
from fedkt.runtime.base import default_state_root as client_state_root
from fedkt.runtime.faults import FaultyTransport, persistent_plan
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import RunRecorder
from fedkt.tracking.folder import SERVER_STATE
from tests.conftest import final_test_rows


def _faulty(cfg, faulty):
    return FaultyTransport(LocalTransport(client_state_root(cfg)), persistent_plan(faulty))


def _final_state(cfg):
    rec = RunRecorder(cfg.run_dir, resume=True)
    return load_file(str(rec.checkpoint_dir(rec.last_complete_round()) / SERVER_STATE))


def test_persistent_faults_equal_participants_only_run(make_config):
    faulty = {1: "crash", 2: "nan"}
    cfg = make_config("clients.num_clients=4", "clients.min_replies=2", name="faulty")
    transport = _faulty(cfg, faulty)
    rows = run_job(cfg, transport, quiet=True)
    assert set(transport.injected.values()) == {"crash", "nan"}

    healthy = make_config("clients.num_clients=4", "clients.participants=[0, 3]", name="healthy")
    assert healthy.client_ids() == [0, 3]
    clean = run_job(healthy, LocalTransport(client_state_root(healthy)), quiet=True)

    a, b = _final_state(cfg), _final_state(healthy)
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ... and not merely the initial adapter: training moved it.
    assert any(not torch.equal(a[k], v) for k, v in load_file(
        str(RunRecorder(cfg.run_dir, resume=True).checkpoint_dir(1) / SERVER_STATE)).items())
    got, want = final_test_rows(rows), final_test_rows(clean)
    assert set(want) == {"server", "client_0", "client_3"}
    assert {k: got[k] for k in want} == want

    for rnd in (1, 2):
        row = {r["participant"]: r for r in rows if r["round"] == rnd and r["split"] == "train"}
        assert row["server"]["clients_replied"] == 2
        assert "excluded" not in row["client_0"] and "excluded" not in row["client_3"]
        crash, nan = row["client_1"]["excluded"], row["client_2"]["excluded"]
        assert "ConnectionResetError" in crash and "client 1" in crash
        assert "PayloadError" in nan and "client 2" in nan and "non-finite" in nan
        # the rejected reply's bytes are still accounted for
        assert row["client_2"]["bytes_sent"] > 0 and row["client_1"]["bytes_received"] > 0


def test_malformed_reply_fails_round_without_min_replies(make_config):
    cfg = make_config("rounds=1")
    with pytest.raises(RoundError, match=r"round 1\b.* 1 of 2 clients.*client 1: PayloadError.*dtype"):
        run_job(cfg, _faulty(cfg, {1: "dtype"}), quiet=True)


@pytest.mark.parametrize("ids, why", [("[0, 4]", "out of range: [4]"),
                                      ("[1, 1]", "repeated: [1]"), ("[]", "empty")])
def test_participants_validated_naming_key(make_config, ids, why):
    with pytest.raises(ConfigError, match=rf"clients: .*'participants'.*{re.escape(why)}"):
        make_config("clients.num_clients=4", f"clients.participants={ids}")


def test_failing_handlers_only_when_asked_for_the_named_clients_and_rounds(make_config,
                                                                          monkeypatch):
    """:func:`fedkt.runtime.faults.fail_handlers`: the client's handler raises in the named rounds,
    installing again replaces (never nests), and undoing restores the handlers."""
    from fedkt.config import method_catalog as catalog
    from fedkt.federated.payload import Payload
    from fedkt.methods.base import Method, Server
    from fedkt.methods.fedavg.config import FedAvgConfig
    from fedkt.runtime.base import RuntimeClients
    from fedkt.runtime.faults import fail_handlers, failing_handlers, parse_handler_faults

    def echo(ctx, msg):
        return Payload(cid=ctx.cid)

    handlers = {"echo": echo}
    monkeypatch.setitem(catalog._REGISTRY, "fedavg", Method("echo", FedAvgConfig, Server,
                                                             handlers))
    cfg = make_config("clients.num_clients=3", "clients.min_replies=1")

    def excluded(rnd):
        clients = RuntimeClients(cfg, LocalTransport(cfg.run_dir / "clients"))
        clients.start_round(rnd)
        clients.call("echo", {cid: Payload() for cid in clients.ids})
        return clients.traffic.excluded

    assert parse_handler_faults("1:2, 0:3") == {(1, 2), (0, 3)} == parse_handler_faults(
        [(1, 2), ("0", "3")])
    with pytest.raises(ValueError, match="expected CID:ROUND"):
        parse_handler_faults("1-2")
    assert excluded(2) == {}  # nothing injected unless asked
    with failing_handlers("fedavg", "1:2,2:2"):
        assert excluded(1) == {}
        got = excluded(2)
        assert sorted(got) == [1, 2]
        assert "InjectedFault: injected fault: client 1, round 2" in got[1]
        undo = fail_handlers("fedavg", "0:1")  # again: replaces the faults
        assert list(excluded(1)) == [0] and excluded(2) == {}
        assert handlers["echo"].handler is echo  # one wrapper, around the handler
        undo()
        assert sorted(excluded(2)) == [1, 2]
    assert handlers == {"echo": echo} and excluded(2) == {}
