"""Modules that moved into packages and that users import by their old path (the
extension points and the pieces a method's own code calls) keep that path: the old module
re-exports the new one's public names and warns, naming the new path."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys

import pytest

# old path -> new path
MOVED = {
    "fedkt.faults": "fedkt.runtime.faults",  # fail_handlers: an extension point
    "fedkt.payload": "fedkt.federated.payload",  # Payload: what every handler returns
    "fedkt.losses": "fedkt.train.losses",  # generic distillation losses
    "fedkt.aggregation": "fedkt.federated.aggregation",  # FedAvg of tensors
}


def _defined(module: object) -> set[str]:
    """The public names a module's own top-level statements define."""
    names: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_the_old_path_warns_and_gives_the_same_objects(old: str, new: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    moved = importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        shim = importlib.import_module(old)
    assert shim.__all__, old
    public = set(getattr(moved, "__all__", ())) | _defined(moved)
    assert public <= set(shim.__all__), sorted(public - set(shim.__all__))
    for name in shim.__all__:
        assert getattr(shim, name) is getattr(moved, name), f"{old}.{name}"
