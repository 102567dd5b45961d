"""GridTransport and the ClientApp without Flower's engines: a fake in-process Grid."""

from __future__ import annotations

import importlib
from uuid import uuid4

import pytest
from flwr.app import Context, Message, RecordDict

from fedkt.runtime.flower_app import FlowerTransportError, GridTransport, make_client_app
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport

_sim = importlib.import_module(__name__.rpartition(".")[0] + ".test_flower_sim"
                               if "." in __name__ else "test_flower_sim")
probe = _sim.probe


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower stamps new messages with the running task's ids; pretend to be one."""
    from flwr.supercore.task_identity import TaskIdentity

    for key in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, key, 1)


class FakeGrid:
    """Delivers each message straight to a ClientApp; ``None`` partition: no node config."""

    def __init__(self, partitions: dict[int, int | None], app, silent: tuple[int, ...] = ()):
        self.partitions, self.app, self.silent = partitions, app, silent
        self.replies: dict[str, Message] = {}
        self.pushed = 0

    def get_node_ids(self):
        return list(self.partitions)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            self.pushed += 1
            mid = uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            node = msg.metadata.dst_node_id
            pid = self.partitions[node]
            context = Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                              node_config={} if pid is None else {"partition-id": pid})
            if node not in self.silent:
                self.replies[mid] = self.app(msg, context)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def test_grid_transport_gives_local_results_one_message_per_client_call(probe, tmp_path):
    local = run_job(_sim.probe_config(tmp_path / "a" / "job"), LocalTransport(), quiet=True)
    grid = FakeGrid({501: 1, 502: 0}, make_client_app(state_root=tmp_path / "state"))
    rows = run_job(_sim.probe_config(tmp_path / "b" / "job"), GridTransport(grid, 2), quiet=True)
    _sim.assert_same_rows(rows, local)
    assert grid.pushed == 2 + 2 * 2  # hello to each node, then one message per client and round
    assert list((tmp_path / "state" / "client_0").glob("calls.*"))


def test_duplicate_client_id_is_an_error():
    grid = FakeGrid({7: 0, 8: 0, 9: 1}, make_client_app())
    with pytest.raises(FlowerTransportError, match=r"client id 0 on nodes \[7, 8\]"):
        GridTransport(grid, 2, connect_timeout=5)


def test_missing_client_id_is_an_error_after_the_wait():
    grid = FakeGrid({7: 0, 9: 5}, make_client_app())
    with pytest.raises(FlowerTransportError, match=r"no SuperNode for client id\(s\) \[1, 2\]"):
        GridTransport(grid, 3, connect_timeout=0.5)


def test_node_without_partition_id_is_an_error():
    grid = FakeGrid({7: 0, 8: None}, make_client_app())
    with pytest.raises(FlowerTransportError, match=r"SuperNode 8: .*partition-id"):
        GridTransport(grid, 2, connect_timeout=5)


def test_silent_client_times_out_others_reply(probe, tmp_path):
    grid = FakeGrid({7: 0, 8: 1}, make_client_app())
    transport = GridTransport(grid, 2)
    grid.silent = (8,)
    out = transport.exchange({0: b"not a payload", 1: b"not a payload"}, timeout=0.3)
    assert isinstance(out[1], TimeoutError) and "client 1" in str(out[1])
    assert isinstance(out[0], bytes)  # the client's error reply (bad payload), not an exception
