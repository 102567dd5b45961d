"""A run's peak memory with and without one of fedkt's two memory savings.

Runs one run of a suite (by default ``suites/clinc150_fedmkt_transfer``'s ``fedmkt`` arm,
fold 0, seed 1000: SmolLM2-135M and two 12-layer clients, 30 CLINC150 intents) twice,
each in its own process with one torch thread and no reuse store, and prints side by
side its wall seconds, its peak resident memory (the process's own, from ``wait4``) and
whether every metric row matches. ``--toggle`` picks what differs:

* ``trim`` (the default): ``kept`` (``FEDKT_MALLOC_TRIM=0``: freed heap stays with the
  process, glibc's default) against ``released`` (freed heap goes back to the OS after
  each training step and when each phase ends, :mod:`fedkt.infra.memory`, fedkt's default);
* ``frozen_cast``: ``recast`` (``FEDKT_FROZEN_CAST=0``: autocast casts each frozen weight
  afresh in every forward and keeps each cast for the backward) against ``cast once``
  (frozen linear weights held in bf16 during a training loop,
  :func:`fedkt.infra.precision.frozen_linears_as`, fedkt's default). Without bf16
  (``precision: auto`` on an AVX2 machine) the two are the same run;
* ``kernel_cache``: ``1,024`` (``FEDKT_KERNEL_CACHE=0``: oneDNN's and ideep's caches of
  compiled bf16 kernels at their default size) against ``64`` (fedkt's default,
  ``fedkt/__init__.py``). Without bf16 the two are the same run.

``--small`` cuts the run to 120 test items, 100 public records and one local epoch (the
same models and phases, minutes instead of half an hour):

    python benchmarks/memory_release.py [--small] [--toggle trim|frozen_cast|kernel_cache]
        [--suite suites/...] [--arm fedmkt]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedkt import KERNEL_CACHES

if TYPE_CHECKING:
    from fedkt.config import RunConfig

# --toggle -> (its environment variable, (the name of "0", the name of "1")); "1" is fedkt's default
TOGGLES = {"trim": ("FEDKT_MALLOC_TRIM", ("kept", "released")),
           "frozen_cast": ("FEDKT_FROZEN_CAST", ("recast", "cast once")),
           "kernel_cache": ("FEDKT_KERNEL_CACHE", ("1,024", "64"))}

SMALL = ["data.max_test=120", "data.max_public=100", "data.require.min_test=100",
         "data.require.min_public=100", "training.local_epochs=1"]
# every measured run: one torch thread, nothing served from the reuse store
ISOLATED = ["runtime.torch_threads=1", "training.reuse=false", "eval.reuse=false"]


def suite_run(suite_name: str, arm: str, small: bool) -> tuple[RunConfig, str]:
    """The first run (its config) of ``arm`` in ``suite_name``, and a header line naming
    it and this machine; exits naming the arm when the suite has none."""
    import torch

    from fedkt.evidence.suite import load_suite

    runs = [(key, c) for key, c in load_suite(suite_name).runs.items() if key[0] == arm]
    if not runs:
        raise SystemExit(f"{suite_name}: no arm {arm!r}")
    (arm, seed), cfg = runs[0]
    flags = sorted(k for k, v in torch.cpu.get_capabilities().items()
                   if v and k.startswith(("amx", "avx512_bf16")))
    return cfg, (f"# {suite_name}, arm {arm}, seed {seed}{', --small' if small else ''}; "
                 f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()} "
                 f"({', '.join(flags) or 'no bf16 flags'}), {os.cpu_count()} cores, one "
                 "torch thread")


def _run(config: Path, out: Path, setting: dict[str, str], overrides: list[str]
         ) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one run in its own process, with ``setting`` in
    its environment."""
    env = {**os.environ, **setting}
    # glibc's defaults; fedkt's kernel caches, which `import fedkt` set here: each run's
    # own import decides them
    env = {k: v for k, v in env.items()
           if not k.startswith("MALLOC_") and k not in KERNEL_CACHES}
    cmd = [sys.executable, "-m", "fedkt.cli", "run", str(config), "--output-dir", str(out), "-q",
           *(x for o in (*ISOLATED, *overrides) for x in ("--set", o))]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def _rows(out: Path) -> list[dict]:
    """The run's metric rows without their timing keys (what identical runs share)."""
    from fedkt.tracking.rows import read_rows, without_timings

    return without_timings(read_rows(out / "metrics.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="suites/clinc150_fedmkt_transfer")
    parser.add_argument("--arm", default="fedmkt")
    parser.add_argument("--toggle", choices=sorted(TOGGLES), default="trim",
                        help="what the two runs differ in (default: trim)")
    parser.add_argument("--small", action="store_true", help="120 test items, 100 public "
                        "records, one local epoch")
    args = parser.parse_args()
    cfg, header = suite_run(args.suite, args.arm, args.small)
    print(f"{header}; --toggle {args.toggle}")
    variable, names = TOGGLES[args.toggle]
    off, on = names
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.yaml"
        config.write_text(cfg.to_yaml())
        results = {}
        for name, value in ((off, "0"), (on, "1")):
            folder = Path(tmp) / name.replace(" ", "_")
            wall, peak = _run(config, folder, {variable: value}, SMALL if args.small else [])
            results[name] = (wall, peak, _rows(folder))
            print(f"{name:>9}: {wall:7.1f} s wall, peak RSS {peak:7.0f} MB", flush=True)
        same = results[off][2] == results[on][2]
        print(f"peak RSS: {results[on][1] - results[off][1]:+.0f} MB; wall: "
              f"{results[on][0] - results[off][0]:+.1f} s; every metric row "
              f"{'identical' if same else 'DIFFERS'} ({len(results[off][2])} rows)")


if __name__ == "__main__":
    main()
