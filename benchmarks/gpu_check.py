"""GPU check: fedkt on CUDA against the CPU, and a 7B-layout server LLM beside 1B clients.

Prepared for a machine with one NVIDIA GPU (H100/H200), PyTorch, transformers, peft and
accelerate, and no network: fedkt's other dependencies come as wheels in
``benchmarks/.gpu_wheels/`` (``bash benchmarks/gpu_wheels.sh`` here, carried along; see
docs/records/performance.md, "GPU check"). Models are built from configs (random weights), so no
checkpoint travels. Parts (``--part``, default ``all``), each under 5 minutes on an H100:

``tiny``  every registered method on its tiny config (1 round) on the CPU in fp32, on CUDA in
          fp32 (TF32 off) and on CUDA in bf16 (``training.precision: bf16``): each must
          finish; at round 0 (untrained, forward only) CUDA fp32 matches the CPU within
          1e-3 (relative, losses) with equal accuracies and F1; after the round, whose
          dropout and kernels follow other random streams on CUDA, losses within 5e-2 and
          accuracy within 0.25; bf16 within those tolerances throughout;
``big``   a random-weight Llama-2-7B-layout server LLM (6.7B parameters) with LoRA, bf16
          weights, beside two 1B-layout (TinyLlama-1.1B) clients, FedMKT in the local
          runtime, 1 round on a few records of max_length 256: wall time, peak GPU
          memory per participant (load + train steps) and of the whole run, training
          tokens/s of each model;
``big4``  the same with the server's base in 4-bit NF4 (bitsandbytes), if importable.

It prints one line per measurement and exits non-zero when a check fails.

    python benchmarks/gpu_check.py --part tiny
    python benchmarks/gpu_check.py --part big,big4 --work /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WHEELS = ROOT / "benchmarks" / ".gpu_wheels" / "site"
if WHEELS.is_dir():  # installed by `bash benchmarks/gpu_wheels.sh --install`
    sys.path.insert(1, str(WHEELS))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GIB = 1 << 30
# Llama-2-7B and TinyLlama-1.1B layouts (their config.json values), vocabulary 32000.
LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                 max_position_embeddings=4096, rms_norm_eps=1e-5)
LLAMA_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                max_position_embeddings=2048, rms_norm_eps=1e-5)
FAILURES: list[str] = []
# (round, run, relative tolerance on losses, absolute on accuracy-like metrics) against
# the CPU in fp32. Round 0 is the untrained models (forward only): CUDA fp32 must match.
# After a round of training CUDA's dropout masks and kernels follow other random streams
# and reduction orders than the CPU's, so round 1 is compared loosely (loss and accuracy),
# as bf16 is.
TOLERANCES = ((0, "cuda32", 1e-3, 0.0), (0, "cuda16", 5e-2, 0.25),
              (1, "cuda32", 5e-2, 0.25), (1, "cuda16", 5e-2, 0.25))


def check(ok: bool, what: str) -> None:
    print(("  ok   " if ok else "  FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


# --------------------------------------------------------------------------- tiny


def _evals(rows: list[dict]) -> dict[int, dict[str, dict[str, float]]]:
    """Test numbers (loss and accuracy-like metrics) per round and participant."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for row in rows:
        if row.get("split") != "test":
            continue
        out.setdefault(int(row["round"]), {})[row["participant"]] = {
            k: v for k, v in row.items() if isinstance(v, float)
            and k in ("loss", "accuracy", "macro_f1", "rougeL", "f1")}
    return out


def _tiny_run(config: str, work: Path, device: str, precision: str) -> dict:
    """``CONFIG@METHOD``: that config with ``method.name=METHOD``, 1 round."""
    from fedkt.cli import main
    from fedkt.tracking import read_rows

    config, _, method = config.partition("@")
    out = work / f"{config.replace('/', '_')}-{method}-{device}-{precision}"
    sets = [*([f"method.name={method}"] if method else []), "rounds=1", "eval.plots=false",
            f"runtime.device={device}", f"training.precision={precision}"]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", config, "-q", "--overwrite", "--output-dir", str(out),
                   *sum((["--set", s] for s in sets), [])])
    if rc != 0:
        raise RuntimeError(f"{config} on {device} ({precision}) exited {rc}")
    return {"evals": _evals(read_rows(out / "metrics.jsonl")),
            "seconds": time.perf_counter() - start}


