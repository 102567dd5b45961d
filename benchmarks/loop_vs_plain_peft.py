"""fedkt's LoRA training step against a minimal plain PyTorch + PEFT loop, side by side.

Both sides train SmolLM2-135M (offline alias ``smollm2-135m``) with LoRA (fedkt's
defaults: r 8, alpha 16, dropout 0.05 on peft's q/v targets), fp32, from the same
initial adapter, on the same batches (``--steps`` batches of ``--batch-size`` intent
utterances of client 0, padded to at most ``--max-length`` tokens, built by
:func:`fedkt.train.lm.lm_batches`), with the same optimiser (AdamW, ``training.lr``,
betas, weight decay), gradient clipping at ``training.max_grad_norm`` and dropout seed:

* fedkt: :func:`fedkt.train.lm.train_lm` as a run's client calls it (it tokenises and
  batches the records, builds the optimiser and schedule, runs
  :func:`fedkt.train.loop.run_steps` with :func:`fedkt.train.optim.step`);
* plain: its own ``peft.get_peft_model`` on a second copy of the base weights, the
  adapter set to fedkt's initial one, and ``for batch: loss = model(**batch).loss;
  loss.backward(); clip_grad_norm_; opt.step(); opt.zero_grad()``.

The sides alternate (fedkt, plain, plain, fedkt, ...) for ``--reps`` rounds, one torch
thread.  Printed: seconds per step of each side (median and range; wall and CPU
seconds of this process), fedkt's overhead in % (its whole call, and its loop alone),
the per-step losses of both and the largest difference of the trained adapters, then a
profile of one more fedkt call: where its time goes outside the model's forward, backward
and the optimiser's step.

    python benchmarks/loop_vs_plain_peft.py [--steps 6] [--reps 3] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from typing import Any

import torch

MODEL = "smollm2-135m"


def build(args: argparse.Namespace) -> tuple[Any, Any, list[dict], list[dict]]:
    """(run config, fedkt's LM, the records, the batches train_lm builds from them)."""
    from fedkt.config import parse_config
    from fedkt.data.splits import run_data
    from fedkt.train.lm import client_lm, lm_batches

    cfg = parse_config({
        "name": "loop-bench", "seed": 0, "method": "standalone",
        "clients": {"num_clients": 1, "models": [{"name": MODEL}]},
        "data": {"dataset": {"name": "intent_recognition"}, "max_length": args.max_length},
        "training": {"batch_size": args.batch_size, "max_steps": args.steps,
                     "precision": "fp32"},
        "runtime": {"torch_threads": 1, "device": "cpu"},
    }, "benchmarks/loop_vs_plain_peft.py")
    lm = client_lm(cfg, 0)
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    records = fd.private[0]
    need = args.batch_size * args.steps
    if len(records) < need:
        raise SystemExit(f"client 0 has {len(records)} records, fewer than {need}")
    records = records[:need]
    batches = lm_batches(cfg, lm.tokenizer, records, seed=args.seed, data=fd)  # train_lm's, epoch 0
    return cfg, lm, records, batches


def plain_model(lm: Any, cfg: Any) -> tuple[torch.nn.Module, list[torch.nn.Parameter]]:
    """A second copy of the base weights with its own peft LoRA, set to fedkt's initial."""
    from peft import LoraConfig, get_peft_model

    from fedkt.config import ModelConfig
    from fedkt.models.adapters import default_lora_targets
    from fedkt.models.causal_lm import load_causal_lm

    base, _ = load_causal_lm(ModelConfig(name=MODEL))
    lora = cfg.training.lora
    model = get_peft_model(base, LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
        target_modules=default_lora_targets(base), task_type="CAUSAL_LM"))
    ours = dict(lm.model.named_parameters())
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    mine = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    if names != mine:
        raise SystemExit("the plain model's trainable weights differ from fedkt's")
    model.initial = {n: ours[n].detach().clone() for n in names}  # type: ignore[attr-defined]
    return model, params


