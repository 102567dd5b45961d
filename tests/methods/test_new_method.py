"""Adding a method: copy a method package, rename it, register it; nothing else changes.

A sixth method made from a copy of ``fedkt/methods/fedavg/`` outside fedkt, with no other
file touched, is found by name, runs, computes what FedAvg computes, and passes the
conformance checks every method passes (its uploads within the declaration it carries,
payload inspection clean, resume exact: ``tests/methods/test_conformance.py``).
"""

from __future__ import annotations

import ast
import importlib
import shutil
from pathlib import Path

from fedkt.config import ConfigError
from fedkt.methods import available, catalog, get_method
from fedkt.tracking import without_timings
from tests.support.conformance import check_method, conformance

ROOT = Path(__file__).resolve().parents[2]


def test_a_copied_fedavg_package_is_a_new_method_once_registered(tmp_path, make_config,
                                                                  monkeypatch):
    package = tmp_path / "plugins" / "toy_method"
    shutil.copytree(ROOT / "fedkt" / "methods" / "fedavg", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("config.py", "__init__.py"):  # the new name, where the copy declares it
        path = package / name
        path.write_text(path.read_text().replace('"fedavg"', '"toy"'))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setattr(catalog, "_REGISTRY", dict(catalog._REGISTRY))
    monkeypatch.setattr(catalog, "_REGISTERED_BY", dict(catalog._REGISTERED_BY))
    try:
        make_config(method="toy", name="before")
        raise AssertionError("an unregistered method must be refused")
    except ConfigError as exc:
        assert "unknown method 'toy'" in str(exc)
    toy = importlib.import_module("toy_method")  # registers it, as a plugin import would
    assert get_method("toy") is toy.METHOD and "toy" in available()
    assert catalog.plugin_module("toy") == "toy_method"  # fresh processes import it
    assert get_method("fedavg") is not toy.METHOD
    # The copy carries its declaration (uploads, tiny config): it conforms like any method ...
    got = without_timings(check_method("toy", tmp_path / "conformance").run.rows)
    # ... and computes what the original does: the same numbers; the requests are 3 bytes
    # shorter each, "toy" being the method's name in their envelope instead of "fedavg".
    want = without_timings(conformance("fedavg").run.rows)
    assert len(got) == len(want) > 8
    for g, w in zip(got, want, strict=True):
        assert {k: v for k, v in g.items() if not k.startswith("bytes")} == \
            {k: v for k, v in w.items() if not k.startswith("bytes")}
        if g["participant"] == "server" and "bytes_sent" in g:  # server -> clients
            assert (w["bytes_sent"] - g["bytes_sent"]) % 3 == 0 and \
                0 < w["bytes_sent"] - g["bytes_sent"] < 100
            assert g["bytes_received"] == w["bytes_received"]


def test_the_template_is_fully_typed():
    """``fedkt/methods/fedavg/``, the folder a newcomer copies: every function's parameters
    (but ``self``/``cls``) and its return are annotated, and every attribute a server sets
    is declared, typed, on its class."""
    functions, missing = 0, []
    for path in sorted((ROOT / "fedkt" / "methods" / "fedavg").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions += 1
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs,
                          *filter(None, [a.vararg, a.kwarg])]
                missing += [f"{path.name}:{node.lineno} {node.name}({p.arg})" for p in params
                            if p.annotation is None and p.arg not in ("self", "cls")]
                if node.returns is None:
                    missing.append(f"{path.name}:{node.lineno} {node.name} -> ?")
            if isinstance(node, ast.ClassDef):
                declared = {n.target.id for n in node.body
                            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
                for fn in node.body:
                    if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
                        continue
                    missing += [f"{path.name}:{t.lineno} {node.name}.{t.attr} (undeclared)"
                                for t in ast.walk(fn) if isinstance(t, ast.Attribute)
                                and isinstance(t.ctx, ast.Store)
                                and isinstance(t.value, ast.Name) and t.value.id == "self"
                                and t.attr not in declared]
    assert functions >= 8 and not missing, missing
