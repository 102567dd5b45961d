"""``runtime``: the keys common to every transport, and one section per transport
(``flower_sim``, ``flower``); the flat keys of before still work, with a warning."""

from __future__ import annotations

import warnings

import pytest
import yaml

from fedkt.config import (
    ConfigError,
    FlowerSettings,
    FlowerSimSettings,
    load_config,
    runtime_config_class,
)
from fedkt.federated.payload import Payload
from fedkt.runtime.base import RuntimeClients, client_view, envelope_config
from fedkt.runtime.local import LocalTransport

# Old flat key -> (section, value other than the default).
MOVED = {"client_cpus": ("flower_sim", 2.0), "client_gpus": ("flower_sim", 0.5),
         "superlink": ("flower", "10.0.0.1:9000"), "federation": ("flower", "fed"),
         "insecure": ("flower", False), "root_certificates": ("flower", "ca.crt")}


def test_sections_hold_each_transports_settings_with_unchanged_defaults(make_config):
    rt = runtime_config_class()()
    assert make_config().runtime == rt.model_copy(update={"torch_threads": 1})
    assert (rt.name, rt.timeout, rt.torch_threads, rt.device) == ("local", 3600.0, None, "auto")
    assert rt.flower_sim == FlowerSimSettings(client_cpus=1.0, client_gpus=0.0)
    assert rt.flower == FlowerSettings(superlink="127.0.0.1:9093", federation=None,
                                       insecure=True, root_certificates=None)


def test_new_keys_work(make_config):
    cfg = make_config("runtime.name=flower", "runtime.flower.superlink=10.0.0.1:9000",
                      "runtime.flower.insecure=false", "runtime.flower_sim.client_gpus=0.25")
    assert cfg.runtime.flower.superlink == "10.0.0.1:9000" and cfg.runtime.flower.insecure is False
    assert cfg.runtime.flower_sim.client_gpus == 0.25 and cfg.runtime.flower_sim.client_cpus == 1.0


@pytest.mark.parametrize("key", sorted(MOVED))
def test_old_flat_key_lands_in_its_section_with_a_warning(make_config, key):
    section, value = MOVED[key]
    with pytest.warns(FutureWarning) as caught:
        cfg = make_config(f"runtime.{key}={yaml.safe_dump(value).strip()}")
    assert [str(w.message) for w in caught if w.category is FutureWarning] == [
        f"runtime.{key} is now runtime.{section}.{key}"]
    assert getattr(getattr(cfg.runtime, section), key) == value
    assert not hasattr(cfg.runtime, key)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new key: no warning
        assert make_config(f"runtime.{section}.{key}={yaml.safe_dump(value).strip()}") == cfg


def test_old_keys_in_a_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "method": "fedavg", "data": {"dataset": {"name": "intent_recognition"}},
        "runtime": {"name": "flower", "superlink": "10.0.0.1:9000", "client_cpus": 2,
                    "flower": {"federation": "fed"}}}))
    with pytest.warns(FutureWarning) as caught:
        cfg = load_config(path, ["runtime.insecure=false"])  # an override: the same way
    assert sorted(str(w.message) for w in caught) == [
        "runtime.client_cpus is now runtime.flower_sim.client_cpus",
        "runtime.insecure is now runtime.flower.insecure",
        "runtime.superlink is now runtime.flower.superlink"]
    assert cfg.runtime.flower == FlowerSettings(superlink="10.0.0.1:9000", federation="fed",
                                                insecure=False)
    assert cfg.runtime.flower_sim.client_cpus == 2.0
    # The config as written: the new layout, read back without warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = yaml.safe_load(cfg.to_yaml())["runtime"]
        assert "superlink" not in again and again["flower"]["superlink"] == "10.0.0.1:9000"


@pytest.mark.parametrize("old, new", [("superlink", "flower.superlink"),
                                      ("client_cpus", "flower_sim.client_cpus")])
