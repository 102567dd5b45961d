"""Where one run's peak resident memory goes.

Runs one run of a suite (by default ``suites/clinc150_fedcollm_keep``'s ``anchor`` arm,
fold 0, seed 1000: SmolLM2-135M and the clients' 12-layer SLM, 30 CLINC150 intents) in its
own process with one torch thread and no reuse store. A thread in that process reads its
resident memory every 50 ms and, at each new high, what holds it
(``/proc/self/smaps``: the heap, each mapped file, other anonymous memory, libraries),
the proportional set size (a shared page counted once over all who map it), glibc's
heap in use and free (``mallinfo2``) and where the run is (its fedkt frames). Printed: the
peak and that breakdown, and the run's ``peak_rss_mb`` row as fedkt records it.

``--small`` cuts the run to 120 test items, 100 public records and one local epoch (the
same models and phases, minutes instead of half an hour):

    python benchmarks/peak_memory.py [--small] [--suite suites/...] [--arm anchor]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from memory_release import ISOLATED, SMALL, suite_run


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _heap() -> dict[str, int]:
    """glibc's heap: MB (10^6 bytes, as everywhere here) in use and free inside it, and MB
    it serves by mmap ({} elsewhere)."""
    try:
        info = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    info.restype = _MallInfo2
    m = info()
    return {"in use": m.uordblks // 10**6, "free": m.fordblks // 10**6,
            "mmapped": m.hblkhd // 10**6}


def _status_mb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024 // 10**6
    return 0


def _smaps() -> dict[str, int]:
    """Resident MB by what is mapped: [heap], [anon], each file by its name."""
    held: collections.Counter[str] = collections.Counter()
    name = "[anon]"
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header
                name = parts[5].rsplit("/", 1)[-1] if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Rss:":
                held[name] += int(parts[1])
    return {k: v * 1024 // 10**6 for k, v in held.most_common()}


def _rollup() -> dict[str, int]:
    keys = {"Pss:", "Pss_Anon:", "Pss_File:", "Shared_Clean:", "Private_Dirty:"}
    with open("/proc/self/smaps_rollup") as fh:
        return {p[0][:-1]: int(p[1]) * 1024 // 10**6 for p in map(str.split, fh)
                if p and p[0] in keys}


def _inside(argv: list[str], report: Path) -> int:
    """Run ``fedkt run argv`` here, sampling this process's memory; write the peak's
    breakdown to ``report``."""
    main_thread = threading.get_ident()
    peak: dict = {"rss": 0}

    def sample() -> None:
        while True:
            rss = _status_mb("VmRSS")
            if rss > peak["rss"] + 5:
                frame = sys._current_frames().get(main_thread)
                where = [f"{f.filename.split('/fedkt/')[-1]}:{f.lineno} {f.name}"
                         for f in (traceback.extract_stack(frame) if frame else [])
                         if "/fedkt/" in f.filename]
                peak.update(rss=rss, where=where[-6:], smaps=_smaps(), rollup=_rollup(),
                            heap=_heap())
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    from fedkt.cli import main

    try:
        return main(["run", *argv])
    finally:
        report.write_text(json.dumps(peak))


def _print(peak: dict, recorded: float | None) -> None:
    smaps, roll, heap = peak["smaps"], peak["rollup"], peak["heap"]
    files = {k: v for k, v in smaps.items() if not k.startswith("[")}
    checkpoints = sum(v for k, v in files.items() if k.endswith((".safetensors", ".bin")))
    print(f"peak RSS {peak['rss']} MB as sampled (the run's environment.json peak_rss_mb: "
          f"{recorded} MB)")
    where = peak["where"]
    print(f"  at {' > '.join(w.split(' ')[-1] for w in where)} ({where[-1]})" if where
          else "  outside fedkt's code")
    print(f"  heap {smaps.get('[heap]', 0)} MB (glibc: {heap.get('in use', '?')} MB in use, "
          f"{heap.get('free', '?')} MB free, {heap.get('mmapped', '?')} MB served by mmap); "
          f"checkpoints mapped {checkpoints} MB; other anonymous {smaps.get('[anon]', 0)} MB; "
          f"other files {sum(files.values()) - checkpoints} MB")
    print(f"  proportional (PSS) {roll['Pss']} MB: anonymous {roll['Pss_Anon']} MB, files "
          f"{roll['Pss_File']} MB; clean pages also mapped elsewhere {roll['Shared_Clean']} MB; "
          f"private dirty {roll['Private_Dirty']} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="suites/clinc150_fedcollm_keep")
    parser.add_argument("--arm", default="anchor")
    parser.add_argument("--small", action="store_true", help="120 test items, 100 public "
                        "records, one local epoch")
    parser.add_argument("--inside", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        raise SystemExit(_inside(args.inside[1:], Path(args.inside[0])))
    from fedkt.tracking.summary import read_environment

    cfg, header = suite_run(args.suite, args.arm, args.small)
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        config, out, report = Path(tmp) / "run.yaml", Path(tmp) / "run", Path(tmp) / "peak.json"
        config.write_text(cfg.to_yaml())
        sets = [*ISOLATED, *(SMALL if args.small else [])]
        cmd = [sys.executable, __file__, "--inside", str(report), str(config), "--output-dir",
               str(out), "-q", *(x for s in sets for x in ("--set", s))]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        recorded = [e["peak_rss_mb"] for e in read_environment(out) if "peak_rss_mb" in e]
        _print(json.loads(report.read_text()), max(recorded) if recorded else None)


if __name__ == "__main__":
    main()
