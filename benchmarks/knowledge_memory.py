"""Peak memory of one FedMKT knowledge set (top-K logits and per-sample losses on D_p) with
its losses computed on the whole batch at once against a few rows at a time.

Builds a suite run's server (by default ``suites/fedmkt_table4_arc_easy``'s ``fedmkt`` arm,
seed 0: Qwen2.5-Coder-0.5B, a 151,936-token vocabulary, ARC-Easy) and computes the
knowledge set of its first ``--rows`` public records at the run's ``eval.batch_size``,
twice, each in its own process with one torch thread. It prints side by side the peak
resident memory of each process (:func:`fedkt.infra.memory.peak_rss_mb`, MB = 10**6
bytes), the knowledge set's seconds and whether
the losses and top-K values are the same to the bit:

* ``whole batch``: the per-sample losses on the whole batch's logits at once (their fp32
  copy and log-softmax), as fedkt did before;
* ``chunked``: a few rows at a time (:data:`fedkt.alignment.knowledge.LOSS_CHUNK_ELEMENTS`,
  fedkt's default).

    fedkt models install qwen2.5-0.5b smollm2-135m
    python benchmarks/knowledge_memory.py [--suite suites/...] [--arm fedmkt] [--rows 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from fedkt.alignment import knowledge as K
from fedkt.evidence.suite import load_suite
from fedkt.infra.memory import peak_rss_mb
from fedkt.infra.precision import autocast
from fedkt.methods import get_method
mode, suite_path, arm, rows, out, folder = sys.argv[1:7]
if mode == "whole":
    K.LOSS_CHUNK_ELEMENTS = 1 << 62
suite = load_suite(suite_path, folder)
seed = suite.seeds[0]
cfg = suite.runs[(arm, seed)]
server = get_method(cfg.method.name).server(cfg, f"{folder}/run_{mode}")
server.setup()
sub = K.PublicSet(server.public.seqs[:int(rows)], server.public.pad_id)
start = time.perf_counter()
with autocast(cfg, server.llm.model):
    s = K.knowledge_set(server.llm, sub, cfg.method.top_k, batch_size=cfg.eval.batch_size)
seconds = time.perf_counter() - start
torch.save({"losses": s.losses, "values": s.values}, out)
print(json.dumps({"peak_mb": peak_rss_mb(),
                  "seconds": seconds, "rows": len(sub), "width": max(sub.lengths)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="suites/fedmkt_table4_arc_easy")
    ap.add_argument("--arm", default="fedmkt")
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        got = {}
        for mode in ("whole", "chunked"):
            out = f"{tmp}/{mode}.pt"
            proc = subprocess.run([sys.executable, "-c", CHILD, mode, args.suite, args.arm,
                                   str(args.rows), out, tmp], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{mode}: failed\n{proc.stderr[-2000:]}")
            got[mode] = (json.loads(proc.stdout.strip().splitlines()[-1]), torch.load(out))
        for mode, label in (("whole", "whole batch"), ("chunked", "chunked")):
            info = got[mode][0]
            print(f"{label:>12}: {info['seconds']:6.1f} s, peak RSS {info['peak_mb']:7.0f} MB "
                  f"({info['rows']} rows, width {info['width']})")
        same = all(torch.equal(got["whole"][1][k], got["chunked"][1][k])
                   for k in ("losses", "values"))
        print(f"peak RSS: {got['chunked'][0]['peak_mb'] - got['whole'][0]['peak_mb']:+.0f} MB; "
              f"losses and top-K values {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
