"""The method table (``fedkt.config.method_catalog.BUILT_IN``) names every method package, each
string resolves to what the method holds, and validating a config imports only the
method's config module (not its algorithm, nor torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fedkt.config import MethodConfig
from fedkt.config import method_catalog as catalog
from fedkt.config.method_catalog import BUILT_IN, FLAGS
from fedkt.errors import ConfigError
from fedkt.methods import get_method
from fedkt.methods.base import Method

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _module(reference: str) -> str:
    return reference.partition(":")[0]


def test_the_table_and_the_method_packages_agree():
    """Every package under fedkt/methods/ with an algorithm is in the table, through its
    ``config.py`` and ``method.py``, and every entry names one of those packages."""
    packages = {f"fedkt.methods.{p.parent.name}"
                for p in (ROOT / "fedkt" / "methods").glob("*/algorithm.py")}
    assert {"fedkt.methods.fedmkt", "fedkt.methods.baselines"} <= packages
    named = set()
    for name, declared in BUILT_IN.items():
        package = _module(declared.method).rpartition(".")[0]
        assert _module(declared.method) == f"{package}.method", name
        assert _module(declared.config) == f"{package}.config", name
        assert declared.check is None or _module(declared.check) == f"{package}.config", name
        named.add(package)
    assert named == packages


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_entry_resolves_to_what_its_method_holds(name: str):
    """The config string is the method's config class (whose ``name`` is the entry's),
    the method string a :class:`Method` of that name holding that config, the check and
    the flags and the summary those the Method has."""
    declared = BUILT_IN[name]
    config = catalog.method_config_class(name)
    assert issubclass(config, MethodConfig) and config.model_fields["name"].default == name
    method = get_method(name)
    assert isinstance(method, Method) and method.name == name and method.config is config
    assert method.behaviour.check is catalog.method_check(name)
    assert (declared.check is None) == (method.behaviour.check is None)
    assert [catalog.method_flag(name, f) for f in FLAGS] == \
        [getattr(method.behaviour, f) for f in FLAGS]
    assert catalog.summaries()[name] == method.docs.summary


def test_a_method_that_disagrees_with_its_entry_is_named(monkeypatch):
    """An entry whose strings do not resolve, or whose Method says otherwise (another
    flag, another config), is an error naming the method and what differs."""
    good = BUILT_IN["fedavg"]
    table = dict(BUILT_IN)
    monkeypatch.setattr(catalog, "BUILT_IN", table)
    table["fedavg"] = replace(good, aggregates=False)
    with pytest.raises(ConfigError, match=r"method 'fedavg'.*aggregates is True there, "
                                          r"False in the entry"):
        get_method("fedavg")
    table["fedavg"] = replace(good, config="fedkt.methods.fedkd.config:FedKDConfig")
    with pytest.raises(ConfigError, match=r"method 'fedavg'.*config is"):
        get_method("fedavg")
    table["fedavg"] = replace(good, config="fedkt.methods.fedavg.config:NoSuchConfig")
    with pytest.raises(ConfigError, match=r"method 'fedavg''s config: module "
                                          r"'fedkt.methods.fedavg.config' has no 'NoSuchConfig'"):
        catalog.method_config_class("fedavg")
    table["fedavg"] = replace(good, method="fedkt.methods.nowhere:M")
    with pytest.raises(ConfigError, match=r"method 'fedavg': module 'fedkt.methods.nowhere'"):
        get_method("fedavg")
    with pytest.raises(ConfigError, match="method.name: unknown method 'nope'; allowed: "):
        catalog.method_config_class("nope")


def test_register_method_refuses_what_it_cannot_use(monkeypatch):
    monkeypatch.setattr(catalog, "_PLUGINS", {})
    monkeypatch.setattr(catalog, "_REGISTERED_BY", {})
    strings = {"config": "pkg.config:C", "method": "pkg.method:M", "summary": "a method"}
    with pytest.raises(ValueError, match="name 'a b' must be a letter"):
        catalog.register_method("a b", **strings)
    with pytest.raises(ValueError, match="'fedavg'.*a built-in method has that name"):
        catalog.register_method("fedavg", **strings)
    with pytest.raises(ValueError, match=r"'toy'.*config must be a 'module:attribute' string"):
        catalog.register_method("toy", **{**strings, "config": "pkg.config.C"})
    with pytest.raises(ValueError, match="'toy'.*summary"):
        catalog.register_method("toy", **{**strings, "summary": " "})
    assert catalog.available() == sorted(BUILT_IN)
    catalog.register_method("toy", **strings, aggregates=True)
    assert "toy" in catalog.available() and catalog.method_flag("toy", "aggregates")
    assert catalog.plugin_module("toy") == __name__ and catalog.summaries()["toy"] == "a method"
    # Registering the name again, the other way, replaces it (and back).
    monkeypatch.setattr(catalog, "_REGISTRY", {})
    ready = replace(get_method("fedavg"), name="toy")
    catalog.register(ready, module="elsewhere")
    assert get_method("toy") is ready and catalog.entry("toy") is None
    assert catalog.method_flag("toy", "model_lr") and catalog.plugin_module("toy") == "elsewhere"
    catalog.register_method("toy", **strings)
    assert catalog.entry("toy") is not None and not catalog.method_flag("toy", "model_lr")


def test_validating_a_fedmkt_config_imports_its_config_module_only():
    got = _python("""
