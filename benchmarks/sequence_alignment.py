"""Benchmark: sequence alignment of a public set (FedMKT Appendix B).

Aligns N samples of up to L tokens (default 1,000 x 512) between two real tokenizers
and prints fedkt's time (tokenization and alignment separately), the time of the
plain-Python token-level DP (:func:`reference_dp_alignment`) measured on a few samples
and *extrapolated* to N, the ratio, how often both link a target token to the same
source token, and the cost of a cached re-run.

    python benchmarks/sequence_alignment.py [--samples 1000] [--length 512] [--dp-samples 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from fedkt.alignment import (
    align_corpus,
    align_sequences,
    clear_alignment_cache,
    normalize_vocab,
    reference_dp_alignment,
)


def load(name: str):
    from fedkt.config import ModelConfig
    from fedkt.models.causal_lm import load_tokenizer

    return load_tokenizer(ModelConfig(name=name))


def make_texts(n: int, chars: int, seed: int) -> list[str]:
    """Windows of the vendored corpus (English, tweets, dialogues), ~``chars`` long each."""
    from fedkt.models.tokenizers import corpus_texts

    big = "\n".join(corpus_texts())
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(big) - chars, size=n)
    return [big[s:s + chars] for s in starts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default="gpt2-tokenizer")
    parser.add_argument("--tgt", default="llama3-tokenizer")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dp-samples", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proj-samples", type=int, default=200)
    parser.add_argument("--k", type=int, default=128)
    args = parser.parse_args()
    from fedkt.models.install import require_models

    require_models([args.src, args.tgt], "--src/--tgt")
    os.environ.setdefault("FEDKT_CACHE", tempfile.mkdtemp(prefix="fedkt-bench-"))
    print(f"cpu cores visible: {os.cpu_count()}; load average: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (shared machines read slow)")
    src_tok, tgt_tok = load(args.src), load(args.tgt)
    texts = make_texts(args.samples, chars=args.length * 6, seed=args.seed)

    t0 = time.perf_counter()
    kw = {"add_special_tokens": True, "truncation": True, "max_length": args.length}
    src_ids = src_tok(texts, **kw)["input_ids"]
    tgt_ids = tgt_tok(texts, **kw)["input_ids"]
    t_tok = time.perf_counter() - t0
    n_src = sum(map(len, src_ids))
    n_tgt = sum(map(len, tgt_ids))

    align_sequences(src_ids[0], tgt_ids[0], src_tok, tgt_tok)  # per-vocabulary tables
    t0 = time.perf_counter()
    aligns = [align_sequences(s, t, src_tok, tgt_tok) for s, t in zip(src_ids, tgt_ids,
                                                                      strict=True)]
    t_align = time.perf_counter() - t0
    coverage = float(np.mean([a.coverage() for a in aligns]))

    clear_alignment_cache()
    t0 = time.perf_counter()
    align_corpus(texts, src_tok, tgt_tok, max_length=args.length)
    t_corpus = time.perf_counter() - t0
    t0 = time.perf_counter()
    align_corpus(texts, src_tok, tgt_tok, max_length=args.length)
    t_mem = time.perf_counter() - t0
    clear_alignment_cache()
    t0 = time.perf_counter()
    align_corpus(texts, src_tok, tgt_tok, max_length=args.length)
    t_disk = time.perf_counter() - t0

    ns, nt = normalize_vocab(src_tok), normalize_vocab(tgt_tok)
    t0 = time.perf_counter()
    agree, total = 0, 0
    for i in range(args.dp_samples):
        ref = reference_dp_alignment([ns[x] for x in src_ids[i]], [nt[x] for x in tgt_ids[i]])
        agree += int((ref == aligns[i].tgt_to_src).sum())
        total += len(ref)
    t_dp = time.perf_counter() - t0
    t_dp_full = t_dp / max(args.dp_samples, 1) * args.samples

    print(f"{args.samples} samples, {n_src:,} {args.src} tokens vs {n_tgt:,} {args.tgt} tokens "
          f"(<= {args.length} each)")
    print(f"tokenization (both tokenizers, batched):     {t_tok:.2f}s")
    print(f"alignment (align_sequences over all samples): {t_align:.2f}s "
          f"({t_align / args.samples * 1e3:.2f} ms/sample); mean logit coverage {coverage:.1%}")
    print(f"align_corpus cold (tokenize + align + save):  {t_corpus:.2f}s")
    print(f"align_corpus again: memory {t_mem * 1e3:.1f} ms, from disk {t_disk:.2f}s")
    print(f"pure-Python token DP: {t_dp:.2f}s on {args.dp_samples} samples -> "
          f"{t_dp_full:,.0f}s extrapolated to {args.samples}; ratio {t_dp_full / t_align:,.0f}x "
          f"(alignment only); DP links the same source token for {agree / max(total, 1):.1%} "
          "of target tokens")
    projection_memory(src_tok, tgt_tok, src_ids, aligns, args)


def projection_memory(src_tok, tgt_tok, src_ids, aligns, args) -> None:
    """Peak working memory of project_topk, at once vs per batch, for N/2 and N samples."""
    import tracemalloc

    import torch

    from fedkt.alignment import TopKLogits, project_topk, vocab_mapping

    vocab_map = vocab_mapping(src_tok, tgt_tok)
    n = min(args.proj_samples, len(aligns))
    width = max(len(s) for s in src_ids[:n])
    g = torch.Generator().manual_seed(args.seed)
    values = torch.sort(torch.randn(n, width, args.k, generator=g), -1, descending=True)[0]
    topk = TopKLogits(sample_ids=torch.arange(n), values=values.to(torch.float16),
                      indices=torch.randint(0, len(vocab_map), (n, width, args.k), generator=g,
                                            dtype=torch.int32),
                      lengths=torch.tensor([len(s) for s in src_ids[:n]], dtype=torch.int32),
                      vocab_size=len(vocab_map), losses=torch.zeros(n))
    del values

    def peak(m: int, batch: int | None) -> tuple[float, float]:
        sub = TopKLogits(topk.sample_ids[:m], topk.values[:m], topk.indices[:m],
                         topk.lengths[:m], topk.vocab_size, topk.losses[:m])
        tracemalloc.start()
        t0 = time.perf_counter()
        out, _ = project_topk(sub, vocab_map, aligns[:m], batch_size=batch)
        dt = time.perf_counter() - t0
        top = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return top / 2**20, dt

    out_mb = n * max(a.n_tgt for a in aligns[:n]) * args.k * 7 / 2**20  # fp16 + int32 + mask
    print(f"projection of top-{args.k} logits ({args.src} -> {args.tgt}), peak working memory "
          f"(tracemalloc; the projected output, ~{out_mb:,.0f} MB for {n} samples, comes on top):")
    for m in (n // 2, n):
        (p_once, t_once), (p_batch, t_batch) = peak(m, None), peak(m, 32)
        print(f"  {m:5d} samples: all at once {p_once:8,.0f} MB ({t_once:.1f}s); "
              f"per batch of 32 {p_batch:6,.0f} MB ({t_batch:.1f}s)")


if __name__ == "__main__":
    from fedkt.models.install import run_script

    run_script(main)