def reset_plain(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(model.initial[n])


def plain_loop(model: torch.nn.Module, params: list[torch.nn.Parameter], batches: list[dict],
               cfg: Any, seed: int) -> list[float]:
    """The minimal loop: forward, backward, clip, step, zero the gradients."""
    t = cfg.training
    opt = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    torch.manual_seed(seed)
    model.train()
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def fedkt_call(cfg: Any, lm: Any, records: list[dict], seed: int) -> tuple[list[float], float]:
    """train_lm as a client calls it; (its per-step losses, its loop's own seconds)."""
    import fedkt.train.lm as train_lm_module
    from fedkt.data.splits import run_data

    kept: dict[str, Any] = {}
    run_steps = train_lm_module.run_steps

    def keep(*a: Any, **k: Any) -> Any:
        kept["stats"] = run_steps(*a, **k)
        return kept["stats"]

    train_lm_module.run_steps = keep
    try:
        lm.reset()
        train_lm_module.train_lm(cfg, lm, records, seed=seed, data=run_data(cfg.data, cfg.clients.num_clients, cfg.seed))
    finally:
        train_lm_module.run_steps = run_steps
    return kept["stats"].losses, kept["stats"].seconds


def _med(values: list[float]) -> str:
    return (f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"
            if len(values) > 1 else f"{values[0]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="training steps per call")
    ap.add_argument("--reps", type=int, default=3, help="interleaved calls of each side")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    args = ap.parse_args()

    from fedkt.infra.precision import set_threads

    set_threads(1)
    load0 = os.getloadavg()
    cfg, lm, records, batches = build(args)
    plain, params = plain_model(lm, cfg)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"{MODEL}, LoRA r={cfg.training.lora.r} (q/v), fp32, {args.steps} steps of "
          f"{args.batch_size} x <= {args.max_length} tokens ({tokens} real tokens), 1 torch "
          f"thread; CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in load0)}",
          flush=True)
    # one warm-up call of each side (allocator, lazy init), not timed
    fedkt_call(cfg, lm, records[: args.batch_size], args.seed)
    reset_plain(plain)
    plain_loop(plain, params, batches[:1], cfg, args.seed)

    wall: dict[str, list[float]] = {"fedkt": [], "fedkt loop": [], "plain": []}
    cpu: dict[str, list[float]] = {"fedkt": [], "plain": []}
    losses: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for side in (("fedkt", "plain") if rep % 2 == 0 else ("plain", "fedkt")):
            t, c = time.perf_counter(), time.process_time()
            if side == "fedkt":
                losses["fedkt"], loop_s = fedkt_call(cfg, lm, records, args.seed)
                wall["fedkt loop"].append(loop_s / args.steps)
            else:
                reset_plain(plain)
                losses["plain"] = plain_loop(plain, params, batches, cfg, args.seed)
            wall[side].append((time.perf_counter() - t) / args.steps)
            cpu[side].append((time.process_time() - c) / args.steps)
        print(f"  rep {rep + 1}: fedkt {wall['fedkt'][-1]:.3f} s/step, plain "
              f"{wall['plain'][-1]:.3f} s/step", flush=True)
    mine = {n: p.detach() for n, p in lm.model.named_parameters() if p.requires_grad}
    diff = max(float((mine[n] - p.detach()).abs().max())
               for n, p in plain.named_parameters() if p.requires_grad)
    load1 = os.getloadavg()

    print(f"\nload average before {' '.join(f'{x:.2f}' for x in load0)}, after "
          f"{' '.join(f'{x:.2f}' for x in load1)}; median [min-max] over {args.reps} "
          "interleaved calls of each side\n")
    print("| side | s/step (wall) | steps/s | CPU s/step | overhead vs plain (wall, CPU) |")
    print("|---|---|---|---|---|")
    p_wall, p_cpu = statistics.median(wall["plain"]), statistics.median(cpu["plain"])
    for side in ("plain", "fedkt", "fedkt loop"):
        w = statistics.median(wall[side])
        c = cpu.get(side)
        over = (f"{100 * (w / p_wall - 1):+.1f}%"
                + (f", {100 * (statistics.median(c) / p_cpu - 1):+.1f}%" if c else ""))
        label = {"fedkt": "fedkt train_lm (whole call)",
                 "fedkt loop": "fedkt run_steps (its loop alone)"}.get(side, "plain PEFT loop")
        print(f"| {label} | {_med(wall[side])} | {1 / w:.3f} | "
              f"{_med(c) if c else 'n/a'} | {over if side != 'plain' else '-'} |")
    print(f"\nlosses per step, fedkt: {' '.join(f'{x:.5f}' for x in losses['fedkt'])}")
    print(f"losses per step, plain: {' '.join(f'{x:.5f}' for x in losses['plain'])}")
    print(f"largest loss difference {max(abs(a - b) for a, b in zip(losses['fedkt'], losses['plain'], strict=True)):.2e}; "
          f"largest difference of the trained LoRA weights {diff:.2e}")
    if args.profile:
        profile_fedkt(cfg, lm, records, args.seed)


def profile_fedkt(cfg: Any, lm: Any, records: list[dict], seed: int) -> None:
    """cProfile of one fedkt call: the model's work against everything around it."""
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    fedkt_call(cfg, lm, records, seed)
    prof.disable()
    total = time.perf_counter() - t
    stats = pstats.Stats(prof)
    entries = stats.stats  # type: ignore[attr-defined]

    def cum(pred: Any) -> float:
        return sum(v[3] for k, v in entries.items() if pred(k))

    parts = {
        "forward (model.__call__ of the PeftModel)": cum(
            lambda k: k[0].endswith("peft_model.py") and k[2] == "forward"),
        "backward (Tensor.backward)": cum(lambda k: k[2] == "backward" and "_tensor" in k[0]),
        "optimiser step (AdamW.step)": cum(lambda k: k[0].endswith(("adam.py", "adamw.py"))
                                           and k[2] == "step"),
        "gradient clipping (clip_grad_norm_)": cum(lambda k: k[2] == "clip_grad_norm_"),
        "zero_grad": cum(lambda k: k[2] == "zero_grad" and "optimizer" in k[0]),
        "tokenising and batching (lm_batches)": cum(lambda k: k[2] == "lm_batches"),
        "optimiser and schedule setup (make_optimizer)": cum(
            lambda k: k[2] == "make_optimizer"),
        "schedule step (LambdaLR.step)": cum(lambda k: k[0].endswith("lr_scheduler.py")
                                             and k[2] == "step"),
        "adapter reset (LM.reset)": cum(lambda k: k[2] == "reset" and "train/lm.py" in k[0]),
    }
    print(f"\nprofile of one more fedkt call: {total:.2f} s under cProfile (its own overhead "
          "included)\n")
    print("| part | s | share |")
    print("|---|---|---|")
    for name, seconds in parts.items():
        print(f"| {name} | {seconds:.3f} | {seconds / total:.1%} |")
    rest = total - sum(parts.values())
    print(f"| everything else | {rest:.3f} | {rest / total:.1%} |")


if __name__ == "__main__":
    main()
