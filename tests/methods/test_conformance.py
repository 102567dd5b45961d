"""Conformance: every registered method, on the tiny config it declares, for two rounds.

Each method's uploads stay within its declaration, payload inspection is clean and a run
resumed after a crash in round 2 equals the uninterrupted one (:mod:`tests.support.conformance`).
A new method is checked by registering it (``tests/methods/test_new_method.py`` runs these
checks on a copied package); nothing here lists methods.
"""

from __future__ import annotations

import pytest
import torch

from fedkt.methods import available
from tests.support.conformance import conformance

# Minutes of tiny encoder runs that other tests already cover: checked with -m slow.
SLOW = {"standalone_encoder", "centralized_encoder"}


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m
                                  for m in available()])
def test_method_conforms(name):
    conformance(name)


def test_a_reply_beyond_its_declaration_is_caught(tmp_path):
    """The declaration check is not vacuous: an undeclared field or a wrong kind fails."""
    from fedkt.methods.uploads import ADAPTER, NUMBER, undeclared

    uploads = {"train": {"adapter": ADAPTER, "num_examples": NUMBER}}
    lora = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.zeros(2, 2)}
    assert undeclared(uploads, "train", {"adapter": lora, "num_examples": 3, "metrics": {}}) \
        == []
    assert undeclared(uploads, "train", {"adapter": lora, "num_layers": 2}) == [
        "'train' field 'num_layers' is not declared"]
    got = undeclared(uploads, "train", {"adapter": {"model.norm.weight": torch.ones(2)}})
    assert got and "outside the declaration" in got[0]
    assert "finite number" in undeclared(uploads, "train", {"num_examples": True})[0]
    assert undeclared(uploads, "evaluate", {}) == ["handler 'evaluate' has no declaration"]


def test_the_train_loss_check_catches_a_server_objective():
    """The server row's train ``loss`` must be the clients' mean: the old FedMKT/KOALA row
    (the server's own objective under ``loss``) fails, an excluded client is left out, a
    method without client handlers (centralized) keeps its model's own loss."""
    from tests.support.conformance import check_train_loss

    def rows(server_loss: float) -> list[dict]:
        return [{"round": 0, "participant": "server", "split": "test", "loss": 9.0},
                {"round": 1, "participant": "server", "split": "train", "loss": server_loss},
                {"round": 1, "participant": "client_0", "split": "train", "loss": 1.0},
                {"round": 1, "participant": "client_1", "split": "train", "loss": 3.0},
                {"round": 1, "participant": "client_2", "split": "train", "loss": 7.0,
                 "excluded": "TimeoutError: no reply within 1 s"}]

    check_train_loss("ok", rows(2.0))
    with pytest.raises(AssertionError, match="not the clients' mean"):
        check_train_loss("own objective", rows(0.5))
    alone = [{"round": 1, "participant": "server", "split": "train", "loss": 0.5}]
    check_train_loss("centralized", alone, trains_clients=False)
    with pytest.raises(AssertionError, match="no client row has one"):
        check_train_loss("no clients", alone)


def test_every_method_names_its_handlers_from_the_shared_vocabulary():
    """``train``, ``evaluate``, ``adopt``, or an own handler listed with what it does;
    checked here for every method without running it (the runs above check it too)."""
    from fedkt.methods import get_method
    from fedkt.methods.base import SHARED_HANDLERS
    from tests.support.conformance import handler_name_problems

    methods = [get_method(name) for name in available()]
    assert [p for m in methods for p in handler_name_problems(m)] == []
    # The handler that takes the server's model back has one name wherever it exists.
    adopting = {m.name for m in methods if "adopt" in m.handlers}
    assert {"fedkd", "koala", "fedmkt", "llm2slm", "fedavg_encoder"} <= adopting
    assert all(set(m.handlers) <= set(SHARED_HANDLERS) | set(m.conformance.own_handlers)
               for m in methods)


def test_a_handler_outside_the_vocabulary_is_caught():
    """The vocabulary check is not vacuous: another name for a shared role, an own handler
    under a shared name, a stale or undescribed listing each fail, naming the method."""
    from fedkt.methods.base import Conformance, Method, Server
    from fedkt.methods.fedavg.config import FedAvgConfig
    from tests.support.conformance import handler_name_problems

    def noop(ctx, msg):
        return msg

    def method(handlers, own):
        return Method(name="m", config=FedAvgConfig, server=Server,
                      handlers=dict.fromkeys(handlers, noop),
                      conformance=Conformance(own_handlers=own))

    assert handler_name_problems(method(["train", "adopt"], {})) == []
    assert handler_name_problems(method(["train", "share"], {"share": "upload logits"})) == []
    got = handler_name_problems(method(["train", "sync"], {}))
    assert len(got) == 1 and "m: handler 'sync' is not one of the shared names" in got[0]
    assert "takes a shared name" in handler_name_problems(
        method(["adopt"], {"adopt": "keep the global model"}))[0]
    assert "which it has no handler for" in handler_name_problems(
        method(["train"], {"update": "keep the model"}))[0]
    assert "does not say what it does" in handler_name_problems(
        method(["train", "share"], {"share": " "}))[0]


def _registrations(path):
    """Each ``Method(...)`` call in ``path``: (the call, its statement at module level or
    None)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node): stmt for stmt in tree.body for node in ast.walk(stmt)}
    return [(node, top.get(id(node))) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "Method"]


def test_every_built_in_method_is_made_one_way():
    """``NAME = Method(name="...", config=Class, ...)`` at module level in its package's
    ``method.py``, keywords only (docs/architecture.md): the one style a newcomer copies;
    the method table names each one there, as ``"<package>.method:NAME"``."""
    import ast
    from pathlib import Path

    import fedkt.methods
    from fedkt.config.method_catalog import BUILT_IN

    root = Path(fedkt.methods.__file__).parent
    seen = {}
    for path in sorted(root.rglob("*.py")):
        for call, stmt in _registrations(path):
            where = f"{path.relative_to(root)}:{call.lineno}"
            assert path.name == "method.py" and path.parent != root, \
                f"{where}: a method is made in its package's method.py"
            assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id.isupper() and stmt.value is call, \
                f"{where}: NAME = Method(...)"
            assert not call.args, f"{where}: Method(...) takes keywords only"
            kw = {k.arg: k.value for k in call.keywords}
            assert isinstance(kw.get("name"), ast.Constant) \
                and isinstance(kw["name"].value, str), f"{where}: name='...' literal"
            assert isinstance(kw.get("config"), ast.Name), f"{where}: config=ItsConfigClass"
            package = ".".join(("fedkt.methods", *path.parent.relative_to(root).parts))
            seen[kw["name"].value] = f"{package}.method:{stmt.targets[0].id}"
    assert seen == {name: entry.method for name, entry in BUILT_IN.items()}  # each once
