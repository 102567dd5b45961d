"""Choice-posterior distillation (fedkt.alignment.choices) in each layout, side by side.

The setting of the label-free transfer suites (``suites/fedmkt_transfer``,
``suites/fedcollm_transfer``): SmolLM2-135M (offline alias ``smollm2-135m``) as the LLM
(30 layers) and as the SLM (its first 12 layers), the run's LoRA (r 8, alpha 16, dropout
0.05, all linear layers), SNIPS intents (7 choices), ``data.max_length`` 64, batches of
8, one distillation pass (``distill_choices``, 1 epoch) over 56 public samples.  Each
(model, layout) runs in a fresh process so that its peak is its own; it reports:

* seconds per KD step (``--pairs-steps N``: the pairs layout's first N steps only; wall and CPU: on a shared machine the CPU seconds are the cost);
* the process's peak resident memory (``ru_maxrss``) above what it held after imports
  (loading the model included), the distillation pass's own peak above what the process
  held when it began (Linux ``VmHWM`` reset before the pass), and what it held after
  loading the model and reading every weight once (weights, adapter: loaded weights
  become resident as they are first read);
* the bytes autograd saved for one step's backward (the step's activations), of which
  the tensors as wide as the vocabulary (logits and their log-softmax);
* the largest difference of the first batch's log-posteriors (dropout off) from the
  ``pairs`` layout's.

Layouts: ``pairs`` (every sample x choice as one whole sequence: the earlier path),
``shared`` (each context once, the batch's contexts right-padded together, the choices
after its key/value cache) and ``grouped`` (the same, one context forward per context
length: no padding, more forward calls).

    python benchmarks/choice_kd.py [--models llm,slm] [--layouts pairs,shared,grouped]
                                   [--public 56] [--pairs-steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1024**2
MODELS = {"llm": {"name": "smollm2-135m"}, "slm": {"name": "smollm2-135m", "num_layers": 12}}
LAYOUTS = ("pairs", "shared", "grouped")


def _rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _reset_pass_peak() -> bool:
    """Start a new peak (Linux: the kernel's VmHWM of this process); False if not here."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _pass_peak() -> int:
    """Peak resident bytes since :func:`_reset_pass_peak` (VmHWM)."""
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _config(model: str, public: int):
    from fedkt.config import parse_config

    return parse_config({
        "name": "choice-kd-bench", "seed": 0, "rounds": 1, "output_dir": tempfile.mkdtemp(),
        "method": {"name": "fedavg"},
        "clients": {"num_clients": 2, "models": [MODELS[model]]},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "fedmkt", "test_size": 140, "server_size": 120},
                 "public_labels": False, "max_public": public, "max_length": 64},
        "training": {"precision": "auto", "batch_size": 8, "peft": "lora",
                     "lora": {"r": 8, "alpha": 16, "dropout": 0.05,
                              "target_modules": "all-linear"}},
        "eval": {"plots": False}}, "benchmark")


def grouped_logprobs(model, encoded, pad_id: int, temperature: float = 1.0, layout=None):
    """The shared layout with one context forward per context length (no padding)."""
    import torch

    from fedkt.alignment import choices

    splits = [choices._split(row) for row in encoded]
    by_length: dict[int, list[int]] = {}
    for b, split in enumerate(splits):
        by_length.setdefault(len(split[0]), []).append(b)
    c = len(encoded[0])
    rows: dict[int, torch.Tensor] = {}
    for group in by_length.values():
        scores = choices._shared_scores(model, [splits[b] for b in group], pad_id)
        rows.update(zip(group, scores.view(len(group), c), strict=True))
    return (torch.stack([rows[b] for b in range(len(encoded))]) / temperature).log_softmax(-1)


