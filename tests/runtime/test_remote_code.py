"""A server cannot make a client run model code: ``trust_remote_code`` is the client's call.

The job's config travels to every client; before, its ``clients.models[].trust_remote_code``
made a SuperNode import and run the Python files of a model folder.  Here a real model
folder whose code writes a file when imported stands in for the attacker's: a client
that was not told locally to allow it refuses the request (naming the key) and the file
is never written; a client that allows it runs that code (so the refusal is what stopped
it).  The local and simulated runtimes' clients, which share the config of the one who
starts the run, allow it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.federated.payload import Payload, loads
from fedkt.runtime.base import (
    ALLOW_REMOTE_CODE_ENV,
    ERROR,
    RuntimeClients,
    handle_request,
    remote_code_keys,
    truthy,
)
from tests.conftest import small_config

CODE = """
from pathlib import Path
Path({marker!r}).write_text("model code ran")
from transformers import PretrainedConfig
class EvilConfig(PretrainedConfig):
    model_type = "evil"
"""


def evil_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A model folder whose config names Python code (``auto_map``) that writes ``marker``."""
    folder, marker = tmp_path / "evilmodel", tmp_path / "marker.txt"
    folder.mkdir()
    (folder / "evil.py").write_text(CODE.format(marker=str(marker)))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig",
                                           "AutoModelForCausalLM": "evil.EvilModel"}}))
    return folder, marker


def request_for(tmp_path: Path, folder: Path) -> bytes:
    """Client 0's 'train' request, as the server sends it, for a job using ``folder``."""
    cfg = small_config(tmp_path / "run", f"clients.models.0.name={folder}",
                       "clients.models.0.trust_remote_code=true")
    assert remote_code_keys(cfg) == ["clients.models[0].trust_remote_code"]
    return RuntimeClients(cfg, transport=None)._requests("train", {0: Payload()}, False)[0]


def test_a_client_refuses_the_servers_trust_remote_code_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_REMOTE_CODE_ENV, raising=False)
    folder, marker = evil_folder(tmp_path)
    reply = loads(handle_request(request_for(tmp_path, folder), tmp_path / "state", 0))
    assert reply[ERROR].startswith(
        "PermissionError: the job's config sets clients.models[0].trust_remote_code: this "
        "client does not run model code a server asks for")
    assert "FEDKT_ALLOW_REMOTE_CODE=1" in reply[ERROR]
    assert not marker.exists()
    # Explicitly refused (a SuperNode's node config "allow-remote-code=false"): the same.
    monkeypatch.setenv(ALLOW_REMOTE_CODE_ENV, "1")
    reply = loads(handle_request(request_for(tmp_path, folder), tmp_path / "state", 0,
                                 allow_remote_code=False))
    assert reply[ERROR].startswith("PermissionError") and not marker.exists()


def test_a_client_that_allows_it_runs_the_code(tmp_path, monkeypatch):
    """The folder's code does run when allowed: the refusal above is what stopped it."""
    monkeypatch.setenv(ALLOW_REMOTE_CODE_ENV, "1")
    folder, marker = evil_folder(tmp_path)
    handle_request(request_for(tmp_path, folder), tmp_path / "state", 0)
    assert marker.read_text() == "model code ran"


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("True", True), ("yes", True), (True, True),
    ("", False), ("0", False), ("false", False), ("no", False), (False, False), (0, False)])
def test_truthy(value, expected):
    assert truthy(value) is expected



@pytest.mark.parametrize("node_says, runs", [(None, False), ("false", False), ("true", True)])
def test_a_supernode_decides_by_its_own_node_config(tmp_path, monkeypatch, node_says, runs):
    """The deployed ClientApp (``make_client_app()``, as the FAB ships it) over a Grid: the
    SuperNode's ``--node-config "allow-remote-code=true"`` allows it, nothing else does."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedkt.runtime.flower_app import GridTransport, make_client_app
    from tests.runtime.test_flower_app import FakeGrid

    for key in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, key, 1)
    monkeypatch.delenv(ALLOW_REMOTE_CODE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # the app's fallback state folder
    folder, marker = evil_folder(tmp_path)

    class NodeConfigGrid(FakeGrid):
        def push_messages(self, messages):
            import flwr.app

            real = flwr.app.Context

            def context(**kw):
                if node_says is not None:
                    kw["node_config"] = {**kw["node_config"], "allow-remote-code": node_says}
                return real(**kw)

            monkeypatch.setattr("tests.runtime.test_flower_app.Context", context)
            return super().push_messages(messages)

    grid = NodeConfigGrid({7: 0}, make_client_app())
    reply = GridTransport(grid, 1).exchange({0: request_for(tmp_path, folder)}, timeout=60)[0]
    assert marker.exists() is runs
    if not runs:
        assert loads(reply)[ERROR].startswith("PermissionError: the job's config sets "
                                              "clients.models[0].trust_remote_code")


def test_fedkt_deploy_supernode_flag_sets_the_node_config():
    from fedkt.cli import build_parser
    from fedkt.runtime.flower_deploy.processes import supernode_command

    args = build_parser().parse_args(["deploy", "supernode", "--client-id", "0",
                                      "--num-clients", "2", "--allow-remote-code"])
    assert args.allow_remote_code is True

    def node_config(cmd: list[str]) -> str:
        return cmd[cmd.index("--node-config") + 1]

    assert "allow-remote-code" not in node_config(supernode_command(0, 2))
    assert "allow-remote-code=true" in node_config(supernode_command(0, 2,
                                                                     allow_remote_code=True))
