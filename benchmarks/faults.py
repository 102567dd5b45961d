"""Faulty clients in a FedAvg job: what gets excluded, what completes, what it costs.

A FedAvg-LoRA job on tiny-llama (vendored intent_recognition data, N clients,
R rounds, ``clients.min_replies`` set) runs over :class:`fedkt.runtime.faults.FaultyTransport`
wrapping the ``local`` runtime:

(a) transient faults: each (client, round) crashes with probability ``--p-crash`` and
    otherwise sends a malformed reply with probability ``--p-bad`` (NaN values, wrong
    shape, wrong dtype or garbage bytes, drawn uniformly).  A round with fewer than
    ``min_replies`` usable replies fails; the script then resumes the run (faults are
    re-drawn for the new attempt), up to ``--retries`` times.  Prints rounds
    completed, injected faults against clients excluded per reason, failed rounds and
    wall time.
(b) persistent faults: each client is faulty with probability ``--persistent-rate``
    (default p_crash + p_bad), in every round from round 1, with one fault kind.  The
    same job then runs with ``clients.participants`` = the healthy clients and no
    faults; the script prints whether the final server adapter is identical (max abs
    difference) and the final metrics equal.

Usage: python benchmarks/faults.py [--clients 6] [--rounds 4] [--p-crash 0.1]
       [--p-bad 0.1] [--min-replies 3] [--seed 0] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file

from fedkt.config import RunConfig, apply_overrides, parse_config
from fedkt.runtime.base import RoundError
from fedkt.runtime.base import default_state_root as client_state_root
from fedkt.runtime.faults import (
    CRASH,
    KINDS,
    MALFORMED,
    FaultyTransport,
    persistent_plan,
    transient_plan,
)
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import RunRecorder, format_table, without_timings
from fedkt.tracking.folder import SERVER_STATE

# Which injected fault an exclusion reason points to.
REASONS = {
    "crash": r"injected crash",
    "nan": r"non-finite",
    "shape": r": shape \(",
    "dtype": r": dtype ",
    "garbage": r"bad magic|malformed payload",
}


def job_config(run_dir: Path, args: argparse.Namespace, *extra: str) -> RunConfig:
    data = {
        "name": run_dir.name, "seed": args.seed, "rounds": args.rounds,
        "output_dir": str(run_dir), "method": {"name": "fedavg"},
        "clients": {"num_clients": args.clients, "models": [{"name": "tiny-llama"}],
                    "min_replies": args.min_replies},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "holdout", "test_size": 24},
                 "max_private_per_client": 32, "max_length": 64},
        "training": {"lr": 2e-3, "batch_size": 8},
        "runtime": {"torch_threads": args.threads},
        "eval": {"batch_size": 32},
    }
    return parse_config(apply_overrides(data, [*args.set, *extra]), "benchmarks/faults.py")


def reason_kind(reason: str) -> str:
    for kind, pattern in REASONS.items():
        if re.search(pattern, reason):
            return kind
    return "other"


def exclusions(rows: list[dict]) -> dict[tuple[int, int], str]:
    """(round, cid) -> exclusion reason, from a run's metrics rows."""
    return {(r["round"], int(r["participant"].split("_")[1])): r["excluded"]
            for r in rows if r.get("excluded") and r["participant"].startswith("client_")}


def final_test_rows(rows: list[dict]) -> dict[str, dict]:
    """Each participant's last test row, timings and its round aside."""
    return {r["participant"]: {k: v for k, v in r.items() if k not in ("round", "split")}
            for r in without_timings(rows) if r.get("split") == "test"}


def final_state(cfg: RunConfig) -> dict[str, torch.Tensor]:
    rec = RunRecorder(cfg.run_dir, resume=True)
    done = rec.last_complete_round()
    return load_file(str(rec.checkpoint_dir(done) / SERVER_STATE)) if done else {}


