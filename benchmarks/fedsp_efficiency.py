"""FedSP efficiency (the paper's Tables 4-5): client model size and per-round communication.

Dong et al. (EMNLP Findings 2023) compare what a client must hold and what travels per
round for full fine-tuning, FedPrompt (clients hold the LLM, exchange prompts) and FedSP
(clients hold the cut-and-shared auxiliary model, exchange prompts).  This script builds
the configured server the way ``fedkt run`` does and measures the payloads the runtime
actually serialises (``fedkt.federated.payload.dumps``):

* client model: FedSP's one-time ``setup`` payload (the chosen layers, embeddings, final
  norm, head, config, tokenizer) vs the LLM's weights (FedPrompt, full fine-tuning);
* per round, per client: down = the server's request, up = the client's reply
  (prompts for FedSP and FedPrompt; every weight for full fine-tuning, each way).

With ``--run`` it also prints the bytes measured in finished runs' ``metrics.jsonl``
(these include the runtime's envelope, about 2 KB: the run config).

    python benchmarks/fedsp_efficiency.py                                     # tiny demo
    python benchmarks/fedsp_efficiency.py configs/fedsp/smollm2_fedsp.yaml    # SmolLM2-135M
    python benchmarks/fedsp_efficiency.py configs/fedsp/smollm2_fedsp.yaml \\
        --run runs/fedsp-smollm2-fedsp runs/fedsp-smollm2-fedprompt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fedkt.config import load_config
from fedkt.configs.catalog import resolve_config
from fedkt.federated.payload import Payload, nbytes
from fedkt.methods import get_method
from fedkt.models.auxiliary import unwrap
from fedkt.models.install import check_installed, run_script


def _dedup_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight once (tied weights once): what a full model download carries."""
    seen, out = set(), {}
    for key, value in unwrap(model).state_dict().items():
        ptr = value.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            out[key] = value
    return out


def _reply(prompts: torch.Tensor) -> Payload:
    """A client's reply as :func:`fedkt.methods.fedsp.client_train` builds it."""
    return Payload(num_examples=16, align_loss=1.0, loss=1.0, prompts=prompts,
                   metrics={"train/align_loss": 1.0, "train/loss": 1.0, "train/steps": 10})


def _measured(run: Path) -> tuple[str, float, float, float] | tuple[str, None, None, None]:
    """(method, first round's and later rounds' mean MB received per client, MB sent);
    Nones for a run without client traffic (e.g. ``centralized``)."""
    config = (run / "config.yaml").read_text()
    method = next(line.split(":", 1)[1].strip() for line in config.splitlines()
                  if line.strip().startswith("name:") and line.startswith("  "))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["participant"].startswith("client") and r["split"] == "train"]
    if not train:
        return method, None, None, None
    first = [r["bytes_received"] for r in train if r["round"] == 1]
    later = [r["bytes_received"] for r in train if r["round"] > 1] or first
    up = [r["bytes_sent"] for r in train]
    return (method, sum(first) / len(first) / 1e6, sum(later) / len(later) / 1e6,
            sum(up) / len(up) / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="fedsp/demo",
                        help="a shipped config's name or a YAML path")
    parser.add_argument("--run", nargs="*", default=[], help="finished run folders to read")
    parser.add_argument("--set", action="append", default=[], help="config override KEY=VALUE")
    args = parser.parse_args()
    cfg = load_config(resolve_config(args.config), ["method.distill=false", *args.set])
    check_installed(cfg)
    torch.set_num_threads(cfg.runtime.torch_threads or torch.get_num_threads())
    server = get_method("fedsp").server(cfg, cfg.run_dir)
    server.setup()
    llm_state = _dedup_state(server.llm.model)
    n_llm = sum(v.numel() for v in llm_state.values())
    setup = server.aux_payload()
    n_aux = sum(v.numel() for v in setup["aux_model"].values())
    prompts = server.client_prompts()
    down_p = nbytes(Payload(prompts=prompts, aux_id=setup["aux_id"]))
    up_p = nbytes(_reply(prompts))
    full = nbytes(Payload(model=llm_state))
    n_prompt = prompts.numel()
    spec = server.spec
    print(f"# FedSP efficiency: {cfg.server.name}, {spec.llm_depth} layers; auxiliary model: "
          f"{spec.num_real} layer(s) {list(spec.source_layers)} x {spec.depth} virtual; "
          f"prompts {tuple(prompts.shape)}\n")
    print("Client model (Table 4)\n")
    print("| method | client holds | parameters | % of LLM | MB (payload) |")
    print("|---|---|---:|---:|---:|")
    print(f"| full fine-tuning | the LLM | {n_llm:,} | 100.0 | {full / 1e6:.2f} |")
    print(f"| FedPrompt | the LLM (frozen) + prompts | {n_llm:,} | 100.0 | {full / 1e6:.2f} |")
    print(f"| FedSP | auxiliary model + prompts | {n_aux:,} | {100 * n_aux / n_llm:.1f} | "
          f"{nbytes(setup) / 1e6:.2f} (once) |")
    print("\nCommunication per round and client (Table 5)\n")
    print("| method | parameters each way | down MB | up MB | vs full fine-tuning |")
    print("|---|---:|---:|---:|---:|")
    print(f"| full fine-tuning | {n_llm:,} | {full / 1e6:.3f} | {full / 1e6:.3f} | 1 |")
    for name in ("FedPrompt", "FedSP"):
        print(f"| {name} | {n_prompt:,} | {down_p / 1e6:.3f} | {up_p / 1e6:.3f} | "
              f"1/{full / down_p:,.0f} |")
    if args.run:
        print("\nMeasured in runs (MB per client; includes the runtime envelope)\n")
        print("| run | method | received, round 1 | received, later rounds | sent per round |")
        print("|---|---|---:|---:|---:|")
        for run in map(Path, args.run):
            method, first, later, up = _measured(run)
            if first is None:
                print(f"| {run.name} | {method} | - | - | - (no client traffic) |")
            else:
                print(f"| {run.name} | {method} | {first:.3f} | {later:.3f} | {up:.3f} |")


if __name__ == "__main__":
    run_script(main)
