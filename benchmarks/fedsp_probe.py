"""FedSP gradient-agreement probe: do the clients' prompt updates help the LLM?

A FedSP client trains the prompts on its auxiliary model; they help the LLM only if the
auxiliary model's prompt gradient points where the LLM's does. Both modes take the
suite's FedSP config (``fedkt/configs/suites/fedsp.yaml``) or, with ``--config``, a FedSP
run config, the LLM's initial prompts P0 and one client's data, and run no federated
round. Gradients and losses are computed in fp32 unless ``--precision`` names another
(``auto``: the hardware's, as ``training.precision``); distillation runs at the config's.

**Cuts** (default; the first probe): for the auxiliary model distilled for each number of
KD steps (Eq. 2, cumulative) and each cut position, from the config's initial prompts
(the suite's: text-initialised; ``--init`` sets them):

* the cosine between the auxiliary model's and the LLM's gradient of the task loss with
  respect to P (and the share of coordinates whose signs agree);
* the LLM's training loss after one sign step ``P0 - lr * sign(d)`` (Adam's first step)
  along d = the auxiliary model's gradient, beside the same step along a random direction
  and along the LLM's own gradient (computed once).

    python benchmarks/fedsp_probe.py                      # the suite's config, client 0
    python benchmarks/fedsp_probe.py --cuts bot:0,150,600 --cuts mid:0,150
    python benchmarks/fedsp_probe.py --config fedkt/configs/fedsp/arc_easy_qwen.yaml \
        --cuts bot:0,50 --examples 8 --precision auto

**Grid** (``--grid``): for each prompt initialisation (``text``, ``random``: the
paper's) and each auxiliary model (:func:`grid_cells`: N = 1 with the suite's short
distillation; N = 1 with the reference's distillation, every auxiliary parameter, batch 16,
plain MSE, followed by client phase (i) alignment; N = 2 and 5 with the suite's
distillation; N = all layers, which is the LLM, as a sanity check whose cosine must be 1):

* the cosine of the two prompt gradients at P0, overall and per prefix slot (virtual
  layer), and the share of coordinates whose signs agree;
* the LLM's held-out loss (another client's examples) after ``--steps`` steps of FedSP's
  optimiser (AdamW, Sec. 4.3, one stage of one round) on the auxiliary model's prompt
  gradients, against steps of the same norms in random directions (fresh each step; and
  one random direction at the same final distance), and the same steps on the LLM's own
  gradient for reference.

    python benchmarks/fedsp_probe.py --grid --json grid.json

A cosine near 0 and an aux-path loss no better than the random paths' say that the
auxiliary model gives no usable prompt gradient for the LLM.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedkt.config import RunConfig, load_config
from fedkt.configs.catalog import resolve_config
from fedkt.data.splits import run_data
from fedkt.eval import predictions
from fedkt.evidence.suite import load_suite
from fedkt.infra.precision import autocast, resolve_precision
from fedkt.methods import get_method
from fedkt.methods.fedsp.algorithm import PROMPT_KEY
from fedkt.methods.fedsp.training import (
    align_auxiliary,
    align_params,
    distill_auxiliary,
    prompt_param,
    run_stage,
    set_prompts,
    stage_optimizer,
)
from fedkt.models.auxiliary import prompts_for_aux, prompts_into_llm
from fedkt.train.lm import LM, evaluate_lm, lm_batches

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



def slot_cosines(a: Tensor, b: Tensor, slots: int) -> list[float]:
    """Cosine of ``a`` and ``b`` (prompts or their gradients, ``[T, slots * width]``) per
    prefix slot, i.e. per (virtual) layer."""
    a3, b3 = a.reshape(a.shape[0], slots, -1), b.reshape(b.shape[0], slots, -1)
    return [cosine(a3[:, i], b3[:, i]) for i in range(slots)]


def optimiser_path(grad: Callable[[Tensor], Tensor], cfg: RunConfig, p0: Tensor, *,
                   steps: int, lr: float) -> list[Tensor]:
    """P_0 .. P_steps: ``steps`` steps of FedSP's prompt optimiser (``method.optimizer``:
    the paper's AdamW, warm-up and decay over one round of ``steps``) on ``grad(P_t)``."""
    p = nn.Parameter(p0.detach().clone())
    made = stage_optimizer(cfg.model_copy(update={"rounds": 1}), [p], lr=lr,
                           steps_per_round=steps, saved=None)
    assert made is not None, "the probe takes the paper's optimiser (method.optimizer: paper)"
    opt, sched = made
    path = [p0.detach().clone()]
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        p.grad = grad(p.detach().clone()).to(p.dtype)
        opt.step()
        sched.step()
        path.append(p.detach().clone())
    return path


