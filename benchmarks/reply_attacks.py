"""Hostile replies against the server's reply handling: tried, rejected, crashes, data lost.

A real FedAvg-LoRA client reply (tiny-llama, vendored intent_recognition data, one
round on the ``local`` runtime, recorded as its bytes) is the base.  Then N times, client 0
sends a variant of it from :func:`fedkt.runtime.faults.hostile_reply` (its ``metrics``, one
metric, the envelope, its seconds, the ``*_seconds`` timings, ``_error``,
``num_examples`` or ``_predictions`` replaced by junk: wrong types, NaN / Infinity,
huge numbers and strings, the server's own row keys as metric names, gzip bombs; or its
predictions under a scope name that is no file name (``a/../b``, 300 characters) or with
forged ids; its adapter finite but huge (x1e30, float max, with ``num_examples`` at its
bound); implausible numbers in ``train_loss`` or a metric (1e300, negative losses);
error text with ESC, CR, LF and a fake log line), while client 1 sends the real reply,
through the server's real :class:`~fedkt.runtime.base.RuntimeClients` (its reply
checks and its aggregation of the adapter) and the run loop's writing of client
predictions (:func:`fedkt.runtime.faults.run_attacks`).

Prints attacks tried, accepted (valid after all), rejected with a reason naming the
client, kept with its predictions refused and a warning naming it, rejected without a
name, crashes (an exception out of the server) and data lost (client 1's metrics
changed, a forged row key, a non-finite or negative number kept, a poisoned mean
adapter, a predictions file out of place or holding ids that are no test ids, unescaped
text in a log line or reason), per attacked field, and the longest time one reply took.

Usage: python benchmarks/reply_attacks.py [--attacks 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import torch

from fedkt.config import apply_overrides, parse_config
from fedkt.runtime.base import default_state_root
from fedkt.runtime.faults import run_attacks
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport


def config(run_dir: Path, *sets: str):
    data = {
        "name": "attacks", "seed": 0, "rounds": 1, "output_dir": str(run_dir),
        "method": {"name": "fedavg"},
        "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}], "min_replies": 1},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "holdout", "test_size": 24},
                 "max_private_per_client": 16, "max_length": 64},
        "runtime": {"torch_threads": 1}, "eval": {"plots": False},
    }
    return parse_config(apply_overrides(data, list(sets)), "reply_attacks")


class Recording(LocalTransport):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.train_reply = b""

    def exchange(self, requests, timeout):
        replies = super().exchange(requests, timeout)
        if 1 in replies and b'"handler": "train"' in requests[1][:4000]:
            self.train_reply = replies[1]
        return replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attacks", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("fedkt.runtime").setLevel(logging.ERROR)  # one warning per exclusion
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(Path(tmp) / "run")
        transport = Recording(default_state_root(cfg))
        run_job(cfg, transport, quiet=True)
        good = transport.train_reply
        assert good, "no train reply recorded"
        t0 = time.perf_counter()
        report = run_attacks(cfg, good, args.attacks, args.seed)
        wall = time.perf_counter() - t0
    print(f"base reply: {len(good)} bytes (fedavg, tiny-llama, client 1's round-1 train reply)")
    print(f"attacks tried        {report.tried}")
    print(f"accepted             {report.accepted}  (valid after all)")
    print(f"rejected, named      {report.rejected}")
    print(f"predictions refused  {report.refused}  (client kept, its predictions not written, "
          "a warning naming it)")
    print(f"rejected, unnamed    {report.unnamed}")
    print(f"crashes              {len(report.crashes)}")
    print(f"data lost            {len(report.lost)}")
    print("attacks per field:   " + ", ".join(f"{k} {v}" for k, v in
                                               sorted(report.by_target.items())))
    print(f"slowest reply check  {report.slowest * 1000:.1f} ms; all {wall:.1f} s")
    for line in (report.crashes + report.lost)[:10]:
        print("  ", line)


if __name__ == "__main__":
    main()
