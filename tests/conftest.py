"""Shared fixtures: a small, fast run config on tiny models and vendored data."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from fedkt.config import RunConfig, apply_overrides, parse_config

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module (benchmarks are scripts, not a package), loaded
    once and registered in ``sys.modules`` (a dataclass defined there needs it)."""
    key = f"fedkt_benchmark_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def needs_models(*aliases: str) -> pytest.MarkDecorator:
    """Skip unless these offline aliases are installed; the reason names the command to run."""
    from fedkt.models.install import install_hint, missing_aliases

    missing = missing_aliases(aliases)
    return pytest.mark.skipif(bool(missing), reason=install_hint(missing) if missing else "")


def small_config(run_dir: Path, *overrides: str, method: str = "fedavg") -> RunConfig:
    """A 2-client, 2-round FedAvg-LoRA job on tiny-llama that runs in seconds."""
    data = {
        "name": "test", "seed": 0, "rounds": 2, "output_dir": str(run_dir),
        "method": {"name": method},
        "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "holdout", "test_size": 24},
                 "max_private_per_client": 32, "max_length": 64},
        # training.reuse off: a test that patches training must see it run (tests of the
        # reuse itself turn it on)
        "training": {"lr": 2e-3, "batch_size": 8, "reuse": False},
        "runtime": {"torch_threads": 1},
        "eval": {"batch_size": 32, "plots": False},  # curves only where a test reads them
    }
    return parse_config(apply_overrides(data, list(overrides)), "test config")


def run_data_of(cfg: RunConfig) -> FederatedData:
    """The run's data (its splits and task), as a method's server and clients hold it."""
    from fedkt.data.splits import run_data

    return run_data(cfg.data, cfg.clients.num_clients, cfg.seed)


def final_test_rows(rows: list[dict]) -> dict[str, dict]:
    """Each participant's last test row (timings and its round aside), from run_job's rows
    (as metrics.jsonl holds them): for comparing two runs' final numbers."""
    from fedkt.tracking import without_timings

    return {r["participant"]: {k: v for k, v in r.items() if k not in ("round", "split")}
            for r in without_timings(rows) if r.get("split") == "test"}


def suite_claims_text(folder: Path) -> str:
    """A suite folder's suite.md up to "Where the time went", its folder's path removed and
    without the lines two runs of one suite do not share (the command that ran it, with
    its time, and each arm's peak memory): for comparing two runs' tables and claims."""
    text = (folder / "suite.md").read_text().replace(str(folder), "")
    return "\n".join(x for x in text.split("## Where the time went")[0].splitlines()
                     if not x.startswith(("- run by: ", "- peak memory of a run")))


def finished_run(tmp_path_factory, *overrides: str) -> Path:
    """A finished FedAvg run on tiny models (``small_config`` with ``overrides``), run once
    per module by the run-folder tests, which copy its folder."""
    from fedkt.runtime.base import default_state_root
    from fedkt.runtime.job import run_job
    from fedkt.runtime.local import LocalTransport

    cfg = small_config(tmp_path_factory.mktemp("runs") / "done", *overrides)
    run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    return cfg.run_dir


def copy_of(finished: Path, tmp_path: Path) -> Path:
    """A copy of a :func:`finished_run` folder at ``tmp_path / "run"``, for one test to change."""
    where = tmp_path / "run"
    shutil.copytree(finished, where)
    return where


@pytest.fixture
def make_config(tmp_path):
    def make(*overrides: str, method: str = "fedavg", name: str = "run") -> RunConfig:
        return small_config(tmp_path / name, *overrides, method=method)

    return make


@pytest.fixture(scope="session", autouse=True)
def _session_reuse_store(tmp_path_factory):
    """Stored evaluations and knowledge (fedkt.eval.reuse) of this pytest run only: never those
    of an earlier run (other code, or a scorer a test patched) from the shared cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDKT_REUSE_CACHE", str(tmp_path_factory.mktemp("reuse")))
        yield


@pytest.fixture(autouse=True)
def reuse_store(tmp_path_factory, monkeypatch) -> Path:
    """Each test starts from an empty reuse store (``$FEDKT_REUSE_CACHE``), so what one
    test computes never stands in for what another computes."""
    path = tmp_path_factory.mktemp("reuse")
    monkeypatch.setenv("FEDKT_REUSE_CACHE", str(path))
    return path


HEAVY = ROOT / "tests" / "heavy.txt"


def pytest_collection_modifyitems(config, items):
    """Mark ``heavy`` the default tests listed in tests/heavy.txt (measured at 0.5 s or more
    each): ``python -m pytest -m "not slow and not heavy"`` is the fast tier.  A listed
    test id also marks its parametrisations (``test_x`` marks ``test_x[a]``); a listed
    file (``.py``) or folder (``/``) marks every test in it."""
    seconds = _heavy_entries()
    listed = set(seconds)
    prefixes = tuple(e for e in listed if e.endswith((".py", "/")))
    for item in items:
        name = item.nodeid.partition("[")[0]
        if {item.nodeid, name} & listed or item.nodeid.partition("::")[0].startswith(prefixes):
            item.add_marker(pytest.mark.heavy)
    # Longest files first: pytest-xdist's --dist loadfile hands out whole files in this
    # order, so the files that take minutes start at once instead of last (the run then
    # ends with short files on both workers). Stable: the order inside a file is kept.
    cost: dict[str, float] = {}
    for entry, s in seconds.items():
        path = entry.partition("::")[0]
        cost[path] = cost.get(path, 0.0) + s
    items.sort(key=lambda item: -cost.get(item.nodeid.partition("::")[0], 0.0))


def _heavy_entries() -> dict[str, float]:
    """tests/heavy.txt's entries, each with the seconds its ``# 2.5s`` note records (0 where
    the note gives none)."""
    lines = HEAVY.read_text(encoding="utf-8").splitlines() if HEAVY.is_file() else []
    entries: dict[str, float] = {}
    for line in lines:
        entry, _, note = line.partition("#")
        if entry.strip():
            measured = re.match(r"\s*([0-9.]+)s", note)
            entries[entry.strip()] = float(measured.group(1)) if measured else 0.0
    return entries