def step_norms(path: list[Tensor]) -> list[float]:
    """The L2 norm of each step of a path."""
    return [float((b - a).norm()) for a, b in zip(path, path[1:], strict=False)]


def random_steps(p0: Tensor, norms: list[float], seed: int) -> list[Tensor]:
    """The path from P0 of one step per entry of ``norms``, step t of L2 norm ``norms[t]``
    in a fresh random (isotropic Gaussian) direction."""
    gen = torch.Generator().manual_seed(seed)
    path = [p0.detach().clone()]
    for n in norms:
        d = torch.randn(p0.shape, generator=gen, dtype=p0.dtype)
        path.append(path[-1] + n * d / d.norm())
    return path


def random_at(p0: Tensor, distance: float, seed: int) -> Tensor:
    """P0 moved by ``distance`` (L2) along one random direction."""
    d = torch.randn(p0.shape, generator=torch.Generator().manual_seed(seed), dtype=p0.dtype)
    return p0.detach() + distance * d / d.norm()


@dataclass(frozen=True)
class Cell:
    """One auxiliary model of the grid: overrides of the suite's FedSP method settings and
    the number of client alignment steps (phase (i)) taken before the measurement."""

    key: str
    name: str
    method: dict[str, Any] = field(default_factory=dict)
    align_steps: int = 0


def grid_cells(depth: int, *, ref_kd_steps: int = 500, ref_kd_lr: float = 5e-4,
               align_steps: int = 10) -> list[Cell]:
    """The grid's auxiliary models for an LLM of ``depth`` layers (bottom cut, shared)."""
    return [
        Cell("n1", "N=1, suite KD", {"aux_layers": 1}),
        Cell("n1ref", f"N=1, reference KD + {align_steps} align",
             {"aux_layers": 1, "trainable": "all", "kd_steps": ref_kd_steps, "kd_lr": ref_kd_lr,
              "kd_batch_size": 16, "kd_map": "identity"}, align_steps),
        *(Cell(f"n{n}", f"N={n}, suite KD", {"aux_layers": n}) for n in (2, 5) if n < depth),
        Cell("all", f"N={depth} (all), no KD", {"aux_layers": depth, "distill": False}),
    ]


def fedsp_server(base: RunConfig, method: dict[str, Any]) -> Any:
    """fedkt's FedSP server for ``base`` with ``method`` overrides, set up."""
    cfg = base.model_copy(update={"method": base.method.model_copy(update=method)})
    srv = get_method("fedsp").server(cfg, Path("/tmp") / "fedsp-probe")
    srv.setup()
    return srv


def align(srv: Any, p0: Tensor, records: list[dict], steps: int) -> dict[str, float]:
    """Client phase (i) on ``records``: the prompts P0 frozen, the auxiliary model's
    ``trainable`` weights trained on the task loss with FedSP's stage optimiser."""
    set_prompts(srv.aux.model, prompts_for_aux(p0, srv.spec))
    params = align_params(srv.aux.model, srv.method.trainable)
    stats, _ = run_stage(align_auxiliary, srv.cfg.model_copy(update={"rounds": 1}), params,
                         lr=srv.method.align_lr, steps=steps, saved=None, lm=srv.aux,
                         records=records, seed=srv.seed(1, "probe-align"), params=params)
    return stats


def aux_grad(srv: Any, prompts: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, float]:
    """The auxiliary model's task-loss gradient for the LLM's prompts, as the LLM's."""
    g, loss = prompt_grad(srv.aux, prompts_for_aux(prompts, srv.spec), batch)
    return prompts_into_llm(torch.zeros_like(prompts), g, srv.spec), loss