def test_old_and_new_key_both_given_is_refused_naming_both(make_config, old, new):
    with pytest.raises(ConfigError) as err:
        make_config(f"runtime.{old}=2", f"runtime.{new}=3")
    text = str(err.value)
    assert f"runtime.{new}: given twice" in text and f"runtime.{old} (the old key)" in text


def test_unknown_key_in_a_section_is_named(make_config):
    with pytest.raises(ConfigError, match=r"runtime\.flower\.xyz: unknown key"):
        make_config("runtime.flower.xyz=1")
    with pytest.raises(ConfigError, match=r"runtime\.flower_sim\.superlink: unknown key"):
        make_config("runtime.flower_sim.superlink=x")  # a key of another section
    with pytest.raises(ConfigError, match=r"runtime\.xyz: unknown key"):
        make_config("runtime.xyz=1")


def test_client_view_of_a_default_config_has_no_transport_sections(make_config):
    cfg = make_config()
    data = yaml.safe_load(envelope_config(cfg))
    assert data["runtime"] == {"torch_threads": 1}  # set by the test config; nothing else
    view = client_view(make_config("runtime.name=flower", "runtime.flower.superlink=h:1",
                                   "runtime.flower_sim.client_cpus=3", "runtime.timeout=5"))
    # The built-in sections at their defaults: what the server set for its transport
    # does not travel (the class is the one a loaded config's runtime has).
    assert view.runtime == runtime_config_class()(torch_threads=1)
    assert view.runtime.flower.superlink != "h:1" and view.runtime.flower_sim.client_cpus != 3
    assert view.runtime.timeout != 5
    assert envelope_config(view) == envelope_config(cfg)


def _requests(cfg) -> dict[int, bytes]:
    clients = RuntimeClients(cfg, LocalTransport(cfg.run_dir / "clients"))
    clients.start_round(1)
    return clients._requests("train", {0: Payload(x=1), 1: Payload(x=2)}, evaluate=False)


def test_old_flat_keys_and_new_sections_give_identical_requests(make_config):
    plain = _requests(make_config())
    with pytest.warns(FutureWarning):
        old = make_config("runtime.name=flower-sim", "runtime.client_cpus=2",
                          "runtime.superlink=10.0.0.1:9000", "runtime.insecure=false")
    new = make_config("runtime.name=flower-sim", "runtime.flower_sim.client_cpus=2",
                      "runtime.flower.superlink=10.0.0.1:9000", "runtime.flower.insecure=false")
    assert old == new
    assert _requests(old) == _requests(new) == plain  # transport settings never travel


def test_fedkt_run_shows_the_renamed_key(tmp_path):
    """The CLI shows a config's renamed keys (FutureWarnings are shown by default)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"method": "fedavg", "rounds": 0,  # invalid: stops early
                                    "data": {"dataset": {"name": "intent_recognition"}},
                                    "runtime": {"client_cpus": 2}}))
    done = subprocess.run([sys.executable, "-m", "fedkt.cli", "run", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "FutureWarning: runtime.client_cpus is now runtime.flower_sim.client_cpus" \
        in done.stderr and "rounds" in done.stderr


def test_a_run_folder_written_before_the_sections_resumes_without_warnings(tmp_path):
    """A run folder's config.yaml (fedkt's own dump) of before lists every flat key."""
    from fedkt.cli import _run_config

    data = {"method": {"name": "fedavg"}, "data": {"dataset": {"name": "intent_recognition"}},
            "runtime": {"name": "local", "client_cpus": 1.0, "client_gpus": 0.0,
                        "superlink": "127.0.0.1:9093", "federation": None, "insecure": True,
                        "root_certificates": None, "timeout": 3600.0, "torch_threads": 1,
                        "device": "auto"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = _run_config(tmp_path, [f"output_dir={tmp_path}"])
    assert cfg.runtime == runtime_config_class()(torch_threads=1)
