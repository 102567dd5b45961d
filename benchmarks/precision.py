"""fp32 vs bf16 (``training.precision``) side by side on a real model.

For SmolLM2-135M (offline alias ``smollm2-135m``) with q/v LoRA, the script measures
under ``training.precision: fp32`` and ``bf16``, through fedkt's own code paths:

* training throughput: :func:`fedkt.train.lm.train_lm` on batches of
  ``--batch-size`` x ``--max-length`` tokens (target tokens/s counts every real token);
* scoring throughput: :func:`fedkt.train.lm.evaluate_lm` (log-likelihood
  multiple choice), items/s;
* zero-shot accuracy of that scoring on ``--items`` multiple-choice items (default
  500 of Social IQa, 3 choices each) and its difference between the two precisions.

bf16 needs a CPU with AVX512-BF16 / AMX or a GPU; elsewhere it is emulated and slow.
Throughput is given per wall-clock second and per CPU-second of this process (the
latter is steadier on a shared machine); the load average is printed before and after.

    python benchmarks/precision.py [--items 500] [--steps 6] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from fedkt.config import parse_config
from fedkt.data.splits import run_data
from fedkt.infra.precision import cpu_supports_bf16, resolve_precision, set_threads
from fedkt.train.lm import (
    clear_cache,
    client_lm,
    evaluate_lm,
    lm_batches,
    train_lm,
)


def run_config(args: argparse.Namespace, precision: str):
    return parse_config({
        "name": "precision-bench", "seed": 0, "method": "standalone",
        "clients": {"num_clients": 1, "models": [{"name": args.model}]},
        "data": {"dataset": {"name": args.dataset},
                 "split": {"scheme": "holdout", "test_size": args.items},
                 "max_length": args.max_length},
        "training": {"batch_size": args.batch_size, "max_steps": args.steps,
                     "precision": precision, "warmup_ratio": 0.0},
        "runtime": {"torch_threads": args.threads, "device": "cpu"},
        "eval": {"batch_size": args.eval_batch_size},
    }, "benchmarks/precision.py")


def train_speed(cfg, records: list[dict]) -> tuple[float, float, float, float]:
    """(tokens/s, tokens per CPU-second, seconds per step, mean loss) of
    ``cfg.training.max_steps`` steps after one warm-up step; every batch is full."""
    lm = client_lm(cfg, 0)
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)  # what the records are of
    steps = cfg.training.max_steps
    need = cfg.training.batch_size * (steps + 1)
    records = (records * (need // max(1, len(records)) + 1))[:need]
    warm, timed = records[:cfg.training.batch_size], records[cfg.training.batch_size:]
    one = cfg.model_copy(update={"training": cfg.training.model_copy(update={"max_steps": 1})})
    train_lm(one, lm, warm, seed=0, data=fd)
    tokens = sum(int(b["attention_mask"].sum())
                 for b in lm_batches(cfg, lm.tokenizer, timed, seed=1, data=fd)[:steps])
    t0, c0 = time.perf_counter(), time.process_time()
    stats = train_lm(cfg, lm, timed, seed=1, data=fd)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return tokens / seconds, tokens / cpu, seconds / stats["steps"], stats["loss"]


def score(cfg, records: list[dict]) -> tuple[float, float, dict[str, float]]:
    """(items/s, items per CPU-second, metrics) of zero-shot multiple-choice scoring."""
    lm = client_lm(cfg, 0)
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)  # what the records are of
    evaluate_lm(cfg, lm, records[: cfg.eval.batch_size], data=fd)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = evaluate_lm(cfg, lm, records, data=fd)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(records) / seconds, len(records) / cpu, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="social_iqa")
    ap.add_argument("--items", type=int, default=500, help="multiple-choice items scored")
    ap.add_argument("--steps", type=int, default=6, help="timed training steps")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--eval-batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="default: physical cores")
    args = ap.parse_args()

    threads = set_threads(args.threads)
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {threads} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, native bf16: {cpu_supports_bf16()}, "
          f"'auto' -> {resolve_precision('auto', 'cpu') or 'fp32'}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    results = {}
    for precision in ("fp32", "bf16"):
        clear_cache()
        cfg = run_config(args, precision)
        fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
        tok_s, tok_cpu, step_s, loss = train_speed(cfg, fd.private[0])
        items_s, items_cpu, metrics = score(cfg, fd.test)
        results[precision] = dict(metrics, tok_s=tok_s, tok_cpu=tok_cpu, step_s=step_s,
                                  train_loss=loss, items_s=items_s, items_cpu=items_cpu)
        print(f"  {precision}: done ({step_s:.2f} s/step, {items_s:.1f} items/s)", flush=True)
    a, b = results["fp32"], results["bf16"]
    n = len(fd.test)
    print(f"\n{args.model}, q/v LoRA; training batches {args.batch_size}x{args.max_length}; "
          f"zero-shot scoring of {n} {args.dataset} items (batch {args.eval_batch_size})\n")
    rows = [("training tokens/s", "tok_s", "{:.0f}"),
            ("training tokens per CPU-second", "tok_cpu", "{:.0f}"),
            ("training s/step", "step_s", "{:.2f}"),
            ("scoring items/s", "items_s", "{:.2f}"),
            ("scoring items per CPU-second", "items_cpu", "{:.2f}"),
            ("zero-shot accuracy", "accuracy", "{:.4f}"),
            ("zero-shot accuracy_norm", "accuracy_norm", "{:.4f}"),
            ("scoring loss (nats/token)", "loss", "{:.4f}"),
            ("training loss (timed steps)", "train_loss", "{:.4f}")]
    print("| measure | fp32 | bf16 | bf16 / fp32 |")
    print("|---|---|---|---|")
    for label, key, fmt in rows:
        ratio = b[key] / a[key] if a[key] else float("nan")
        print(f"| {label} | {fmt.format(a[key])} | {fmt.format(b[key])} | {ratio:.2f}x |")
    diff = 100 * (b["accuracy"] - a["accuracy"])
    diff_norm = 100 * (b["accuracy_norm"] - a["accuracy_norm"])
    print(f"\naccuracy difference bf16 - fp32: {diff:+.2f} points (acc), {diff_norm:+.2f} "
          f"points (acc_norm) on {n} items; load average now "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
