"""Do two commits give the same numbers? Every shipped tiny config, run at both, compared.

A refactor must not change behaviour: every shipped config on tiny models writes a
``metrics.jsonl`` that is bit-identical before and after, apart from the timing keys
(``wall_time``, ``compute_time``, ``compute_cpu`` and any ``*_seconds`` metric) and keys
the newer commit adds.

    python benchmarks/metrics_identity.py                 # HEAD~1 against the work tree
    python benchmarks/metrics_identity.py --before main --after . --jobs 2
    python benchmarks/metrics_identity.py --configs quickstart fedmkt/homo
    python benchmarks/metrics_identity.py --methods            # each method's tiny config
    python benchmarks/metrics_identity.py --configs fedkd/quick --ignore bytes_received
    python benchmarks/metrics_identity.py --after HEAD --record /tmp/ref   # run one side, keep it
    python benchmarks/metrics_identity.py --against /tmp/ref               # compare with it

``--methods`` adds every registered method on the tiny config it declares
(``Method.conformance.tiny_config``), as ``CONFIG@METHOD`` (``--set method.name=METHOD``), so methods
that share one tiny config (LLM2SLM, FedPrompt, the baselines) are checked too.

``--before`` / ``--after`` are git revisions (checked out into temporary worktrees) or
``.`` (this checkout as it is, uncommitted changes included).  Each config runs in its
own ``fedkt run`` process with ``PYTHONPATH`` pointing at that side's code, one torch
thread, the same seed.  Prints one line per config: rows, identical or the first row
that differs; exits 1 when any differs.  ``--record DIR`` runs only the ``--after`` side
and keeps its rows in DIR (one JSON file per config); ``--against DIR`` compares the
``--after`` side with rows kept that way instead of running ``--before`` again (a
refactor checked many times against one reference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedkt.tracking import without_timings

ROOT = Path(__file__).resolve().parents[1]
TINY = ("tiny-", "tiny_")  # tiny LMs / encoders built from a config


def _is_tiny(name: str) -> bool:
    """A model built from a config with no checkpoint: a tiny LM or a plain-torch CNN."""
    from fedkt.models.vision import VISION_MODELS

    return name.startswith(TINY) or name in VISION_MODELS


def tiny_configs(code: Path) -> list[str]:
    """Shipped run configs (not suites) whose every model is built from a config, by name."""
    import yaml

    base = code / "fedkt" / "configs"
    names = []
    for path in sorted(base.rglob("*.yaml")):
        rel = path.relative_to(base)
        if rel.parts[0] == "suites":
            continue
        cfg = yaml.safe_load(path.read_text())
        models = [m.get("name", "") for m in (cfg.get("clients", {}) or {}).get("models", [])]
        if cfg.get("server"):
            models.append(cfg["server"].get("name", ""))
        if models and all(_is_tiny(str(m)) for m in models):
            names.append(str(rel.with_suffix("")))
    return names


def method_configs(skip: list[str]) -> list[str]:
    """Every registered method on the tiny config it declares, as ``CONFIG@METHOD``, but
    those that are ``CONFIG`` itself (a config of ``skip`` already runs that method)."""
    import yaml

    from fedkt.methods import available, get_method

    out = []
    for name in available():
        config = get_method(name).conformance.tiny_config
        if not config:
            continue
        own = yaml.safe_load((ROOT / "fedkt" / "configs" / f"{config}.yaml").read_text())
        if not (config in skip and own["method"]["name"] == name):
            out.append(f"{config}@{name}")
    return out


def checkout(rev: str, tmp: Path) -> Path:
    """``.`` is this checkout; anything else becomes a detached worktree under ``tmp``."""
    if rev == ".":
        return ROOT
    where = tmp / rev.replace("/", "_").replace("~", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where),
                    rev], check=True, capture_output=True)
    return where


def run_config(code: Path, name: str, out: Path, fallback: Path | None = None
               ) -> list[dict[str, Any]] | str:
    """The config's metrics rows without timing keys, or the error text.  The config is
    ``code``'s own; one that ``code`` does not ship (added later) is ``fallback``'s (this
    checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(code), "FLWR_TELEMETRY_ENABLED": "0",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    config, _, method = name.partition("@")
    path = code / "fedkt" / "configs" / f"{config}.yaml"
    if config.endswith((".yaml", ".yml")):  # a file of one's own: the same on both sides
        path = Path(config).resolve()
    elif not path.is_file() and fallback is not None:
        path = fallback / "fedkt" / "configs" / f"{config}.yaml"
    cmd = [sys.executable, "-m", "fedkt.cli", "run", str(path),
           "--set", f"output_dir={out}", "--set", "runtime.torch_threads=1", "--overwrite", "-q"]
    if method:
        cmd += ["--set", f"method.name={method}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out.parent)
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return without_timings(json.loads(line) for line in
                           (out / "metrics.jsonl").read_text().splitlines())


BYTES = ("bytes_sent", "bytes_received", "eval_bytes")


def renamed(rows: list[dict[str, Any]], renames: dict[str, str]) -> list[dict[str, Any]]:
    """``rows`` with the server's train-row keys renamed (``OLD=NEW``; ``OLD=`` drops OLD),
    all at once, so ``loss=server_loss client_loss=loss`` swaps meanings; two keys landing
    on one name is an error."""
    out = []
    for row in rows:
        if row.get("participant") == "server" and row.get("split") == "train" and renames:
            new: dict[str, Any] = {}
            for k, v in row.items():
                name = renames.get(k, k)
                if name in new:
                    raise ValueError(f"--rename: two keys of round {row.get('round')}'s "
                                     f"server train row become {name!r}")
                if name:
                    new[name] = v
            row = new
        out.append(row)
    return out


def compare(before: list[dict[str, Any]] | str, after: list[dict[str, Any]] | str,
            ignore: frozenset[str] = frozenset()) -> str:
    """``identical``, ``BYTES ONLY`` with the byte changes (every other value identical: a
    change of what travels, e.g. a renamed field), or what differs first (keys only the
    newer side has are allowed, ``ignore`` keys are not compared)."""
    if isinstance(before, str) or isinstance(after, str):
        return f"failed: before {before if isinstance(before, str) else 'ok'}, after " \
               f"{after if isinstance(after, str) else 'ok'}"
    if len(before) != len(after):
        return f"DIFFERS: {len(before)} rows before, {len(after)} after"
    deltas: dict[str, set[int]] = {}
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        a = {k: v for k, v in a.items() if k not in ignore}
        keys = sorted(k for k in a if k in b and a[k] != b[k] or k not in b)
        if any(k not in BYTES or k not in b for k in keys):
            return f"DIFFERS at row {i} ({a.get('round')}, {a.get('participant')}): {keys}"
        who = "server" if a.get("participant") == "server" else "clients"
        for k in keys:
            deltas.setdefault(f"{who} {k}", set()).add(b[k] - a[k])
    if not deltas:
        return "identical"
    return "BYTES ONLY: " + "; ".join(
        f"{k} {', '.join(f'{d:+d}' for d in sorted(v))}" for k, v in sorted(deltas.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="HEAD~1")
    parser.add_argument("--after", default=".")
    parser.add_argument("--configs", nargs="*",
                        help="shipped config names or YAML paths, each optionally @METHOD "
                             "(default: every shipped tiny config)")
    parser.add_argument("--methods", action="store_true",
                        help="also every registered method on its tiny config (CONFIG@METHOD)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--ignore", nargs="*", default=[],
                        help="metrics keys not compared (say why where you report it)")
    parser.add_argument("--rename", nargs="*", default=[], metavar="OLD=NEW",
                        help="on the before side, rename (or with OLD= drop) these keys of "
                             "the server's train rows: a key whose meaning moved")
    parser.add_argument("--record", type=Path,
                        help="run only the --after side and keep its rows in this folder")
    parser.add_argument("--against", type=Path,
                        help="compare --after with rows kept by --record (no --before run)")
    args = parser.parse_args()
    renames = dict(pair.split("=", 1) for pair in args.rename)
    with tempfile.TemporaryDirectory(prefix="fedkt-identity-") as tmp_dir:
        tmp = Path(tmp_dir)
        sides = {"after": checkout(args.after, tmp)}
        if args.record is None and args.against is None:
            sides = {"before": checkout(args.before, tmp), **sides}
        names = args.configs or tiny_configs(sides["after"])
        if args.methods:
            names = [*names, *method_configs(names)]
        work = [(side, code, name) for name in names for side, code in sides.items()]

        def one(item: tuple[str, Path, str]) -> tuple[str, str, Any]:
            side, code, name = item
            out = tmp / side / name.replace("/", "_").replace("@", "-").lstrip("_")
            out.parent.mkdir(parents=True, exist_ok=True)
            return side, name, run_config(code, name, out, fallback=ROOT)

        def kept(name: str) -> Path:
            return (args.record or args.against) / f"{name.replace('/', '__')}.json"

        before = args.against or args.before
        print(f"before: {before}   after: {args.after}", flush=True)
        got: dict[str, dict[str, Any]] = {}
        bad = bytes_only = 0
        if args.record is not None:
            args.record.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for side, name, rows in pool.map(one, work):  # in order: a config's two sides
                got.setdefault(name, {})[side] = rows
                if args.record is not None:
                    kept(name).write_text(json.dumps(rows))
                    count = len(rows) if isinstance(rows, list) else rows
                    print(f"{name:32s} {count!s:>5} rows  recorded", flush=True)
                    bad += not isinstance(rows, list)
                    continue
                if args.against is not None:
                    path = kept(name)
                    got[name]["before"] = (json.loads(path.read_text()) if path.is_file()
                                           else f"no rows recorded in {args.against}")
                if len(got[name]) < 2:
                    continue
                old = got[name]["before"]
                verdict = compare(renamed(old, renames) if isinstance(old, list) else old,
                                  got[name]["after"], frozenset(args.ignore))
                count = len(rows) if isinstance(rows, list) else "-"
                print(f"{name:32s} {count!s:>5} rows  {verdict}", flush=True)
                bad += verdict != "identical"
                bytes_only += verdict.startswith("BYTES ONLY")
        for code in sides.values():
            if code != ROOT:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(code)], capture_output=True)
    print(f"{len(names) - bad} of {len(names)} {'recorded' if args.record else 'identical'}"
          + (f"; {bytes_only} differ in bytes only" if bytes_only else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