import json, sys
from fedkt.config import load_config
cfg = load_config("fedkt/configs/fedmkt/homo.yaml")
after_load = {m: m in sys.modules for m in ("torch", "fedkt.methods.fedmkt.method",
              "fedkt.methods.fedmkt.algorithm", "fedkt.methods.fedmkt.config")}
from fedkt.methods import get_method
method = get_method("fedmkt")  # the whole method now, with the same classes
import fedkt.methods.fedmkt.config as config
print(json.dumps({"after_load": after_load, "same_class": type(cfg.method) is method.config,
                  "same_check": method.behaviour.check is config.check_config,
                  "algorithm": "fedkt.methods.fedmkt.algorithm" in sys.modules}))
""")
    assert got["after_load"] == {"torch": False, "fedkt.methods.fedmkt.method": False,
                                 "fedkt.methods.fedmkt.algorithm": False,
                                 "fedkt.methods.fedmkt.config": True}
    assert got["same_class"] and got["same_check"] and got["algorithm"]


def test_validating_any_methods_config_imports_no_algorithm_and_no_torch():
    """Every built-in method on a tiny config: its config module, and the settings it
    shares with other methods (fedkt/config/method_settings.py), are torch-free; its
    ``method.py`` (which imports the algorithm) is not run."""
    got = _python("""
import json, sys
from fedkt.config.method_catalog import BUILT_IN
from fedkt.config import load_config
out = {}
for name, declared in sorted(BUILT_IN.items()):
    package = declared.method.split(":")[0].split(".")[-2]
    tiny = {"fedkd": "fedkd/tiny", "koala": "koala/tiny", "fedsp": "fedsp/tiny",
            "fedcollm": "fedcollm/tiny", "fedmkt": "fedmkt/tiny"}.get(package)
    config = tiny or ("fedkd/tiny" if name.endswith("_encoder") else
                      "koala/tiny" if name.endswith("_vision") else "fedavg/tiny")
    load_config(f"fedkt/configs/{config}.yaml", overrides=[f"method.name={name}"])
    out[name] = sorted(m for m in sys.modules if m == "torch"
                       or m.endswith((".algorithm", ".method")))
print(json.dumps(out))
""")
    assert len(got) >= 16
    assert got == {name: [] for name in got}


def test_every_shipped_config_validates_without_an_algorithm_or_torch():
    """The configs a user meets first, those that set SecAgg, DP or a per-model ``lr``
    included (``configs/fedcollm/demo.yaml``, ``configs/fedmkt/real.yaml``), validate
    importing no algorithm and no torch, and no method's ``method.py``, runtime or runner (a
    config reads them through their catalogs)."""
    got = _python("""
import json, sys
from pathlib import Path
from fedkt.config import load_config
out = {}
for path in sorted([*Path("configs").rglob("*.yaml"), *Path("fedkt/configs").rglob("*.yaml")]):
    if "suites" in path.parts:
        continue
    cfg = load_config(str(path))
    out[str(path)] = [cfg.method.name, sorted(m for m in sys.modules
                                              if m == "torch" or m.endswith(".algorithm"))]
from fedkt.config.method_catalog import BUILT_IN
modules = {*(e.method.split(":")[0] for e in BUILT_IN.values()), "fedkt.runtime.base",
           "fedkt.runtime.local", "fedkt.runtime.flower_sim", "fedkt.runtime.flower_deploy",
           "fedkt.runtime.job", "fedkt.runner"}
out["modules"] = sorted(modules & set(sys.modules))
print(json.dumps(out))
""")
    assert got.pop("modules") == []  # no method's method.py, no runtime, no runner
    assert {"configs/fedcollm/demo.yaml", "configs/fedmkt/real.yaml"} <= set(got)
    assert len(got) >= 20
    assert {path: v[1] for path, v in got.items()} == {path: [] for path in got}
