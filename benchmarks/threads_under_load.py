"""Torch thread and OpenMP wait settings on an idle and on a loaded machine, side by side.

One measurement is a fresh process (OpenMP reads its settings when torch loads) that
times ``--reps`` fp32 forward passes of a real model (default SmolLM2-135M, offline
alias ``smollm2-135m``) over a batch of ``--batch`` x ``--length`` tokens, after one
warm-up pass. The settings compared:

* ``spin``: torch's default threads (one per core) with OpenMP's default wait policy,
  which spins a waiting thread before it sleeps (``OMP_WAIT_POLICY`` unset, as torch
  runs when fedkt is not the first import);
* ``passive``: the same threads with ``OMP_WAIT_POLICY=PASSIVE`` (fedkt's default since
  0.1.0: ``import fedkt`` sets it when the variable is unset and torch is not yet loaded);
* ``spin 10k``: the default policy with a shorter spin (``GOMP_SPINCOUNT=10000``; libgomp's
  default is 300,000 spins);
* ``1 thread``: one torch thread (what ``fedkt suite run --jobs N`` gives each job on N
  cores).

Each setting runs on the idle machine and beside a second job on all cores doing float32
matrix products: with OpenMP's default (spinning) policy, as another user's torch job
would, and with the setting's own threads and policy, as a second fedkt job (two suites
at once) would. The seconds per forward pass are printed (median
and range), with the load average before and after.

    python benchmarks/threads_under_load.py [--reps 5] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {
    "spin": {"threads": None, "env": {}},
    "passive": {"threads": None, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    "spin 10k": {"threads": None, "env": {"GOMP_SPINCOUNT": "10000"}},
    "1 thread": {"threads": 1, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
}


def worker(args: argparse.Namespace) -> None:
    """Time the forward passes (in a process whose OpenMP settings the parent chose)."""
    import torch

    from fedkt.config import ModelConfig
    from fedkt.infra.precision import physical_cores
    from fedkt.models import load_causal_lm

    torch.set_num_threads(args.threads or physical_cores())
    model, _ = load_causal_lm(ModelConfig(name=args.model))
    model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.length), generator=gen)
    times = []
    with torch.inference_mode():
        for i in range(args.reps + 1):
            start = time.perf_counter()
            model(input_ids=ids)
            if i:  # the first pass warms up
                times.append(time.perf_counter() - start)
    print(json.dumps({"times": times, "threads": torch.get_num_threads()}))


def _env(setting: str | None) -> dict[str, str]:
    """This process's environment with the OpenMP settings of ``setting`` only."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    if setting is not None:
        env.update(SETTINGS[setting]["env"])
    return env


def load_job(setting: str | None) -> subprocess.Popen:
    """A second job on every core: float32 matrix products, with OpenMP's default policy
    (``setting`` None: another user's torch job) or with ``setting``'s (a second fedkt job)."""
    threads = SETTINGS[setting]["threads"] if setting else None
    code = ("import torch\n" + (f"torch.set_num_threads({threads})\n" if threads else "")
            + "x = torch.randn(1024, 1024)\nwhile True:\n    x = torch.tanh(x @ x * 1e-3)\n")
    return subprocess.Popen([sys.executable, "-c", code], env=_env(setting))


def measure(args: argparse.Namespace, setting: str) -> dict:
    spec = SETTINGS[setting]
    env = _env(setting)
    cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--reps", str(args.reps),
           "--batch", str(args.batch), "--length", str(args.length)]
    if spec["threads"]:
        cmd += ["--threads", str(spec["threads"])]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    print(f"machine: {os.cpu_count()} logical CPUs, {torch.backends.cpu.get_cpu_capability()}; "
          f"model {args.model}, fp32 forward of {args.batch} x {args.length} tokens, "
          f"{args.reps} passes after a warm-up")
    rows = []
    for state in ("idle", "beside a torch job", "beside a job like it"):
        load0 = os.getloadavg()[0]
        for setting in SETTINGS:
            job = None
            if state != "idle":
                job = load_job(setting if state == "beside a job like it" else None)
                time.sleep(3)  # let the second job reach full speed
            try:
                res = measure(args, setting)
            finally:
                if job:
                    job.kill()
                    job.wait()
            rows.append((state, setting, res["threads"], res["times"]))
        print(f"{state}: load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after")
    print("\n| machine | setting | torch threads | s per forward (median) | min - max |")
    print("|---|---|---:|---:|---:|")
    for state, setting, threads, times in rows:
        print(f"| {state} | {setting} | {threads} | {statistics.median(times):.3f} | "
              f"{min(times):.3f} - {max(times):.3f} |")


if __name__ == "__main__":
    main()