def probe_cell(srv: Any, llm: LM, p0: Tensor, g_llm: Tensor, train: dict[str, Tensor],
               heldout: dict[str, Tensor], *, steps: int, lr: float, seeds: int,
               paths: bool = True) -> dict[str, Any]:
    """One cell: gradient agreement at P0, and (``paths``) the LLM's held-out loss after
    ``steps`` optimiser steps on the auxiliary model's gradients against random steps of
    the same norms (``seeds`` draws each) and one random direction at the same distance."""
    g_aux, aux_loss = aux_grad(srv, p0, train)
    depth = srv.spec.llm_depth
    agreement = {"aux_loss": aux_loss, "cosine": cosine(g_aux, g_llm),
                 "slot_cosines": slot_cosines(g_aux, g_llm, depth),
                 "signs_agree": sign_agreement(g_aux, g_llm)}
    if not paths:
        return agreement
    path = optimiser_path(lambda p: aux_grad(srv, p, train)[0], srv.cfg, p0, steps=steps, lr=lr)
    norms = step_norms(path)
    distance = float((path[-1] - p0).norm())
    return {
        **agreement,
        "step_norms": norms,
        "distance": distance,
        "heldout_aux": loss_at(llm, path[-1], heldout),
        "heldout_random_steps": [loss_at(llm, random_steps(p0, norms, s)[-1], heldout)
                                 for s in range(seeds)],
        "heldout_random_distance": [loss_at(llm, random_at(p0, distance, 100 + s), heldout)
                                    for s in range(seeds)],
    }


