"""FedSP gradient-agreement probe: do the clients' prompt updates help the LLM?

A FedSP client trains the prompts on its auxiliary model; they help the LLM only if the
auxiliary model's prompt gradient points where the LLM's does. For one client's data and
the LLM's initial prompts P0 (the suite's text prompts) this prints, for the auxiliary
model distilled for each number of KD steps (Eq. 2, cumulative) and each cut position:

* the cosine between the auxiliary model's and the LLM's gradient of the task loss with
  respect to P (and the share of coordinates whose signs agree);
* the LLM's training loss after one sign step ``P0 - lr * sign(d)`` (Adam's first step)
  along d = the auxiliary model's gradient, beside the same step along a random direction
  and along the LLM's own gradient (computed once).

    python benchmarks/fedsp_probe.py                      # the suite's config, client 0
    python benchmarks/fedsp_probe.py --grid bot:0,150,600 --grid mid:0,150

A cosine near 0 and an aux-step loss no better than the random step's say that more
distillation of this kind cannot make the clients' prompt updates useful to the LLM.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedkt.data.splits import run_data
from fedkt.evidence.suite import load_suite
from fedkt.methods import get_method
from fedkt.methods.fedsp import PROMPT_KEY
from fedkt.methods.fedsp.training import align_params, distill_auxiliary, prompt_param
from fedkt.models.auxiliary import prompts_for_aux
from fedkt.train.lm import LM, lm_batches

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "fedkt" / "configs" / "suites" / "fedsp.yaml"


def prompt_grad(lm: LM, prompts: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, float]:
    """Gradient of the task loss on ``batch`` with respect to the prompts, and the loss."""
    param = prompt_param(lm.model)
    with torch.no_grad():
        param.copy_(prompts)
    flags = [(p, p.requires_grad) for p in lm.model.parameters()]
    for p, _ in flags:
        p.requires_grad_(p is param)
    try:
        lm.model.zero_grad(set_to_none=True)
        loss = lm.model(**batch).loss
        loss.backward()
        grad = param.grad.detach().clone()
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        lm.model.zero_grad(set_to_none=True)
    return grad, float(loss.detach())


@torch.no_grad()
def loss_at(lm: LM, prompts: Tensor, batch: dict[str, Tensor]) -> float:
    prompt_param(lm.model).copy_(prompts)
    return float(lm.model(**batch).loss)


def cosine(a: Tensor, b: Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def sign_agreement(a: Tensor, b: Tensor) -> float:
    return float((torch.sign(a) == torch.sign(b)).float().mean())


def parse_grid(items: list[str]) -> list[tuple[str, list[int]]]:
    out = []
    for item in items:
        pos, _, steps = item.partition(":")
        if pos not in ("bot", "mid", "top") or not steps:
            raise SystemExit(f"--grid {item!r}: expected POSITION:STEPS,... with POSITION "
                             "bot, mid or top")
        out.append((pos, sorted({int(s) for s in steps.split(",")})))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=str(SUITE), help="suite whose fedsp arm sets the config")
    ap.add_argument("--client", type=int, default=0)
    ap.add_argument("--examples", type=int, default=16, help="the client's first N examples")
    ap.add_argument("--grid", action="append", default=None,
                    help="POSITION:KD_STEPS,... (default: bot:0,150,600 mid:0,150 top:0,150)")
    ap.add_argument("--lr", default="3e-3,1e-2,3e-2", help="sign-step sizes, comma-separated")
    ap.add_argument("--kd-lr", type=float, default=None, help="default: the config's kd_lr")
    ap.add_argument("--kd-batch", type=int, default=2, help="KD batch (small: cheap)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    grid = parse_grid(args.grid or ["bot:0,150,600", "mid:0,150", "top:0,150"])
    lrs = [float(x) for x in args.lr.split(",")]
    start = time.time()
    base = load_suite(args.suite).runs[("fedsp", 0)]
    fd = run_data(base.data, base.clients.num_clients, base.seed)
    records = fd.private[args.client][:args.examples]
    public = fd.public
    kd_lr = args.kd_lr or base.method.kd_lr

    def server(position: str) -> Any:
        cfg = base.model_copy(update={"method": base.method.model_copy(
            update={"layer_position": position, "kd_cache": False})})
        srv = get_method("fedsp").server(cfg, Path("/tmp") / "fedsp-probe")
        srv.setup()
        return srv

    srv = server(grid[0][0])
    llm = srv.llm.reset({PROMPT_KEY: srv.prompts})
    p0 = srv.prompts.clone()
    (batch,) = lm_batches(base, llm.tokenizer, records, seed=None, batch_size=len(records))
    g_llm, loss0 = prompt_grad(llm, p0, batch)
    rand = torch.randn(p0.shape, generator=torch.Generator().manual_seed(0))
    step = {name: "/".join(f"{loss_at(llm, p0 - lr * torch.sign(d), batch):.3f}" for lr in lrs)
            for name, d in (("llm", g_llm), ("random", rand))}
    print(f"SmolLM2 ({base.server.name}), {base.data.dataset.name}, client {args.client}'s "
          f"first {len(records)} examples, text-initialised prompts {tuple(p0.shape)}; "
          f"sign steps lr {'/'.join(f'{lr:g}' for lr in lrs)}; KD lr {kd_lr:g}, batch "
          f"{args.kd_batch}, "
          f"on the server's {len(public)} examples")
    print(f"LLM training loss at P0: {loss0:.3f}; after a sign step along a random direction: "
          f"{step['random']}; along the LLM's own gradient: {step['llm']}\n")
    print("| cut (LLM layer) | KD steps | KD loss | aux loss at P0 | cosine(aux, LLM) | "
          "signs agree | LLM loss after aux step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for position, kd_points in grid:
        srv = srv if srv.method.layer_position == position else server(position)
        params = align_params(srv.aux.model, srv.method.trainable)
        done, kd_loss = 0, "-"
        for kd in kd_points:
            if kd > done:
                stats = distill_auxiliary(
                    srv.cfg, srv.llm.model, srv.aux.model, srv.w_s, srv.llm.tokenizer, public,
                    steps=kd - done, lr=kd_lr, seed=srv.seed(1, "kd") + done, params=params,
                    batch_size=args.kd_batch, learn_map=srv.method.kd_map == "learned")
                kd_loss, done = f"{stats['kd_loss']:.3f}", kd
            g_aux, aux_loss = prompt_grad(srv.aux, prompts_for_aux(p0, srv.spec), batch)
            after = "/".join(f"{loss_at(llm, p0 - lr * torch.sign(g_aux), batch):.3f}"
                             for lr in lrs)
            print(f"| {position.upper()} ({srv.spec.source_layers[0]}) | {kd} | "
                  f"{kd_loss} | {aux_loss:.3f} | {cosine(g_aux, g_llm):+.3f} | "
                  f"{sign_agreement(g_aux, g_llm):.1%} | {after} |", flush=True)
    print(f"\n{time.time() - start:.0f} s wall")


if __name__ == "__main__":
    main()