def measure_one(model: str, layout: str, public: int, out: str,
                max_steps: int | None = None) -> dict:
    """In this process: load ``model``, one distillation pass in ``layout`` (its first
    ``max_steps`` steps)."""
    import functools

    import torch

    from fedkt.alignment import choices
    from fedkt.data.splits import run_data
    from fedkt.train.lm import client_lm

    torch.set_num_threads(1)
    cfg = _config(model, public)
    data = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    records = data.public
    base = _rss()
    lm = client_lm(cfg, 0)
    # The loaded weights become resident as they are first read: read them all now, so
    # that the model's memory is counted as the model's, not the pass's.
    with torch.no_grad():
        for t in [*lm.model.parameters(), *lm.model.buffers()]:
            t.sum()
    loaded = _rss() - base
    plain = choices.choice_logprobs
    if layout == "grouped":
        choices.choice_logprobs = grouped_logprobs
    else:
        choices.choice_logprobs = functools.partial(plain, layout=layout)
    encoded = choices.encode(cfg, lm.tokenizer, records, data=data)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    saved = {"all": 0, "vocab": 0}
    # Storages counted once (a saved view holds its whole storage); the weights a linear
    # layer saves for its backward are the model's, not the step's.
    seen = {t.untyped_storage().data_ptr() for t in [*lm.model.parameters(),
                                                      *lm.model.buffers()]}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            saved["all"] += storage.nbytes()
            saved["vocab"] += storage.nbytes() if t.dim() and t.shape[-1] == vocab else 0
        return t

    target = torch.full((len(records), 7), 1 / 7)
    taken = torch.ones(len(records), dtype=torch.bool)
    before = _rss()
    resets = _reset_pass_peak()
    start, cpu = time.perf_counter(), time.process_time()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stats = choices.distill_choices(cfg, lm, records, target, taken, data=data, epochs=1,
                                        lr=1e-3, seed=0, kd_weight=1.0, max_steps=max_steps)
    steps = max(1, stats["steps"])
    step_s, step_cpu_s = (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps
    pass_peak = (_pass_peak() - before) / MB if resets else float("nan")
    peak = (_peak() - base) / MB
    # After the pass (so that neither its start nor the peaks hold this): the first
    # batch's log-posteriors of the initial adapter, dropout off.
    lm.reset()
    lm.model.eval()
    with torch.no_grad():
        torch.save(choices.choice_logprobs(lm.model, encoded[:8], pad), out)
    choices.choice_logprobs = plain
    tokens = [len(seq) - 1 for row in encoded for seq, _ in row]
    return {"model": model, "layout": layout, "layers": lm.model.config.num_hidden_layers,
            "steps": stats["steps"], "kd_loss": stats["kd_loss"],
            "step_s": step_s, "step_cpu_s": step_cpu_s,
            "loaded_mb": loaded / MB, "peak_mb": peak,
            "pass_peak_mb": pass_peak,
            "saved_mb": saved["all"] / MB / steps, "vocab_mb": saved["vocab"] / MB / steps,
            "mean_tokens": sum(tokens) / len(tokens),
            "mean_choice_tokens": sum(n for row in encoded for _, n in row) / len(tokens)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--public", type=int, default=56)
    parser.add_argument("--pairs-steps", type=int, default=None,
                        help="only the first N steps of the pass in the pairs layout "
                             "(the slow one)")
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "LAYOUT", "OUT", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        model, layout, out, steps = args.one
        print(json.dumps(measure_one(model, layout, args.public, out, int(steps) or None)))
        return
    import torch

    print(f"machine: {os.cpu_count()} cores, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, 1 torch thread, load "
          f"{os.getloadavg()[0]:.1f}; {args.public} public samples x 7 intents, batch 8, "
          f"max_length 64")
    print("| model | layout | steps | s/step | CPU s/step | vs pairs (CPU) | peak RSS MB | "
          "pass peak MB | model MB | saved/step MB | of it vocab-wide MB | max abs diff logq |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            ref = None
            for layout in args.layouts.split(","):
                out = f"{tmp}/{model}-{layout}.pt"
                done = subprocess.run(
                    [sys.executable, __file__, "--public", str(args.public), "--one", model,
                     layout, out, str(args.pairs_steps or 0) if layout == "pairs" else "0"],
                    capture_output=True, text=True, cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
                if done.returncode != 0:
                    print(f"| {model} | {layout} | failed: "
                          f"{done.stderr.strip().splitlines()[-1]} |")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                logq = torch.load(out)
                diff = 0.0 if ref is None else float((logq - ref[1]).abs().max())
                ref = ref or (r, logq)
                print(f"| {model} ({r['layers']} layers) | {layout} | {r['steps']} | {r['step_s']:.2f} | "
                      f"{r['step_cpu_s']:.2f} | {ref[0]['step_cpu_s'] / r['step_cpu_s']:.2f}x "
                      f"| {r['peak_mb']:.0f} | {r['pass_peak_mb']:.0f} | {r['loaded_mb']:.0f} | {r['saved_mb']:.0f} | "
                      f"{r['vocab_mb']:.0f} | {diff:.1e} |", flush=True)
    print(f"tokens per (sample, choice) sequence: {r['mean_tokens']:.1f}, of them scored: "
          f"{r['mean_choice_tokens']:.1f}")


if __name__ == "__main__":
    main()