def part_tiny(work: Path) -> None:
    import torch

    from fedkt.methods import available, get_method

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    configs = sorted(f"{get_method(n).conformance.tiny_config}@{n}" for n in available()
                     if get_method(n).conformance.tiny_config)
    print(f"tiny: every method on its tiny config ({len(configs)}), CPU fp32 / CUDA fp32 / "
          "CUDA bf16", flush=True)
    for config in configs:
        try:
            runs = {key: _tiny_run(config, work, dev, prec)
                    for key, dev, prec in (("cpu", "cpu", "fp32"), ("cuda32", "cuda", "fp32"),
                                           ("cuda16", "cuda", "bf16"))}
        except ModuleNotFoundError as exc:  # e.g. scikit-learn for the image configs
            print(f"{config:<40} skipped: {exc} (see benchmarks/gpu_wheels.sh)", flush=True)
            continue
        except Exception as exc:  # noqa: BLE001 - report and go on with the next config
            check(False, f"{config}: {type(exc).__name__}: {exc}")
            print("".join(traceback.format_exception(exc)[-6:]), flush=True)
            continue
        print(f"{config:<40} seconds cpu {runs['cpu']['seconds']:.1f}, cuda fp32 "
              f"{runs['cuda32']['seconds']:.1f}, cuda bf16 {runs['cuda16']['seconds']:.1f}",
              flush=True)
        for rnd, key, rtol, atol in TOLERANCES:
            cpu = runs["cpu"]["evals"].get(rnd, {})
            if not cpu:  # e.g. a zero-shot baseline evaluates once, at round 1
                continue
            got_all = runs[key]["evals"].get(rnd, {})
            worst = []
            for part, metrics in cpu.items():
                for name, ref in metrics.items():
                    if rnd > 0 and name not in ("loss", "accuracy"):
                        continue  # F1 of a near-constant tiny classifier flips with one item
                    got = got_all.get(part, {}).get(name, math.nan)
                    tol = rtol * abs(ref) if name == "loss" else atol
                    worst.append((abs(got - ref) - tol, part, name, ref, got))
            bad = max(worst) if worst else (0, "-", "-", 0, 0)
            check(bool(worst) and bad[0] <= 0, f"{config} round {rnd} {key} vs cpu: worst "
                  f"{bad[1]}.{bad[2]} {bad[3]:.4f} -> {bad[4]:.4f}")
            if bad[0] > 0:  # the whole participant, to tell a near-tie flip from a bug
                print(f"    {bad[1]} cpu {cpu[bad[1]]}\n    {bad[1]} {key} "
                      f"{got_all.get(bad[1])}", flush=True)


# --------------------------------------------------------------------------- big


