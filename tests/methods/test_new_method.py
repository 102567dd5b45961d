"""Adding a method: copy a method package, rename it, register it; nothing else changes.

A sixth method made from a copy of ``fedkt/methods/fedavg/`` outside fedkt, with no other
file touched, is declared by its own ``__init__.py`` (``register_method``, as the method
table declares fedkt's own), is found by name, runs, computes what FedAvg computes, and
passes the conformance checks every method passes (its uploads within the declaration it
carries, payload inspection clean, resume exact: ``tests/methods/test_conformance.py``);
a config that names it validates without importing torch.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fedkt.config import ConfigError
from fedkt.config import method_catalog as catalog
from fedkt.methods import available, get_method
from fedkt.tracking import without_timings
from tests.support.conformance import check_method, conformance

ROOT = Path(__file__).resolve().parents[2]

# What the copy's __init__.py says to declare it: the fields of fedavg's entry in
# fedkt.config.method_catalog.BUILT_IN, its own modules named.
_DECLARE = '''
from fedkt.methods import register_method

register_method(
    "toy", config="toy_method.config:FedAvgConfig", method="toy_method.method:METHOD",
    summary="FedAvg of LoRA/prefix adapters on a shared client model",
    aggregates=True, model_lr=True)
'''


def _copy_fedavg(tmp_path: Path) -> Path:
    """``fedkt/methods/fedavg/`` copied to ``tmp_path/plugins/toy_method`` as method "toy",
    declared by its ``__init__.py``; the folder to put on ``sys.path``."""
    package = tmp_path / "plugins" / "toy_method"
    shutil.copytree(ROOT / "fedkt" / "methods" / "fedavg", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("config.py", "method.py"):  # the new name, where the copy declares it
        path = package / name
        path.write_text(path.read_text().replace('"fedavg"', '"toy"'))
    init = package / "__init__.py"
    init.write_text(init.read_text() + _DECLARE)
    return package.parent


def test_a_copied_fedavg_package_is_a_new_method_once_registered(tmp_path, make_config,
                                                                  monkeypatch):
    monkeypatch.syspath_prepend(str(_copy_fedavg(tmp_path)))
    monkeypatch.setattr(catalog, "_PLUGINS", dict(catalog._PLUGINS))
    monkeypatch.setattr(catalog, "_REGISTERED_BY", dict(catalog._REGISTERED_BY))
    try:
        make_config(method="toy", name="before")
        raise AssertionError("an unregistered method must be refused")
    except ConfigError as exc:
        assert "unknown method 'toy'" in str(exc)
    importlib.import_module("toy_method")  # declares it, as a plugin import would
    assert "toy" in available() and "toy_method.method" not in sys.modules
    toy = get_method("toy")
    assert toy is importlib.import_module("toy_method.method").METHOD
    assert catalog.plugin_module("toy") == "toy_method"  # fresh processes import it
    assert get_method("fedavg") is not toy
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


def test_a_plugin_method_validates_a_config_without_importing_torch(tmp_path):
    """In a fresh process, importing the plugin declares "toy"; a config naming it
    validates (its settings, its flags: SecAgg needs a method that aggregates), and a bad
    key of its section is named, all without importing torch or the plugin's algorithm."""
    plugins = _copy_fedavg(tmp_path)
    code = """
import json, sys
import toy_method
from fedkt.config import ConfigError, load_config
cfg = load_config("fedkt/configs/fedavg/tiny.yaml",
                  overrides=["method.name=toy", "secure_aggregation.enabled=true"])
try:
    load_config("fedkt/configs/fedavg/tiny.yaml", overrides=["method.name=toy", "method.nope=1"])
    error = None
except ConfigError as exc:
    error = str(exc)
print(json.dumps({"config": type(cfg.method).__module__, "name": cfg.method.name,
                  "error": error, "torch": "torch" in sys.modules,
                  "algorithm": [m for m in sys.modules if m.startswith("toy_method.")
                                and m != "toy_method.config"]}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(plugins)))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["config"] == "toy_method.config" and got["name"] == "toy"
    assert got["error"] is not None and "method.nope" in got["error"]
    assert got["torch"] is False and got["algorithm"] == []


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