def run_grid(base: RunConfig, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every initialisation x cell of the grid on ``base`` (a FedSP run config); prints
    each row as it is measured and returns the rows."""
    fd = run_data(base.data, base.clients.num_clients, base.seed)
    own = fd.private[args.client]
    other = fd.private[(args.client + 1) % len(fd.private)]
    rows: list[dict[str, Any]] = []
    header = ("| init | auxiliary model | KD steps: loss | aux loss at P0 | cos | per slot: min / "
              "median / max | signs agree | ‖ΔP‖/‖P0‖ | held-out: aux path | random steps, "
              "same norms | random, same distance | aux − random |")
    probe = fedsp_server(base, {"aux_layers": 1, "distill": False})
    depth = probe.spec.llm_depth
    del probe
    cells = [c for c in grid_cells(depth, ref_kd_steps=args.ref_kd_steps, align_steps=args.align)
             if args.cells is None or c.key in args.cells.split(",")]
    for init in args.inits.split(","):
        llm_ref: dict[str, Any] = {}
        header_done = False
        for cell in cells:
            srv = fedsp_server(base, {**cell.method, "prompt_init": init, "kd_cache": True})
            t0 = time.time()
            p0 = srv.prompts.clone()
            llm = srv.llm.reset({PROMPT_KEY: p0})
            (train,) = lm_batches(base, llm.tokenizer, own[:args.examples], seed=None,
                                  batch_size=args.examples, data=fd)
            (heldout,) = lm_batches(base, llm.tokenizer, other[:args.heldout], seed=None,
                                    batch_size=args.heldout, data=fd)
            paths = args.paths is None or cell.key in args.paths.split(",")
            if not llm_ref:
                g_llm, loss0 = prompt_grad(llm, p0, train)
                llm_ref = {"p0": p0, "g": g_llm, "train_loss": loss0,
                           "heldout_p0": loss_at(llm, p0, heldout), "norm_p0": float(p0.norm())}
                print(f"\ninit {init}: {base.server.name}, ‖P0‖ {llm_ref['norm_p0']:.1f}, LLM "
                      f"training loss {loss0:.3f} (client {args.client}'s first {args.examples}); "
                      f"held-out loss (client {(args.client + 1) % len(fd.private)}'s first "
                      f"{args.heldout}) at P0 {llm_ref['heldout_p0']:.3f}", flush=True)
            if paths and "heldout_llm" not in llm_ref:
                path = optimiser_path(lambda p, lm=llm, b=train: prompt_grad(lm, p, b)[0], srv.cfg,
                                      p0, steps=args.steps, lr=args.adam_lr)
                llm_ref["heldout_llm"] = loss_at(llm, path[-1], heldout)
                llm_ref["llm_distance"] = float((path[-1] - p0).norm())
                print(f"init {init}: after {args.steps} steps (lr {args.adam_lr:g}) on the LLM's own "
                      f"gradient, held-out loss {llm_ref['heldout_llm']:.3f} (‖ΔP‖/‖P0‖ "
                      f"{llm_ref['llm_distance'] / llm_ref['norm_p0']:.4f})", flush=True)
            if not header_done:
                print(header + "\n|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
                      flush=True)
                header_done = True
            if not torch.equal(p0, llm_ref["p0"]):
                raise SystemExit(f"cell {cell.name}: P0 differs from the first cell's")
            m = srv.method
            kd: dict[str, Any] = {}
            if m.distill and m.kd_steps:
                kd = srv.distill(1)  # Eq. 2, fedkt's own (cached in the KD cache by content)
            aligned = align(srv, p0, own, cell.align_steps) if cell.align_steps else {}
            row = {"init": init, "key": cell.key, "cell": cell.name, "method": cell.method, "kd": kd,
                   "align": aligned, **{k: v for k, v in llm_ref.items() if k not in ("p0", "g")},
                   **probe_cell(srv, llm, p0, llm_ref["g"], train, heldout, steps=args.steps,
                                lr=args.adam_lr, seeds=args.seeds, paths=paths)}
            row["seconds"] = time.time() - t0
            if cell.method.get("aux_layers") == depth:  # N = all layers: the LLM itself
                assert row["cosine"] > 0.999, f"N = all layers: cosine {row['cosine']} != 1"
            rows.append(row)
            print(format_row(row), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
            del srv, llm
            gc.collect()
    return rows


def format_row(row: dict[str, Any]) -> str:
    """One markdown table row of a grid cell."""
    slots = row["slot_cosines"]
    kd = (f"{row['kd']['kd_steps']}: {row['kd']['kd_loss_first']:.2f} → {row['kd']['kd_loss']:.3f}"
          if row["kd"] else "-")
    head = (f"| {row['init']} | {row['cell']} | {kd} | {row['aux_loss']:.3f} | "
            f"{row['cosine']:+.3f} | {min(slots):+.3f} / {statistics.median(slots):+.3f} / "
            f"{max(slots):+.3f} | {row['signs_agree']:.1%} | ")
    if "heldout_aux" not in row:
        return head + "- | - | - | - | - |"
    rs, rd = row["heldout_random_steps"], row["heldout_random_distance"]
    mean_r = statistics.mean(rs + rd)
    return (head + f"{row['distance'] / row['norm_p0']:.4f} | {row['heldout_aux']:.3f} | "
            f"{statistics.mean(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}] | "
            f"{statistics.mean(rd):.3f} [{min(rd):.3f}, {max(rd):.3f}] | "
            f"{row['heldout_aux'] - mean_r:+.3f} |")


def predict(cfg: RunConfig, lm: LM, records: list[dict]) -> tuple[float, list[Any]]:
    """fedkt's evaluation of ``lm`` on ``records``: accuracy and the per-item predictions."""
    with predictions.capture() as sink:
        metrics = evaluate_lm(cfg, lm, records, data=run_data(cfg.data, cfg.clients.num_clients, cfg.seed))
    return metrics["accuracy"], sink[""].columns["pred"]


def server_only_moves(base: RunConfig, budgets: list[tuple[int, int, float]], heldout: int,
                      evaluate: int = 0) -> list[dict[str, Any]]:
    """For each (rounds, server steps per round, lr): fedkt's server-only control (the
    suite's ``server_only`` arm: FedSP's server stage, no client), without the run's
    evaluation; the relative change of its prompts, and on client 0's first examples
    (which the server never trains on) the loss before and after and, for the first
    ``evaluate`` of them, the accuracy and how many predictions changed."""
    fd = run_data(base.data, base.clients.num_clients, base.seed)
    rows = []
    first: tuple[Tensor, float, list[Any]] | None = None
    print("| rounds × server steps | lr | ‖P_T − P0‖/‖P0‖ | server loss (last round) | "
          "held-out loss P0 → P_T | accuracy P0 → P_T (predictions changed) | seconds |\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    for rounds, steps, lr in budgets:
        t0 = time.time()
        method = base.method.model_copy(update={"server_prompt_steps": steps, "prompt_lr": lr,
                                                "server_prompt_lr": None})
        cfg = base.model_copy(update={"rounds": rounds, "method": method})
        srv = get_method(cfg.method.name).server(cfg, Path("/tmp") / "fedsp-probe")
        srv.setup()
        p0 = srv.prompts.clone()
        llm = srv.llm.reset({PROMPT_KEY: p0})
        (batch,) = lm_batches(base, llm.tokenizer, fd.private[0][:heldout], seed=None,
                              batch_size=heldout, data=fd)
        before = loss_at(llm, p0, batch)
        metrics: dict[str, float] = {}
        for rnd in range(1, rounds + 1):
            metrics = srv.round(rnd, None)  # server_only: no client is called
        moved = float((srv.prompts - p0).norm() / p0.norm())
        after = loss_at(srv.llm.reset({PROMPT_KEY: srv.prompts}), srv.prompts, batch)
        row = {"rounds": rounds, "steps": steps, "lr": lr, "moved": moved,
               "server_loss": metrics.get("train/server_loss"), "heldout_p0": before,
               "heldout_pt": after}
        acc = "-"
        if evaluate:
            items = fd.private[0][:evaluate]
            if first is None or not torch.equal(first[0], p0):  # P0's scores, once
                first = (p0, *predict(cfg, srv.llm.reset({PROMPT_KEY: p0}), items))
            _, acc0, pred0 = first
            acc1, pred1 = predict(cfg, srv.llm.reset({PROMPT_KEY: srv.prompts}), items)
            changed = sum(a != b for a, b in zip(pred0, pred1, strict=True))
            row.update(accuracy_p0=acc0, accuracy_pt=acc1, changed=changed)
            acc = f"{acc0:.3f} → {acc1:.3f} ({changed} of {len(items)})"
        row["seconds"] = time.time() - t0
        rows.append(row)
        print(f"| {rounds} × {steps} | {lr:g} | {moved:.4f} | "
              f"{metrics.get('train/server_loss', float('nan')):.3f} | {before:.3f} → {after:.3f} | "
              f"{acc} | {row['seconds']:.0f} |", flush=True)
    return rows


def parse_cuts(items: list[str]) -> list[tuple[str, list[int]]]:
    out = []
    for item in items:
        pos, _, steps = item.partition(":")
        if pos not in ("bot", "mid", "top") or not steps:
            raise SystemExit(f"--cuts {item!r}: expected POSITION:STEPS,... with POSITION "
                             "bot, mid or top")
        out.append((pos, sorted({int(s) for s in steps.split(",")})))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=str(SUITE), help="suite whose fedsp arm sets the config")
    ap.add_argument("--client", type=int, default=0)
    ap.add_argument("--examples", type=int, default=16, help="the client's first N examples")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config", default=None,
                    help="a FedSP run config (path or shipped name) instead of the suite's, "
                         "e.g. fedkt/configs/fedsp/arc_easy_qwen.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the --config (dotted, YAML value; repeatable), "
                         "e.g. method.kd_steps=50")
    ap.add_argument("--server", default=None, help="another LLM (e.g. qwen2.5-0.5b)")
    ap.add_argument("--init", choices=("text", "random"), default=None,
                    help="the prompts' initialisation (default: the config's)")
    ap.add_argument("--precision", default="fp32",
                    help="the probe's gradients and losses: fp32 (default), auto, bf16")
    cuts = ap.add_argument_group("cuts (default mode)")
    cuts.add_argument("--cuts", action="append", default=None,
                      help="POSITION:KD_STEPS,... (default: bot:0,150,600 mid:0,150 top:0,150)")
    cuts.add_argument("--lr", default="3e-3,1e-2,3e-2", help="sign-step sizes, comma-separated")
    cuts.add_argument("--kd-lr", type=float, default=None, help="default: the config's kd_lr")
    cuts.add_argument("--kd-batch", type=int, default=2, help="KD batch (small: cheap)")
    grid = ap.add_argument_group("grid (--grid)")
    grid.add_argument("--grid", action="store_true", help="run the init x auxiliary-model grid")
    grid.add_argument("--inits", default="text,random", help="prompt initialisations")
    grid.add_argument("--cells", default=None,
                      help="grid cells, comma-separated (default: all): n1 (N=1, the suite's "
                           "KD), n1ref (N=1, the reference's KD + alignment), n2, n5, all")
    grid.add_argument("--paths", default=None,
                      help="cells whose optimiser paths run (default: all; the others: "
                           "gradient agreement only)")
    grid.add_argument("--steps", type=int, default=10, help="optimiser steps per path")
    grid.add_argument("--adam-lr", type=float, default=1e-2, help="the paths' learning rate")
    grid.add_argument("--seeds", type=int, default=3, help="random draws per random control")
    grid.add_argument("--heldout", type=int, default=32, help="the next client's first N examples")
    grid.add_argument("--ref-kd-steps", type=int, default=500, help="the reference cell's KD")
    grid.add_argument("--align", type=int, default=10, help="the reference cell's align steps")
    grid.add_argument("--json", default=None, help="also write the rows here (JSON)")
    moves = ap.add_argument_group("server-only control (--server-only)")
    moves.add_argument("--server-only", action="append", default=None, metavar="R:S:LR",
                       help="rounds:server steps per round:lr of the suite's server_only arm; "
                            "prints how far its prompts move (repeatable)")
    moves.add_argument("--evaluate", type=int, default=0,
                       help="also score the first N of client 0's items before and after")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.server_only:
        budgets = [(int(r), int(st), float(lr)) for r, st, lr in
                   (b.split(":") for b in args.server_only)]
        start = time.time()
        server_only_moves(load_suite(args.suite).runs[("server_only", 0)], budgets, args.heldout,
                          args.evaluate)
        print(f"\n{time.time() - start:.0f} s wall")
        return
    with autocast(args.precision, "cpu"):
        if args.grid:
            start, cpu = time.time(), time.process_time()
            run_grid(base_config(args), args)
            print(f"\n{time.time() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")
            return
        cut_mode(args)