def _save_random(layout: dict, folder: Path, seed: int) -> Path:
    """A random-weight Llama of ``layout`` in bf16, made on the GPU and saved, with the
    tiny-llama tokenizer (ids below the vocabulary)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fedkt.models.tokenizers import load_tiny_tokenizer

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**layout, tie_word_embeddings=False)).to(
            torch.bfloat16)
    model.save_pretrained(str(folder))
    load_tiny_tokenizer("tiny-llama").save_pretrained(str(folder))
    del model
    torch.cuda.empty_cache()
    return folder


def _big_config(work: Path, server: Path, client: Path, quant: bool) -> dict:
    server_cfg = {"name": str(server), "dtype": "bfloat16", "device_map": "auto"}
    if quant:
        server_cfg = {"name": str(server), "dtype": "bfloat16",
                      "quantization": {"bits": 4, "compute_dtype": "bfloat16"}}
    return {
        "name": "gpu-big", "seed": 0, "rounds": 1, "output_dir": str(work / "run"),
        "method": {"name": "fedmkt", "top_k": 16},
        "server": server_cfg,
        "clients": {"num_clients": 2, "models": [{"name": str(client), "dtype": "bfloat16"}]},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "fedmkt", "test_size": 16},
                 "max_private_per_client": 16, "max_public": 16, "max_length": 256},
        "training": {"batch_size": 4, "lr": 3e-5, "precision": "bf16",
                     "gradient_checkpointing": True},
        "runtime": {"device": "cuda"},
        "eval": {"plots": False, "round0": False, "batch_size": 8},
    }


def _free_gpu() -> None:
    """Drop fedkt's model cache and free what it held (a 4-bit model's modules hold
    reference cycles, so collect them first)."""
    import torch

    from fedkt.train.lm import clear_cache

    clear_cache()
    gc.collect()
    torch.cuda.empty_cache()


def _participant(name: str, model_cfg, cfg, steps: int = 4, seq: int = 256) -> None:
    """Peak GPU memory of loading this model and training ``steps`` steps of
    batch_size x seq tokens, and its training tokens/s."""
    import torch

    from fedkt.train.lm import get_lm
    from fedkt.train.optim import make_optimizer, step, trainable

    _free_gpu()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / GIB  # what an earlier model left: should be ~0
    start = time.perf_counter()
    lm = get_lm(model_cfg, cfg.training, 0, "cuda")
    load_s = time.perf_counter() - start
    loaded = torch.cuda.memory_allocated() / GIB - before
    params = trainable(lm.model)
    opt, sched = make_optimizer(params, cfg.training, steps)
    b = cfg.training.batch_size
    ids = torch.randint(3, 1000, (b, seq), device="cuda")
    lm.model.train()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm.model(input_ids=ids, labels=ids).loss
        step(loss, [opt], clip=[params], schedules=[sched], max_grad_norm=1.0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    lm.model.eval()
    warm = times[1:] or times
    tps = b * seq / (sum(warm) / len(warm))
    total = sum(p.numel() for p in lm.model.parameters())
    print(f"  {name:<8} {total / 1e9:5.2f} B params  load {load_s:5.1f} s  weights "
          f"{loaded:6.2f} GiB  peak {torch.cuda.max_memory_allocated() / GIB:6.2f} GiB  "
          f"train {tps:8.0f} tokens/s (batch {b} x {seq}, step {sum(warm) / len(warm):.2f} s)"
          f"{f'; {before:.2f} GiB held before loading' if before > 0.01 else ''}", flush=True)
    del lm, opt


def part_big(work: Path, quant: bool) -> None:
    import torch

    from fedkt.config import parse_config
    from fedkt.runner import run

    label = "big4 (server NF4)" if quant else "big (bf16)"
    print(f"{label}: Llama-2-7B-layout server + 2 x 1.1B-layout clients, FedMKT, local "
          f"runtime, {torch.cuda.get_device_name()}", flush=True)
    start = time.perf_counter()
    server = _save_random(LLAMA2_7B, work / "llama2-7b-layout", 0)
    client = _save_random(LLAMA_1B, work / "llama-1b-layout", 1)
    print(f"  random checkpoints written in {time.perf_counter() - start:.0f} s", flush=True)
    cfg = parse_config(_big_config(work, server, client, quant))
    _participant("server", cfg.server, cfg)
    _participant("client", cfg.clients.model_for(0), cfg)
    _free_gpu()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        run(cfg, quiet=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    server_rows = [r for r in rows if r["participant"] == "server" and r.get("split") == "test"]
    finite = bool(server_rows) and all(math.isfinite(r.get("loss", math.nan)) for r in server_rows)
    print(f"  whole run (1 round, local runtime): wall {wall:.0f} s, peak GPU memory "
          f"{torch.cuda.max_memory_allocated() / GIB:.2f} GiB "
          f"(reserved {torch.cuda.max_memory_reserved() / GIB:.2f} GiB)", flush=True)
    check(finite, f"{label}: the run finished with finite server test loss")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="all", help="tiny, big, big4 (comma-separated) or all")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run it on the GPU machine (docs/records/performance.md)")
        return 2
    parts = ["tiny", "big", "big4"] if args.part == "all" else args.part.split(",")
    work = Path(args.work or tempfile.mkdtemp(prefix="fedkt-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}; work in {work}", flush=True)
    for part in parts:
        start = time.perf_counter()
        if part == "tiny":
            part_tiny(work / "tiny")
        elif part == "big":
            part_big(work / "big", quant=False)
        elif part == "big4":
            import importlib.util

            if importlib.util.find_spec("bitsandbytes") is None:
                print("big4: bitsandbytes is not installed here; skipped", flush=True)
                continue
            part_big(work / "big", quant=True)
        else:
            raise SystemExit(f"--part {part!r}: expected tiny, big or big4")
        print(f"[{part}: {time.perf_counter() - start:.0f} s]", flush=True)
    print("gpu_check: " + ("all checks passed" if not FAILURES else
                           f"{len(FAILURES)} check(s) failed"), flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
