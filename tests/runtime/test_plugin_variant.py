"""A plugin's variant of a fedkt method, registered outside fedkt with one of fedkt's
server classes (``tests/support/plugin_method.py``), runs on ``flower-sim``: the registry records
the module that called ``register`` (not the server class's module, which is fedkt's and
does not register the variant), so each Flower worker imports the plugin again."""

from __future__ import annotations

import importlib
import sys

import pytest

from fedkt.config import method_catalog as catalog
from fedkt.runner import run
from tests.conftest import small_config

MODULE = "tests.support.plugin_method"
# Its name, not imported: importing the module at collection would register the variant
# for the whole session (and into docs/configuration.md's reference).
NAME = "fedavg_plugin_variant"


@pytest.fixture
def variant():
    """The variant registered for this test only, by importing its module; removed after
    (only it: the built-in methods its import registers stay registered)."""
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    assert module.NAME == NAME
    yield module
    catalog._REGISTRY.pop(NAME, None)
    catalog._REGISTERED_BY.pop(NAME, None)
    sys.modules.pop(MODULE, None)


def test_register_records_the_calling_module(variant):
    assert variant.METHOD.server.__module__ == "fedkt.methods.fedavg.algorithm"
    assert catalog.plugin_module(NAME) == MODULE
    catalog.register(variant.METHOD, module="elsewhere.plugin")  # or the one it names
    assert catalog.plugin_module(NAME) == "elsewhere.plugin"
    assert catalog.plugin_module("fedavg") is None  # built in: found without an import


# Ray and a tiny Llama in each worker: 279 s wall on 2 cores shared with other jobs (load
# 11), well over the default run's budget.
@pytest.mark.slow
def test_a_plugin_variant_of_a_fedkt_server_runs_on_flower_sim(tmp_path, variant):
    from tests.runtime.test_flower_sim import assert_same_rows

    sets = ("rounds=1", "eval.clients=false")
    sim = run(small_config(tmp_path / "a" / "sim", *sets, "runtime.name=flower-sim",
                           "runtime.timeout=300", method=NAME), quiet=True)
    local = run(small_config(tmp_path / "a" / "loc", *sets, method=NAME), quiet=True)
    assert not [r for r in sim if "excluded" in r]
    assert_same_rows(sim, local)
    assert [r["participant"] for r in sim if r["round"] == 1].count("server") >= 1