def dtype_name(precision: str) -> str:
    """What ``precision`` (a ``training.precision`` name) computes in on this CPU."""
    dtype = resolve_precision(precision, "cpu")
    return f"{precision} = {str(dtype or torch.float32).removeprefix('torch.')}"


def base_config(args: argparse.Namespace) -> RunConfig:
    """The FedSP run config both modes probe: ``--config`` (a path or a shipped name), else
    the suite's fedsp arm; with ``--set KEY=VALUE`` overrides of the config's keys,
    ``--server`` another LLM and ``--init`` other initial prompts."""
    if args.config:
        base = load_config(resolve_config(args.config), args.set)
    elif args.set:
        raise SystemExit("--set overrides a run config's keys; give the config with --config")
    else:
        base = load_suite(args.suite).runs[("fedsp", 0)]
    if base.method.name != "fedsp":
        raise SystemExit(f"--config {args.config}: method.name is {base.method.name!r}; the "
                         "probe takes a FedSP config (method.name: fedsp)")
    if args.server:
        base = base.model_copy(update={"server": base.server.model_copy(
            update={"name": args.server})})
    if args.init:
        base = base.model_copy(update={"method": base.method.model_copy(
            update={"prompt_init": args.init})})
    return base


def cut_mode(args: argparse.Namespace) -> None:
    """The first probe: KD steps x cut positions, one sign step per direction."""
    grid = parse_cuts(args.cuts or ["bot:0,150,600", "mid:0,150", "top:0,150"])
    lrs = [float(x) for x in args.lr.split(",")]
    start, cpu = time.time(), time.process_time()
    base = base_config(args)
    fd = run_data(base.data, base.clients.num_clients, base.seed)
    records = fd.private[args.client][:args.examples]
    public = fd.public
    kd_lr = args.kd_lr or base.method.kd_lr

    def server(position: str) -> Any:
        return fedsp_server(base, {"layer_position": position, "kd_cache": False})

    srv = server(grid[0][0])
    llm = srv.llm.reset({PROMPT_KEY: srv.prompts})
    p0 = srv.prompts.clone()
    (batch,) = lm_batches(base, llm.tokenizer, records, seed=None, batch_size=len(records), data=fd)
    g_llm, loss0 = prompt_grad(llm, p0, batch)
    rand = torch.randn(p0.shape, generator=torch.Generator().manual_seed(0))
    step = {name: "/".join(f"{loss_at(llm, p0 - lr * torch.sign(d), batch):.3f}" for lr in lrs)
            for name, d in (("llm", g_llm), ("random", rand))}
    print(f"{base.server.name} ({srv.spec.llm_depth} layers), {base.data.dataset.name}, client "
          f"{args.client}'s first {len(records)} examples, {base.method.prompt_init} prompts "
          f"{tuple(p0.shape)}, {dtype_name(args.precision)} gradients; "
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
                    data=srv.data(), steps=kd - done, lr=kd_lr, seed=srv.seed(1, "kd") + done, params=params,
                    batch_size=args.kd_batch, learn_map=srv.method.kd_map == "learned")
                kd_loss, done = f"{stats['kd_loss']:.3f}", kd
            g_aux, aux_loss = prompt_grad(srv.aux, prompts_for_aux(p0, srv.spec), batch)
            after = "/".join(f"{loss_at(llm, p0 - lr * torch.sign(g_aux), batch):.3f}"
                             for lr in lrs)
            print(f"| {position.upper()} ({srv.spec.source_layers[0]}) | {kd} | "
                  f"{kd_loss} | {aux_loss:.3f} | {cosine(g_aux, g_llm):+.3f} | "
                  f"{sign_agreement(g_aux, g_llm):.1%} | {after} |", flush=True)
    print(f"\n{time.time() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")


if __name__ == "__main__":
    main()