def transient(args: argparse.Namespace, root: Path) -> None:
    cfg = job_config(root / "transient", args)
    print(f"(a) transient faults: {args.clients} clients, {args.rounds} rounds, min_replies "
          f"{args.min_replies}, p_crash {args.p_crash}, p_bad {args.p_bad}, seed {args.seed}")
    injected: dict[tuple[int, int], str] = {}
    failed: list[list[object]] = []
    t0 = time.perf_counter()
    done = 0
    for attempt in range(args.retries + 1):
        transport = FaultyTransport(LocalTransport(client_state_root(cfg)),
                                    transient_plan(args.p_crash, args.p_bad, args.seed, attempt),
                                    seed=args.seed + attempt)
        start = done + 1
        try:
            run_job(cfg, transport, resume=attempt > 0, quiet=True)
            error = None
        except RoundError as exc:
            error = exc
        done = RunRecorder(cfg.run_dir, resume=True).last_complete_round()
        # Faults of rounds this attempt completed (a failed round's rows are not kept).
        injected.update({k: v for k, v in transport.injected.items() if start <= k[0] <= done})
        if error is None:
            break
        failed.append([str(done + 1), str(attempt), str(error).split(". ")[0]])
    wall = time.perf_counter() - t0
    rows = RunRecorder(cfg.run_dir, resume=True).rows()
    excluded = exclusions(rows)
    matched = sum(1 for key, kind in injected.items()
                  if key in excluded and reason_kind(excluded[key]) == kind)
    print(f"rounds completed: {done} of {args.rounds} (attempts: {len(failed) + 1}), "
          f"wall time {wall:.1f} s")
    inj, exc = Counter(injected.values()), Counter(reason_kind(r) for r in excluded.values())
    table = [[k, str(inj.get(k, 0)), str(exc.get(k, 0))] for k in [*KINDS, "other"]]
    print(format_table(["fault", "injected", "excluded with this reason"], table))
    print(f"injected faults excluded with the matching reason: {matched} of {len(injected)}; "
          f"exclusions without an injected fault: {len(set(excluded) - set(injected))}")
    replied = [r["clients_replied"] for r in rows
               if r["participant"] == "server" and r["split"] == "train"]
    print(f"clients replied per completed round: {replied}")
    if failed:
        print("failed rounds (then resumed):")
        print(format_table(["round", "attempt", "error"], failed))
    print()


def persistent(args: argparse.Namespace, root: Path) -> None:
    rate = args.p_crash + args.p_bad if args.persistent_rate is None else args.persistent_rate
    rng = random.Random(f"persistent/{args.seed}")
    faulty: dict[int, str] = {}
    for cid in range(args.clients):
        if rng.random() < rate:
            crash = rng.random() < args.p_crash / max(args.p_crash + args.p_bad, 1e-12)
            faulty[cid] = CRASH if crash else rng.choice(MALFORMED)
    healthy = [c for c in range(args.clients) if c not in faulty]
    print(f"(b) persistent faults (rate {rate:.2f}): faulty clients {faulty or 'none'}, "
          f"healthy {healthy}")
    if not healthy:
        print("no healthy client drawn; nothing to compare (try another --seed)")
        return
    cfg = job_config(root / "persistent", args)
    transport = FaultyTransport(LocalTransport(client_state_root(cfg)), persistent_plan(faulty))
    t0 = time.perf_counter()
    try:
        rows = run_job(cfg, transport, quiet=True)
    except RoundError as exc:
        print(f"faulty run stopped after {time.perf_counter() - t0:.1f} s: {exc}")
        return
    t_faulty = time.perf_counter() - t0
    reasons = Counter((f"client_{cid}", reason_kind(r)) for (_, cid), r in exclusions(rows).items())
    print(format_table(["client", "excluded as", "rounds"],
                       [[c, k, str(n)] for (c, k), n in sorted(reasons.items())]))
    ok = all(reason_kind(r) == faulty.get(cid) for (_, cid), r in exclusions(rows).items())
    print(f"every exclusion names a faulty client and its fault: {ok}")

    ref = job_config(root / "participants", args, f"clients.participants={healthy}")
    t0 = time.perf_counter()
    ref_rows = run_job(ref, LocalTransport(client_state_root(ref)), quiet=True)
    t_ref = time.perf_counter() - t0
    a, b = final_state(cfg), final_state(ref)
    same_keys = a.keys() == b.keys()
    diff = max(((a[k].double() - b[k].double()).abs().max().item() for k in a), default=0.0) \
        if same_keys else float("nan")
    got, want = final_test_rows(rows), final_test_rows(ref_rows)
    metrics_equal = {k: got.get(k) for k in want} == want
    print(f"final server adapter vs participants={healthy} run: "
          f"identical={same_keys and all(torch.equal(a[k], b[k]) for k in a)}, "
          f"max abs difference {diff:.3g} over {len(a)} tensors")
    print(f"final metrics equal (server and {len(want) - 1} healthy clients): {metrics_equal}; "
          f"server test {', '.join(f'{k} {v:.4f}' for k, v in want.get('server', {}).items())}")
    print(f"wall time: faulty run {t_faulty:.1f} s, participants-only run {t_ref:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--p-crash", type=float, default=0.1)
    parser.add_argument("--p-bad", type=float, default=0.1)
    parser.add_argument("--persistent-rate", type=float, default=None,
                        help="chance a client is faulty in every round (default p_crash+p_bad)")
    parser.add_argument("--min-replies", type=int, default=3)
    parser.add_argument("--retries", type=int, default=3,
                        help="(a): resume a failed run this many times")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--scenario", choices=["both", "transient", "persistent"], default="both")
    parser.add_argument("--output-dir", help="keep the runs here (default: a temp folder)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key of the job, repeatable")
    args = parser.parse_args()
    root = Path(args.output_dir or tempfile.mkdtemp(prefix="fedkt-faults-"))
    try:
        if args.scenario in ("both", "transient"):
            transient(args, root)
        if args.scenario in ("both", "persistent"):
            persistent(args, root)
    finally:
        if not args.output_dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
