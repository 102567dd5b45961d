"""Attention's backward on the CPU under bf16: torch's default kernel against its math one.

Two parts, printed side by side:

* the op: ``scaled_dot_product_attention`` forward and backward (ms, CPU time, the best
  of ``--repeats``) at the shapes fedkt's training runs: a choice-distillation step's
  choices after their context's cache (50 rows, 9 heads of 64, 3 query positions, a
  context of ``L`` key positions and a padding mask) and a local training step (8
  sequences of 64 tokens, causal), in bf16 with torch's default kernel (flash attention
  on the CPU) and with the math kernel, and in fp32 with the default;
* a choice-distillation pass (:func:`fedkt.alignment.choices.distill_choices`) of the
  server LLM of ``suites/clinc150_fedmkt_transfer`` (SmolLM2-135M, LoRA on every linear
  layer, 30 intents, ``kd_micro_batch: 2``) on ``--public`` public records of fold 0 with
  seeded targets, for each of ``--classes`` (the suite's 30 intents, and the keep pilots'
  other 30, whose longer queries put more contexts past the kernel's slow size): CPU
  seconds a step and the pass's peak resident memory above what the process held before
  it, under bf16 (default kernel, then math) and fp32.

    python benchmarks/attention_backward.py [--public 48] [--classes 0-29,30-59]
                                            [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from choice_kd import _pass_peak, _reset_pass_peak  # noqa: E402

MB = 1024**2
KERNELS = {"bf16, default": (torch.bfloat16, None), "bf16, math": (torch.bfloat16, "math"),
           "fp32, default": (torch.float32, None)}


def _kernel(name: str | None):
    return sdpa_kernel(SDPBackend.MATH) if name == "math" else contextlib.nullcontext()


def op_ms(rows: int, q: int, keys: int, dtype: torch.dtype, kernel: str | None,
          causal: bool, repeats: int) -> tuple[float, float]:
    """(forward ms, backward ms) of one attention call, the best of ``repeats``."""
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(rows, 9, n, 64, generator=gen).to(dtype).requires_grad_()
           for n in (q, keys, keys)]
    mask = None if causal else torch.ones(rows, 1, q, keys, dtype=torch.bool).tril(keys - q)
    fwd, bwd = [], []
    with _kernel(kernel):
        for _ in range(repeats):
            t = time.process_time()
            out = F.scaled_dot_product_attention(*qkv, attn_mask=mask, is_causal=causal)
            fwd.append(time.process_time() - t)
            t = time.process_time()
            out.sum().backward()
            bwd.append(time.process_time() - t)
    return 1000 * min(fwd), 1000 * min(bwd)


def distill_pass(kernel_name: str, public: int, classes: str
                 ) -> tuple[float, float, float, float]:
    """(CPU s a step, the pass's peak MB above its start, the mean loss, the mean context
    length in tokens) of one distillation pass of the suite's server LLM on the intents
    ``classes`` under ``kernel_name``."""
    from fedkt.alignment import choices
    from fedkt.data.splits import run_data
    from fedkt.evidence.suite import load_suite
    from fedkt.train.lm import clear_cache, server_lm

    dtype, kernel = KERNELS[kernel_name]
    suite = load_suite(ROOT / "fedkt" / "configs" / "suites" / "clinc150_fedmkt_transfer.yaml",
                       ROOT / "runs" / "attention_backward_bench")
    cfg = suite.runs[("fedmkt", suite.seeds[0])]
    precision = "fp32" if dtype == torch.float32 else "bf16"
    cfg = cfg.model_copy(update={
        "training": cfg.training.model_copy(update={"precision": precision, "reuse": False}),
        "data": cfg.data.model_copy(update={"dataset": cfg.data.dataset.model_copy(
            update={"classes": classes})})})
    data = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    records = data.public[:public]
    clear_cache()
    lm = server_lm(cfg, data)
    gen = torch.Generator().manual_seed(0)
    targets = torch.randn(len(records), len(data.label_names), generator=gen).softmax(-1)
    taken = torch.ones(len(records), dtype=torch.bool)
    encoded = choices.encode(cfg, lm.tokenizer, records, data=data)
    context = sum(len(choices._split(row)[0]) for row in encoded) / len(encoded)
    resets = _reset_pass_peak()
    before = _pass_peak() if resets else 0
    cpu = time.process_time()
    with _kernel(kernel):
        stats = choices.distill_choices(cfg, lm, records, targets, taken, data=data, epochs=1,
                                        lr=1e-3, seed=0, kd_weight=1.0)
    step = (time.process_time() - cpu) / max(1, stats["steps"])
    peak = (_pass_peak() - before) / MB if resets else float("nan")
    return step, peak, stats["loss"], context


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--public", type=int, default=48)
    parser.add_argument("--classes", default="0-29,30-59")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), load average before {os.getloadavg()[0]:.2f}")
    shapes = [("choices after a context", 50, 3, keys, False) for keys in (16, 20, 22, 32, 48)]
    shapes.append(("local training", 8, 64, 64, True))
    print("\n| attention call | " + " | ".join(f"{k} fwd / bwd ms" for k in KERNELS) + " |")
    print("|---|" + "---:|" * len(KERNELS))
    for what, rows, q, keys, causal in shapes:
        cells = [op_ms(rows, q, keys, dtype, kernel, causal, args.repeats)
                 for dtype, kernel in KERNELS.values()]
        print(f"| {what}: [{rows}, 9, {q}, 64] x {keys} keys | "
              + " | ".join(f"{f:.1f} / {b:.1f}" for f, b in cells) + " |")
    print(f"\n| distillation pass ({args.public} public records) | intents | mean context "
          "tokens | CPU s a step | peak MB above its start | mean loss |")
    print("|---|---|---:|---:|---:|---:|")
    for classes in args.classes.split(","):
        for name in KERNELS:
            step, peak, loss, context = distill_pass(name, args.public, classes)
            print(f"| {name} | {classes} | {context:.1f} | {step:.2f} | {peak:.0f} | "
                  f"{loss:.4f} |")
    print(f"\nload average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
