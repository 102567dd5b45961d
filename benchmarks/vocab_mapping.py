"""Benchmark: MinED vocabulary mapping on real vocabularies (FedMKT Appendix B).

For each pair prints fedkt's cold mapping time (no cache; normalisation included), the
brute-force definition (one Python edit-distance call per pair) timed on a random
sample of source tokens and *extrapolated* to the whole source vocabulary, the ratio,
and the agreement with brute force on the sample.

    python benchmarks/vocab_mapping.py [--sample 100] [--pairs qwen-smol gpt2-llama3 ...]

Needs the offline tokenizer packages (see docs/alignment.md); Qwen2.5 is read from its
GGUF file, which takes ~20 s and is not part of the timings.  The Gemma pairs (262,144
tokens) map Gemma-3 to and from SmolLM2 and Qwen2.5, both directions.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fedkt.alignment import brute_force_mapping, normalize_vocab
from fedkt.alignment.introspect import _MEMO
from fedkt.alignment.mined import mined_mapping

PAIRS = {
    "qwen-smol": ("qwen2.5-0.5b", "smollm2-135m"),
    "gpt2-llama3": ("gpt2-tokenizer", "llama3-tokenizer"),
    "llama3-gpt2": ("llama3-tokenizer", "gpt2-tokenizer"),
    "gemma-smol": ("gemma3-270m", "smollm2-135m"),
    "smol-gemma": ("smollm2-135m", "gemma3-270m"),
    "gemma-qwen": ("gemma3-270m", "qwen2.5-0.5b"),
    "qwen-gemma": ("qwen2.5-0.5b", "gemma3-270m"),
}


def load(name: str):
    from fedkt.config import ModelConfig
    from fedkt.models.causal_lm import load_tokenizer

    return load_tokenizer(ModelConfig(name=name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--sample", type=int, default=100,
                        help="source tokens timed with the brute force")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from fedkt.models.install import require_models

    require_models((n for key in args.pairs for n in PAIRS[key]),
                   f"--pairs {' '.join(args.pairs)} (choose others with --pairs)")
    print(f"cpu cores visible: {os.cpu_count()}; load average: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (shared machines read slow)")
    cache: dict[str, object] = {}
    rows = []
    for key in args.pairs:
        src_name, tgt_name = PAIRS[key]
        for name in (src_name, tgt_name):
            if name not in cache:
                t0 = time.perf_counter()
                cache[name] = load(name)
                print(f"loaded {name} in {time.perf_counter() - t0:.1f}s (not timed below)")
        src_tok, tgt_tok = cache[src_name], cache[tgt_name]
        _MEMO.clear()  # cold: normalisation is part of the timing
        t0, c0 = time.perf_counter(), time.process_time()
        src, tgt = normalize_vocab(src_tok), normalize_vocab(tgt_tok)
        t_norm = time.perf_counter() - t0
        t0 = time.perf_counter()
        mapping = mined_mapping(src, tgt, workers=args.workers)
        t_map = time.perf_counter() - t0
        t_fedkt = t_norm + t_map
        cpu = time.process_time() - c0
        rng = np.random.default_rng(args.seed)
        idx = rng.choice(len(src), size=min(args.sample, len(src)), replace=False)
        t0 = time.perf_counter()
        ref = brute_force_mapping([src[i] for i in idx], tgt)
        t_bf = time.perf_counter() - t0
        t_bf_full = t_bf / len(idx) * len(src)
        agree = float((ref == mapping[idx]).mean())
        tgt_set = set(tgt)
        exact = sum(1 for s in src if s in tgt_set) / len(src)
        rows.append((key, len(src), len(tgt), cpu, t_map, t_fedkt, len(idx), t_bf, t_bf_full,
                     t_bf_full / t_fedkt, agree))
        print(f"{key}: fedkt {t_fedkt:.2f}s wall, {cpu:.2f}s CPU (normalise {t_norm:.2f}s + "
              f"MinED {t_map:.2f}s); "
              f"brute force {t_bf:.2f}s on {len(idx)} tokens -> {t_bf_full:,.0f}s extrapolated; "
              f"ratio {t_bf_full / t_fedkt:,.0f}x; agreement {agree:.1%}; "
              f"exact matches {exact:.1%}")
    print()
    print("| pair | V_src | V_tgt | fedkt cold, wall (s) | fedkt CPU (s) | "
          "brute force, extrapolated (s) | ratio (wall) | agreement on sample |")
    print("|---|---|---|---|---|---|---|---|")
    for key, vs, vt, cpu, _tm, tf, n, _tb, tbf, ratio, agree in rows:
        print(f"| {key} | {vs:,} | {vt:,} | {tf:.2f} | {cpu:.2f} | {tbf:,.0f} (from {n} tokens) "
              f"| {ratio:,.0f}x | {agree:.1%} |")


if __name__ == "__main__":
    from fedkt.models.install import run_script

    run_script(main)
