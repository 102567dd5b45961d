"""Share of wall time the ``local`` runtime spends outside model computation.

Runs a FedAvg job (default: the `quickstart` config, 5 rounds) and times

* model computation: local training, evaluation, model building and aggregation
  (the work any federated system must do), and
* everything else: payload serialisation, envelopes, config parsing, client
  contexts and data splits, logging, checkpoints and per-round tables.

Usage: python benchmarks/runtime_overhead.py [CONFIG] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import fedkt.federated.aggregation
import fedkt.federated.payload
import fedkt.methods.fedavg.algorithm as fedavg_module
import fedkt.runtime.base as runtime_base
import fedkt.train.lm
from fedkt.config import load_config
from fedkt.configs.catalog import resolve_config
from fedkt.models.install import check_installed, run_script
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport

ROOT = Path(__file__).resolve().parents[1]
TIMES: dict[str, float] = defaultdict(float)


def timed(bucket: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[bucket] += time.perf_counter() - t0

    return wrapper


def instrument() -> None:
    """Wrap the compute functions where methods look them up, and the wire format."""
    compute = {"train_lm": "train", "evaluate_lm": "eval", "get_lm": "build"}
    for module in (fedkt.train.lm, fedavg_module):
        for name, bucket in compute.items():
            if hasattr(module, name):
                setattr(module, name, timed(f"compute:{bucket}", getattr(module, name)))
    fedavg_module.fedavg = timed("compute:aggregate", fedkt.federated.aggregation.fedavg)
    # Serialisation (counted as overhead; reported separately).
    for module in (runtime_base,):
        module.dumps = timed("overhead:serialise", fedkt.federated.payload.dumps)
        module.loads = timed("overhead:serialise", fedkt.federated.payload.loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="quickstart",
                        help="a shipped config's name or a YAML path")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="fedkt-overhead-"))
    cfg = load_config(resolve_config(args.config),
                      [f"rounds={args.rounds}", f"output_dir={out}/run"])
    check_installed(cfg)
    instrument()
    t0 = time.perf_counter()
    run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)

    compute = sum(v for k, v in TIMES.items() if k.startswith("compute:"))
    overhead = wall - compute
    print(f"config: {args.config}  method: {cfg.method.name}  clients: "
          f"{cfg.clients.num_clients}  rounds: {args.rounds}  runtime: local")
    print(f"{'bucket':<22}{'seconds':>10}{'share':>9}")
    for key in sorted(TIMES):
        print(f"{key:<22}{TIMES[key]:>10.3f}{TIMES[key] / wall:>9.2%}")
    print(f"{'total wall time':<22}{wall:>10.3f}{1:>9.2%}")
    print(f"{'outside model compute':<22}{overhead:>10.3f}{overhead / wall:>9.2%}"
          f"   (target < 5%)")


if __name__ == "__main__":
    run_script(main)
