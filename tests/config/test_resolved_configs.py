"""Every shipped run config (not a suite) resolves to the YAML recorded in
``tests/config/resolved_configs.json``: a change to how methods, their configs or their
defaults are found must leave what a shipped config means as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.config import load_config
from fedkt.configs.catalog import CONFIGS_DIR

RECORDED = Path(__file__).with_name("resolved_configs.json")


def _shipped() -> list[str]:
    """Each shipped run config's path under ``fedkt/configs/``, suites left out."""
    return sorted(p.relative_to(CONFIGS_DIR).as_posix() for suffix in ("*.yaml", "*.yml")
                  for p in CONFIGS_DIR.rglob(suffix)
                  if "suites" not in p.relative_to(CONFIGS_DIR).parts)


def _recorded() -> dict[str, str]:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


def test_every_shipped_config_has_a_recorded_resolution():
    shipped, recorded = set(_shipped()), set(_recorded())
    assert len(shipped) >= 40
    # A new shipped config adds its entry: json key its path under fedkt/configs/, value
    # load_config(path).to_yaml().
    assert not shipped - recorded, f"shipped configs with no entry in {RECORDED.name}: " \
        f"{sorted(shipped - recorded)}"
    assert not recorded - shipped, f"{RECORDED.name} entries with no config: " \
        f"{sorted(recorded - shipped)}"


@pytest.mark.parametrize("name", sorted(_recorded()))
def test_a_shipped_config_resolves_as_recorded(name: str):
    assert load_config(str(CONFIGS_DIR / name)).to_yaml() == _recorded()[name], name
