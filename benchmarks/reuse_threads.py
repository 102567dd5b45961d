"""Does a stored result ever answer for another thread count? Side by side in one run.

Runs ``fedkt run fedcollm/tiny`` (tiny random models, 2 rounds, bf16 where native) four
times, each in its own process and run folder, and prints every row's test loss:

* ``1 thread``: ``runtime.torch_threads=1``, an empty reuse store (the store A);
* ``2 threads``: ``runtime.torch_threads=2``, another empty store (B);
* ``2 threads on A``: ``torch_threads=2`` reading the store the 1-thread run filled;
* ``1 thread on A``: ``torch_threads=1`` on A again (every evaluation served).

Where the kernels make the thread count move a number (AMX's bf16 kernels did), the first
two columns differ; the third must equal the second (nothing of A served) and the fourth
the first. ``--env`` runs it all under kernel settings, e.g.
``--env ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``. The last line says whether it held.

    python benchmarks/reuse_threads.py [--config fedcollm/tiny] [--env VAR=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(config: str, threads: int, store: Path, out: Path, env: dict[str, str]) -> tuple[
        dict[tuple[int, str], float], float]:
    """Every test row's loss by (round, participant), and (-1, "served"): the evaluation
    seconds the reuse store spared; with the run's wall seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedkt.cli", "run", config, "--output-dir", str(out),
                    "-q", "--set", f"runtime.torch_threads={threads}"],
                   env={**os.environ, **env, "FEDKT_REUSE_CACHE": str(store)}, check=True,
                   stdout=subprocess.DEVNULL)
    rows: dict[tuple[int, str], float] = {}
    saved = 0.0
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        saved += row.get("eval_saved_seconds", 0.0)
        if row.get("split") == "test" and "loss" in row:
            rows[(row["round"], row["participant"])] = row["loss"]
    rows[(-1, "served")] = saved  # the store's answers: evaluation seconds it spared
    return rows, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="fedcollm/tiny")
    parser.add_argument("--env", nargs="*", default=[], metavar="VAR=VALUE")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    import torch

    flags = sorted(k for k, v in torch.cpu.get_capabilities().items()
                   if v and k.startswith(("amx", "avx512_bf16")))
    print(f"machine: {torch.backends.cpu.get_cpu_capability()}, {' '.join(flags) or 'no bf16'}"
          f"; env: {' '.join(args.env) or '(none)'}; config {args.config}")
    with tempfile.TemporaryDirectory(prefix="fedkt-reuse-threads-") as tmp:
        root = Path(tmp)
        a, b = root / "store_a", root / "store_b"
        plan = [("1 thread", 1, a), ("2 threads", 2, b), ("2 threads on A", 2, a),
                ("1 thread on A", 1, a)]
        cols, secs = {}, {}
        for i, (label, threads, store) in enumerate(plan):
            cols[label], secs[label] = _run(args.config, threads, store, root / f"run{i}", env)
    keys = sorted(k for k in cols["1 thread"] if k[0] >= 0)
    width = max(len(label) for label, *_ in plan) + 2
    print(f"{'round participant':<24}" + "".join(f"{label:>{width}}" for label, *_ in plan))
    for key in keys:
        print(f"{key[0]:<6}{key[1]:<18}" + "".join(
            f"{cols[label].get(key, float('nan')):>{width}.6f}" for label, *_ in plan))
    print(f"{'eval s served by store':<24}" + "".join(
        f"{cols[label][(-1, 'served')]:>{width}.2f}" for label, *_ in plan))
    print(f"{'wall (s)':<24}" + "".join(f"{secs[label]:>{width}.1f}" for label, *_ in plan))
    moved = sum(cols["1 thread"][k] != cols["2 threads"].get(k) for k in keys)
    same = all(cols["2 threads on A"][k] == cols["2 threads"][k]
               and cols["1 thread on A"][k] == cols["1 thread"][k] for k in keys)
    # A served answer spares seconds; the 2-thread run on A must be spared none of A's.
    held = same and cols["2 threads on A"][(-1, "served")] <= cols["2 threads"][(-1, "served")]
    print(f"rows the thread count moved: {moved} of {len(keys)}; "
          f"the store answered only for its own thread count: {'yes' if held else 'NO'}")
    if not held:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
