"""Peak memory per participant, with and without each big-model setting.

Each measurement runs in a fresh process so that its peak is its own:

* **participants** (default): for each participant model of a run config (the server's
  LLM, each distinct client model), load it as the run would (``get_lm``: base, PEFT,
  device), train ``--steps`` steps of the run's batch on its data through the run's own
  trainer (``train_lm``), and report the process's resident memory after loading and
  its peak (``ru_maxrss``), both above what the process held after imports, and the
  bytes autograd saved for one backward pass (the activations; on a GPU the same bytes).
  Settings: fp32 weights (the baseline), ``training.gradient_checkpointing``, bf16
  weights (``dtype: bfloat16``), 8-bit and 4-bit base weights (``quantization``, when
  bitsandbytes is installed), and 4-bit with checkpointing.
* **runs** (``--runs``): the whole job in the local runtime (every participant in one
  process), 1 round on few records: its peak resident memory, baseline against the
  settings together.

Configs: the demo (FedCoLLM, SmolLM2-135M and its 8-layer SLM) and FedMKT with the
Qwen2.5-0.5B LLM and SmolLM2-135M / Gemma-3-270M clients (``fedmkt/real``), each cut to a
few records.  Training precision is the config's (``auto``: bf16 autocast on a CPU with
native bf16).  CPU resident memory includes the allocator's slack; the saved-activation
bytes do not depend on the allocator.

    python benchmarks/memory.py                    # participants, both configs
    python benchmarks/memory.py --runs             # + whole 1-round runs
    python benchmarks/memory.py --configs demo --settings fp32,gc --steps 2
    python benchmarks/memory.py --paper            # the on-paper 7B + 1B table only

The on-paper model (docs/performance.md, "memory"): a participant's GPU memory is its
weights (bytes per parameter: fp32 4, bf16 2, int8 1, NF4 about 0.52 for the linear
layers, embeddings and head in fp32 when it trains) + its adapter with gradients and
AdamW state (16 bytes per trainable parameter) + the activations of one training step
(``ACT`` bytes per token, layer and hidden unit, or with gradient checkpointing 2 (bf16)
or 4 (fp32) bytes for each layer's input plus one layer's activations) + the logits of one step (about
10 bytes per token and vocabulary entry: bf16 logits, their fp32 copy for the loss and
its gradient) + about 1 GiB of CUDA context and allocator slack.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Run configs cut to a few records (the FedMKT one to 1 round of its 0.5B LLM).
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "demo": ("demo", ["rounds=1", "data.max_private_per_client=16", "data.max_test=16",
                      "eval.compare_round0=false",
                      "eval.round0=false", "eval.plots=false"]),
    "fedmkt-0.5b": ("fedmkt/real", [
        "rounds=1", "data.max_private_per_client=8", "data.max_public=8", "data.max_test=8",
        "data.max_length=128", "eval.round0=false", "eval.plots=false", "eval.clients=false"]),
}
# Setting -> (model overrides, training overrides).
SETTINGS: dict[str, tuple[dict, dict]] = {
    "fp32": ({"dtype": "float32"}, {}),
    "gc": ({"dtype": "float32"}, {"gradient_checkpointing": True}),
    "bf16": ({"dtype": "bfloat16"}, {}),
    "bf16+gc": ({"dtype": "bfloat16"}, {"gradient_checkpointing": True}),
    "int8": ({"dtype": "float32", "quantization": {"bits": 8}}, {}),
    "nf4": ({"dtype": "float32", "quantization": {"bits": 4}}, {}),
    "nf4+gc": ({"dtype": "float32", "quantization": {"bits": 4}},
               {"gradient_checkpointing": True}),
}
MB = 1 << 20
GB = 1e9
# Activation bytes per token, layer and hidden unit that autograd keeps for backward:
# 150 measured here (SmolLM2-135M and its 8-layer cut, fp32 weights, bf16 autocast, LoRA
# with dropout: 151 and 172; docs/performance.md), assumed half of it (75) with bf16 weights
# (a bf16 residual stream); each layer's input under gradient checkpointing: 4 / 2 bytes.
ACT = {"fp32": 150.0, "bf16": 75.0}
# (name, parameters in decoder-layer linear layers, other parameters, layers, hidden, vocab)
LAYOUTS = {
    "7B (Llama-2-7B)": (6.476e9, 0.262e9, 32, 4096, 32000),
    "1.1B (TinyLlama)": (0.969e9, 0.131e9, 22, 2048, 32000),
}


def paper_gb(layout: str, weights: str, gc: bool, trains: bool = True, batch: int = 4,
             seq: int = 512, lora: float = 4.2e6) -> dict[str, float]:
    """The on-paper memory (GB) of one participant: weights, training state, activations,
    logits, and their sum with 1 GiB of context and slack."""
    linear, other, layers, hidden, vocab = LAYOUTS[layout]
    per = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "nf4": 0.516}[weights]
    other_bytes = 4.0 if weights in ("int8", "nf4") and trains else min(per, 2.0) * (
        2 if weights == "fp32" else 1)
    out = {"weights": (linear * per + other * other_bytes) / GB}
    tokens = batch * seq
    out["adapter+adam"] = 16 * lora / GB if trains else 0.0
    kind = "fp32" if weights == "fp32" else "bf16"
    inputs = 4 if kind == "fp32" else 2
    act = (tokens * hidden * (layers * inputs + ACT[kind]) if gc
           else tokens * hidden * layers * ACT[kind])
    out["activations"] = act / GB if trains else tokens * hidden * 2 * 4 / GB
    out["logits"] = tokens * vocab * (10 if trains else 2) / GB
    out["total"] = sum(out.values()) + 1.07
    return out


def paper_table() -> str:
    """The 7B-server + 1B-clients table (batch 4 x 512 tokens, LoRA r=8 on q/v)."""
    lines = ["| participant | weights | gradient checkpointing | weights GB | training "
             "state GB | activations GB | logits GB | total GB |", "|---|---|---|---|---|---|---|---|"]
    rows = {}
    for layout in LAYOUTS:
        for weights, gc in (("bf16", False), ("bf16", True), ("nf4", True)):
            m = paper_gb(layout, weights, gc)
            rows[(layout, weights, gc)] = m
            lines.append(f"| {layout} | {weights} | {'yes' if gc else 'no'} | "
                         f"{m['weights']:.1f} | {m['adapter+adam']:.2f} | {m['activations']:.1f} "
                         f"| {m['logits']:.1f} | {m['total']:.1f} |")
    return "\n".join(lines)


def _rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _config(name: str, extra: list[str]):
    from fedkt.config import load_config
    from fedkt.configs.catalog import resolve_config

    config, sets = CONFIGS[name]
    return load_config(resolve_config(config), [*sets, *extra])


def _participants(cfg) -> list[tuple[str, int | None]]:
    """(label, client id or None for the server), one per distinct model config."""
    out: list[tuple[str, int | None]] = []
    if cfg.server is not None:
        out.append(("server", None))
    seen: set[str] = set()
    for cid in cfg.client_ids():
        key = cfg.clients.model_for(cid).model_dump_json(exclude={"lr"})
        if cfg.clients.models and key not in seen:
            seen.add(key)
            out.append((f"client_{cid}", cid))
    return out


def measure_one(config: str, participant: str, setting: str, steps: int) -> dict:
    """In this process: load ``participant``'s model with ``setting``, train ``steps``
    steps; memory above the post-import baseline."""
    import torch

    from fedkt.data.splits import run_data
    from fedkt.train.lm import get_lm, train_lm

    model_over, train_over = SETTINGS[setting]
    cfg = _config(config, [])
    cid = None if participant == "server" else int(participant.split("_")[1])
    model_cfg = cfg.server if cid is None else cfg.clients.model_for(cid)
    model_cfg = type(model_cfg).model_validate({**model_cfg.model_dump(), **model_over})
    training = type(cfg.training).model_validate({**cfg.training.model_dump(), **train_over,
                                                  "max_steps": steps})
    cfg = cfg.model_copy(update={"training": training})
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    records = fd.public if cid is None and fd.public else fd.private[cid or 0]
    base = _rss()
    start = time.perf_counter()
    lm = get_lm(model_cfg, training, cfg.seed, "cpu")
    load_s = time.perf_counter() - start
    loaded = _rss() - base
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = train_lm(cfg, lm, records[: steps * training.batch_size], seed=1, data=fd)
    step_s = (time.perf_counter() - start) / max(1, out["steps"])
    return {"config": config, "participant": participant, "model": model_cfg.name,
            "setting": setting, "loaded_mb": loaded / MB, "peak_mb": (_peak() - base) / MB,
            "weights_mb": weights / MB, "saved_mb_per_step": saved[0] / MB / max(1, out["steps"]),
            "loss": out["loss"], "steps": out["steps"], "load_s": load_s, "step_s": step_s}


def measure_run(config: str, setting: str) -> dict:
    """The whole job, 1 round, in a child process: its peak resident memory and wall."""
    import tempfile

    model_over, train_over = SETTINGS[setting]
    cfg = _config(config, [])
    sets = [f"training.{k}={json.dumps(v)}" for k, v in train_over.items()]
    if cfg.server is not None:
        sets += [f"server.{k}={json.dumps(v)}" for k, v in model_over.items()]
    for i in range(len(cfg.clients.models)):
        sets += [f"clients.models.{i}.{k}={json.dumps(v)}" for k, v in model_over.items()]
    with tempfile.TemporaryDirectory() as tmp:
        code = ("import resource,sys,runpy;sys.argv=sys.argv[1:];"
                "from fedkt.cli import main;rc=main();"
                "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss);sys.exit(rc)")
        config_name, base_sets = CONFIGS[config]
        cmd = [sys.executable, "-c", code, "fedkt", "run", config_name, "-q", "--output-dir",
               f"{tmp}/run", *sum((["--set", s] for s in [*base_sets, *sets]), [])]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{config} {setting}: {done.stderr[-2000:]}")
    peak = int(next(line.split()[1] for line in done.stdout.splitlines()
                    if line.startswith("PEAK")))
    return {"config": config, "setting": setting, "peak_mb": peak / 1024, "wall_s": wall}


def _child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, "--one", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "?"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--participants", default=None,
                        help="only these (e.g. server,client_0); default: one per model")
    parser.add_argument("--runs", action="store_true", help="also whole 1-round jobs")
    parser.add_argument("--run-settings", default="fp32,bf16+gc,nf4+gc")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--paper", action="store_true", help="print the on-paper table only")
    parser.add_argument("--one", nargs=4, metavar=("CONFIG", "PARTICIPANT", "SETTING", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.paper:
        print(paper_table())
        return
    if args.one:
        config, participant, setting, steps = args.one
        print(json.dumps(measure_one(config, participant, setting, int(steps))))
        return
    import importlib.util

    import torch

    settings = args.settings.split(",")
    if importlib.util.find_spec("bitsandbytes") is None:
        settings = [s for s in settings if "int8" not in s and "nf4" not in s]
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; MB = MiB above the process after "
          "imports; saved = activation bytes autograd keeps per training step")
    rows = []
    for config in args.configs.split(","):
        cfg = _config(config, [])
        wanted = args.participants.split(",") if args.participants else None
        for participant, _ in _participants(cfg):
            if wanted and participant not in wanted:
                continue
            for setting in settings:
                row = _child([config, participant, setting, str(args.steps)])
                row.setdefault("config", config)
                row.setdefault("participant", participant)
                row.setdefault("setting", setting)
                rows.append(row)
                if "error" in row:
                    print(f"{config:<12} {participant:<9} {setting:<8} ERROR {row['error']}",
                          flush=True)
                    continue
                print(f"{config:<12} {participant:<9} {row['model']:<14} {setting:<8} "
                      f"weights {row['weights_mb']:7.0f}  loaded {row['loaded_mb']:7.0f}  "
                      f"peak {row['peak_mb']:7.0f}  saved/step {row['saved_mb_per_step']:7.0f}  "
                      f"step {row['step_s']:5.2f} s  loss {row['loss']:.4f}", flush=True)
    if args.runs:
        for config in args.configs.split(","):
            for setting in args.run_settings.split(","):
                if setting not in settings:
                    continue
                row = measure_run(config, setting)
                rows.append({"run": True, **row})
                print(f"run {config:<12} {setting:<8} peak {row['peak_mb']:7.0f} MiB (whole "
                      f"process)  wall {row['wall_s']:6.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
