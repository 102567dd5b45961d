"""The registry finds fedkt's own methods from the sources, and validating a config imports
only the method's config module (not its algorithm, nor torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_validating_a_fedmkt_config_imports_its_config_module_only():
    got = _python("""
import json, sys
from fedkt.config import load_config
cfg = load_config("fedkt/configs/fedmkt/homo.yaml")
after_load = {m: m in sys.modules for m in ("torch", "fedkt.methods.fedmkt",
              "fedkt.methods.fedmkt.algorithm", "fedkt.methods.fedmkt.config")}
from fedkt.methods import get_method
method = get_method("fedmkt")  # the whole method now, with the same classes
import fedkt.methods.fedmkt as package
print(json.dumps({"after_load": after_load, "same_class": type(cfg.method) is method.config,
                  "same_check": method.behaviour.check is package.config.check_config,
                  "algorithm": "fedkt.methods.fedmkt.algorithm" in sys.modules}))
""")
    assert got["after_load"] == {"torch": False, "fedkt.methods.fedmkt": False,
                                 "fedkt.methods.fedmkt.algorithm": False,
                                 "fedkt.methods.fedmkt.config": True}
    assert got["same_class"] and got["same_check"] and got["algorithm"]


def test_the_sources_name_each_built_in_methods_config_and_check():
    """What the source scan finds (before any method is imported) is what each registered
    Method holds: its config class, its check, and the behaviour flags config checks read
    (``aggregates``, ``model_lr``); what the scan cannot find is read from the method."""
    got = _python("""
import json
from fedkt.methods.catalog import FLAGS, _built_in, method_check, method_config_class, method_flag
from fedkt.methods.registry import get_method
names = sorted(_built_in())
found = {n: (method_config_class(n), method_check(n), [method_flag(n, f) for f in FLAGS])
         for n in names}
print(json.dumps({n: [found[n][0] is get_method(n).config, found[n][1] is get_method(n).behaviour.check,
                      found[n][0].__module__,
                      found[n][2] == [getattr(get_method(n).behaviour, f) for f in FLAGS]]
                  for n in names}))
""")
    assert {"fedmkt", "fedcollm", "fedavg", "koala", "fedsp", "zero_shot"} <= set(got)
    wrong = {n: v for n, v in got.items() if not (v[0] and v[1] and v[3])}
    assert not wrong, wrong
    assert all(v[2].endswith(".config") for v in got.values())


def test_validating_any_methods_config_imports_no_algorithm_and_no_torch():
    """Every built-in method on its tiny config: its config module, and the settings it
    shares with other methods (fedkt/methods/settings.py), are torch-free; a package's
    ``__init__`` (which imports the algorithm) is not run."""
    got = _python("""
import json, sys
from fedkt.methods.catalog import _built_in
from fedkt.config import load_config
import yaml
out = {}
for name, module in sorted(_built_in().items()):
    before = set(sys.modules)
    tiny = {"fedkd": "fedkd/tiny", "koala": "koala/tiny", "fedsp": "fedsp/tiny",
            "fedcollm": "fedcollm/tiny", "fedmkt": "fedmkt/tiny"}.get(module.split(".")[-1])
    config = tiny or ("fedkd/tiny" if name.endswith("_encoder") else
                      "koala/tiny" if name.endswith("_vision") else "fedavg/tiny")
    load_config(f"fedkt/configs/{config}.yaml", overrides=[f"method.name={name}"])
    out[name] = sorted(m for m in sys.modules if m == "torch" or m.endswith(".algorithm"))
print(json.dumps(out))
""")
    assert len(got) >= 16
    assert got == {name: [] for name in got}


def test_every_shipped_config_validates_without_an_algorithm_or_torch():
    """The configs a user meets first, those that set SecAgg, DP or a per-model ``lr``
    included (``configs/fedcollm/demo.yaml``, ``configs/fedmkt/real.yaml``), validate
    importing no algorithm and no torch, and no method's package, runtime or runner (a
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
from fedkt.methods.catalog import _built_in
packages = {*_built_in().values(), "fedkt.runtime.base", "fedkt.runtime.local",
            "fedkt.runtime.flower_sim", "fedkt.runtime.flower_deploy", "fedkt.runner"}
out["packages"] = sorted(packages & set(sys.modules))
print(json.dumps(out))
""")
    assert got.pop("packages") == []  # no method's package, no runtime, no runner
    assert {"configs/fedcollm/demo.yaml", "configs/fedmkt/real.yaml"} <= set(got)
    assert len(got) >= 20
    assert {path: v[1] for path, v in got.items()} == {path: [] for path in got}


def test_the_catalog_never_imports_a_method_and_says_what_its_sources_lack(monkeypatch):
    """A built-in method whose ``Method(...)`` call does not name its config (or gives a
    flag that is not a literal) is an error naming the method, not a quiet import of its
    package; an unknown name is the config error that names ``method.name``."""
    import pytest

    from fedkt.errors import ConfigError
    from fedkt.methods import catalog

    entry = {"module": "fedkt.methods.odd", "config": None, "check": "", "flags": None,
             "summary": None}
    monkeypatch.setattr(catalog, "_REGISTRY", {})  # as in a fresh process
    monkeypatch.setattr(catalog, "_declared", lambda: {"odd": entry})
    monkeypatch.setattr(catalog, "_built_in", lambda: {"odd": "fedkt.methods.odd"})
    with pytest.raises(RuntimeError, match=r"'odd' \(fedkt.methods.odd\).*config="):
        catalog.method_config_class("odd")
    with pytest.raises(RuntimeError, match="'odd'.*summary="):
        catalog.summaries()
    with pytest.raises(RuntimeError, match="'odd'.*literals"):
        catalog.method_flag("odd", "aggregates")
    assert catalog.method_check("odd") is None  # no check given: the default, none
    with pytest.raises(ConfigError, match="method.name: unknown method 'nope'; allowed: odd"):
        catalog.method_config_class("nope")
