"""FedCoLLM communication per round: LoRA adapter bytes vs the full SLM's parameters.

FedCoLLM clients exchange only the SLM's LoRA adapter: the global theta down, their
theta_k up (as SecAgg+ masked vectors with secure aggregation).  The paper's Table 2 counts
parameters, not bytes (its "MB" column is millions of parameters: 0.29 M = 294,912, LoRA
r=8 on GPT-2-small's c_attn, against 124 M), a ratio of 0.24% (OPT 0.24%, LLaMa2 0.23%);
its text's "0.29%" repeats the size column.  The ratio below is computed the same way,
LoRA parameters over the full SLM's.  This script
builds the configured SLM (and LLM), counts parameters and the bytes of the payloads
the runtime actually serialises, and prints the per-round ratio; with ``--run`` it
also reads the bytes measured in a finished run's ``metrics.jsonl``.

    python benchmarks/fedcollm_communication.py                       # the demo's tiny models
    python benchmarks/fedcollm_communication.py --slm smollm2-135m --target-modules default
    python benchmarks/fedcollm_communication.py --run runs/fedcollm-demo
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fedkt.config import load_config
from fedkt.configs.catalog import resolve_config
from fedkt.federated.payload import Payload, nbytes
from fedkt.models.install import check_installed, run_script
from fedkt.train.lm import client_lm, server_lm


def _params(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, frozen base) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters()) - trainable


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="fedcollm/demo",
                        help="a shipped config's name or a YAML path")
    parser.add_argument("--slm", help="measure this client model instead (name or alias)")
    parser.add_argument("--target-modules", help="LoRA targets: 'default' (peft's per-"
                        "architecture q/v), 'all-linear', or comma-separated names")
    parser.add_argument("--run", help="a finished run folder: print its measured bytes too")
    args = parser.parse_args()

    overrides = []
    if args.slm:
        overrides.append(f"clients.models=[{{name: {args.slm}}}]")
    if args.target_modules:
        value = {"default": "null", "all-linear": "all-linear"}.get(
            args.target_modules, json.dumps(args.target_modules.split(",")))
        overrides.append(f"training.lora.target_modules={value}")
    cfg = load_config(resolve_config(args.config), overrides)
    check_installed(cfg)
    torch.set_num_threads(cfg.runtime.torch_threads or torch.get_num_threads())
    k = cfg.clients.num_clients
    slm = client_lm(cfg, 0)
    lora, base = _params(slm.model)
    theta = slm.trainable()
    down = nbytes(Payload(adapter=theta))
    up_plain = nbytes(Payload(adapter=theta, num_examples=100, train_loss=1.0))
    full = base * 4  # the full SLM in float32

    lora_cfg = cfg.training.lora
    print(f"SLM {cfg.clients.model_for(0).name}: {base:,} base parameters; LoRA r={lora_cfg.r} "
          f"on {lora_cfg.target_modules or 'peft default'}: {lora:,} parameters")
    print(f"LoRA / full-model parameters: {100 * lora / base:.3f}% "
          f"(paper Table 2, same count: GPT-2 0.24%, OPT 0.24%, LLaMa2 0.23%)")
    if cfg.server is not None and not args.slm:
        llm = server_lm(cfg) if cfg.server.name.startswith("tiny-") else None
        if llm is not None:
            l_lora, l_base = _params(llm.model)
            print(f"LLM {cfg.server.name}: {l_base:,} base parameters, {l_lora:,} LoRA "
                  "(never leaves the server)")
    print(f"per client per round: down {_mb(down)} (theta, fp32), up {_mb(up_plain)} plain "
          "(with secure aggregation: measure a run with --run; SecAgg+ adds key exchange and "
          "masked vectors)")
    print(f"per round, {k} clients: {_mb(k * (down + up_plain))} plain; FedAvg of the full SLM would move "
          f"{_mb(2 * k * full)} ({100 * (down + up_plain) / (2 * full):.3f}% of that)")

    if args.run:
        rows = [json.loads(line) for line in (Path(args.run) / "metrics.jsonl").open()]
        clients = [r for r in rows if str(r.get("participant", "")).startswith("client")
                   and r.get("split") == "train"]
        if not clients:
            raise SystemExit(f"{args.run}: no client rows")
        rounds = sorted({r["round"] for r in clients})
        sent = sum(r["bytes_sent"] for r in clients) / len(clients)
        recv = sum(r["bytes_received"] for r in clients) / len(clients)
        print(f"measured in {args.run} ({len(rounds)} rounds): per client per round "
              f"{_mb(sent)} sent, {_mb(recv)} received (requests carry the run config too)")


if __name__ == "__main__":
    run_script(main)
