"""Adding a runtime: ``register_runtime(name, start, settings=Model)`` outside fedkt, and a
config that names it is validated (its section by its model) and runs on it through the
``fedkt`` command (which imports the plugin named in ``FEDKT_PLUGINS``), with the local
runtime's results; before it is registered, the name is refused with the registered
runtimes listed."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys

import pytest
import yaml

from fedkt.cli import main
from fedkt.config import ConfigError, load_config
from fedkt.config import runtime_catalog as catalog
from fedkt.runner import run
from fedkt.runtime import registry
from fedkt.tracking import METRICS_FILE, read_rows, without_timings
from tests.conftest import ROOT, small_config

BYTES = ("bytes_sent", "bytes_received")


@pytest.fixture
def journal(monkeypatch):
    """The plugin runtime, registered for this test only."""
    monkeypatch.setattr(catalog, "_SETTINGS", dict(catalog._SETTINGS))
    monkeypatch.setattr(registry, "_STARTS", dict(registry._STARTS))
    plugin = importlib.import_module("tests.support.plugin_runtime")
    catalog._SETTINGS.pop(plugin.NAME, None)  # as before the plugin's import
    registry._STARTS.pop(plugin.NAME, None)
    return plugin


def test_a_runtime_registered_outside_fedkt_validates_its_section_and_runs_a_job(
        tmp_path, journal, capsys):
    log = tmp_path / "journal.jsonl"
    sets = ("rounds=1", "runtime.name=journal", f"runtime.journal.log={log}")
    with pytest.raises(ConfigError, match=r"runtime\.name: unknown runtime 'journal'; "
                                          r"registered: flower, flower-sim, local"):
        small_config(tmp_path / "refused", *sets)
    with pytest.raises(ConfigError, match=r"runtime\.journal: unknown key"):
        small_config(tmp_path / "refused", f"runtime.journal.log={log}")

    journal.install()
    assert "journal" in registry.available_runtimes()
    # Its section is validated by the model it registered, errors naming the key.
    with pytest.raises(ConfigError, match=r"runtime\.journal\.reverse: .*boolean"):
        small_config(tmp_path / "bad", *sets, "runtime.journal.reverse=maybe")
    with pytest.raises(ConfigError, match=r"runtime\.journal\.colour: unknown key"):
        small_config(tmp_path / "bad", *sets, "runtime.journal.colour=red")
    with pytest.raises(ConfigError, match=r"runtime\.journal\.log: Field required"):
        small_config(tmp_path / "bad", "runtime.name=journal")
    with pytest.raises(ConfigError, match=r"runtime\.name: unknown runtime 'jornal'; "
                                          r"registered: flower, flower-sim, journal, local"):
        small_config(tmp_path / "bad", "runtime.name=jornal")
    # A config that does not use it does not carry its section.
    local = small_config(tmp_path / "local", "rounds=1")
    assert "journal" not in yaml.safe_load(local.to_yaml())["runtime"]

    cfg = small_config(tmp_path / "journal", *sets)
    assert cfg.runtime.journal == journal.JournalSettings(log=str(log), reverse=True)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    path = tmp_path / "job.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg

    # The command in a fresh process, which registers the runtime from FEDKT_PLUGINS.
    env = {**os.environ, "FEDKT_PLUGINS": "tests.support.plugin_runtime",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "fedkt.cli", "run", str(path), "-q"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    got = read_rows(cfg.run_dir / METRICS_FILE)
    want = run(local, quiet=True)
    strip = [[{k: v for k, v in r.items() if k not in BYTES} for r in without_timings(rows)]
             for rows in (got, want)]
    assert strip[0] == strip[1] and len(got) >= 4
    for g, w in zip(got, want, strict=True):
        for key in BYTES:  # a reply carries its handler's seconds: a few bytes may differ
            assert abs(g.get(key, 0) - w.get(key, 0)) <= 8, (key, g, w)
    # The job went through the plugin's transport: every exchange, clients last id first.
    exchanges = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(exchanges) >= 2 and all(e["clients"] == [1, 0] for e in exchanges)
    assert all(b > 0 for e in exchanges for b in e["request_bytes"])
    assert yaml.safe_load((cfg.run_dir / "config.yaml").read_text())["runtime"]["journal"] \
        == {"log": str(log), "reverse": True}


def test_a_plugin_that_does_not_import_is_named(tmp_path, monkeypatch, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(small_config(tmp_path / "run", "rounds=1").to_yaml())
    monkeypatch.setenv("FEDKT_PLUGINS", "tests.no_such_plugin")
    assert main(["run", str(path)]) == 2
    assert "fedkt: error: FEDKT_PLUGINS='tests.no_such_plugin': No module named " \
        "'tests.no_such_plugin'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
