"""Benchmark: how much FedMKT's cross-tokenizer alignment keeps, on real model pairs.

For each (teacher -> student) pair, on real intent-task texts (the public records of the
FedMKT suites, prompt + gold answer, tokenized as FedMKT tokenizes them), through
fedkt's own alignment (:class:`fedkt.alignment.TokenBridge`: the MinED vocabulary
mapping and the position alignment; :func:`fedkt.alignment.project_topk`, the
projection FedMKT trains on), prints

1. **mass**: the teacher's top-K probability mass (under its full softmax) at the student
   positions that get a teacher position, and the share of it that survives the
   projection (ids mapped to no student token are dropped; ids that collide are merged,
   their mass kept); "overall" also counts the student positions without a teacher
   position as losing all of it; "same string": the share that lands on a student token
   spelling exactly the teacher token (MinED distance 0);
2. **tokens**: the share of student tokens whose text is one teacher token (1:1), the
   union of several teacher tokens (many-to-1), part of a longer teacher token (1-to-many),
   crossing teacher boundaries (many-to-many), or with no teacher token (none);
3. **top-1**: on the student positions where the teacher is right (its top-1 at the
   aligned position is its own next gold token) and the student is right (likewise), how
   often the projected teacher's top-1 is the student's top-1.

    python benchmarks/alignment_quality.py [--records 48] [--top-k 32]
        [--pairs qwen-smol smol-qwen qwen-gemma gemma-qwen]

Needs the offline checkpoints (fedkt models install qwen2.5-0.5b smollm2-135m
gemma3-270m).  The vocabulary mappings are cached on disk after their first computation
(``benchmarks/vocab_mapping.py`` times them); the time printed per pair is the rest.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch

MODELS = {"qwen": "qwen2.5-0.5b", "smol": "smollm2-135m", "gemma": "gemma3-270m"}
PAIRS = ("qwen-smol", "smol-qwen", "qwen-gemma", "gemma-qwen")


class Side:
    """One model's tokenization of the texts and its top-K log-probabilities."""

    def __init__(self, name: str, cfg: Any, records: list[dict], k: int, data: Any) -> None:
        from fedkt.alignment.knowledge import PublicSet, vocab_size
        from fedkt.config import ModelConfig
        from fedkt.models import load_causal_lm

        model, self.tok = load_causal_lm(ModelConfig(name=name))
        self.public = PublicSet.build(cfg, self.tok, records, data=data)
        vocab = vocab_size(self.tok)
        self.vocab = vocab
        self.ids, self.top_v, self.top_i = [], [], []
        with torch.no_grad():
            for seq in self.public.seqs:
                ids = torch.tensor(seq["input_ids"])[None]
                logp = model(input_ids=ids).logits[0].float().log_softmax(-1)  # full softmax
                v, i = torch.topk(logp[:, :vocab], k, dim=-1)
                self.ids.append(ids[0].numpy())
                self.top_v.append(v)
                self.top_i.append(i)
        del model

    def topk(self) -> Any:
        """The texts' top-K log-probabilities as a :class:`fedkt.alignment.TopKLogits`."""
        from fedkt.alignment import TopKLogits

        n, width, k = len(self.ids), max(len(x) for x in self.ids), self.top_v[0].shape[-1]
        values = torch.zeros(n, width, k, dtype=torch.float16)
        indices = torch.zeros(n, width, k, dtype=torch.int32)
        for s, (v, i) in enumerate(zip(self.top_v, self.top_i, strict=True)):
            values[s, : len(v)] = v.to(torch.float16)
            indices[s, : len(i)] = i.to(torch.int32)
        return TopKLogits(sample_ids=torch.arange(n), values=values, indices=indices,
                          lengths=torch.tensor([len(x) for x in self.ids], dtype=torch.int32),
                          vocab_size=self.vocab, losses=torch.zeros(n))


def token_kinds(a: Any) -> np.ndarray:
    """Per student (target) token: 0 1:1, 1 many-to-1, 2 1-to-many, 3 many-to-many, 4 none."""
    s2t, t2s = a.src_to_tgt, a.tgt_to_src
    into = np.bincount(s2t[s2t >= 0], minlength=a.n_tgt)  # teacher tokens starting in j
    spread = np.bincount(t2s[t2s >= 0], minlength=a.n_src)  # student tokens starting in i
    out = np.full(a.n_tgt, 4, dtype=np.int64)
    has = t2s >= 0
    many_in = into > 1
    many_out = np.zeros(a.n_tgt, dtype=bool)
    many_out[has] = spread[t2s[has]] > 1
    out[has & ~many_in & ~many_out] = 0
    out[has & many_in & ~many_out] = 1
    out[has & ~many_in & many_out] = 2
    out[has & many_in & many_out] = 3
    return out


def measure(teacher: Side, student: Side) -> dict[str, float]:
    """The three measurements of the module docstring for one direction."""
    from fedkt.alignment import TokenBridge, normalize_vocab, project_topk

    bridge = TokenBridge(teacher.tok, student.tok)
    vmap = bridge.vocab_map
    aligns = bridge.align_corpus(teacher.public, student.public)
    proj, mask = project_topk(teacher.topk(), vmap, aligns, tgt_vocab_size=student.vocab)
    t_norm, s_norm = normalize_vocab(teacher.tok), normalize_vocab(student.tok)
    same = np.array([vmap[i] >= 0 and t_norm[i] == s_norm[vmap[i]] for i in range(len(vmap))])
    mass = kept = exact = 0.0
    positions = aligned = 0
    kinds = np.zeros(5)
    both = agree = 0
    for n, a in enumerate(aligns):
        kinds += np.bincount(token_kinds(a), minlength=5)
        ls = len(student.ids[n])
        s_gold, t_gold = student.ids[n], teacher.ids[n]
        for j in range(ls - 1):  # student logit positions that predict a next token
            positions += 1
            i = int(a.logit_map[j])
            if i < 0 or not bool(mask[n, j]):
                continue
            aligned += 1
            p = teacher.top_v[n][i].double().exp()
            mass += float(p.sum())
            kept += float(proj.values[n, j].double().exp().sum())
            exact += float(p[torch.from_numpy(same[teacher.top_i[n][i].numpy()])].sum())
            t_right = int(teacher.top_i[n][i, 0]) == int(t_gold[i + 1]) if i + 1 < len(t_gold) else False
            s_right = int(student.top_i[n][j, 0]) == int(s_gold[j + 1])
            if t_right and s_right:
                both += 1
                p_top = int(proj.indices[n, j, int(proj.values[n, j].float().argmax())])
                agree += int(p_top == int(student.top_i[n][j, 0]))
    mean_mass = mass / max(aligned, 1)
    return {"positions": positions, "aligned": aligned / max(positions, 1),
            "topk_mass": mean_mass, "kept": kept / max(mass, 1e-12),
            "overall": kept / max(mass, 1e-12) * aligned / max(positions, 1),
            "same_string": exact / max(mass, 1e-12),
            **{k: float(kinds[c] / kinds.sum()) for c, k in enumerate(
                ("one_one", "many_one", "one_many", "many_many", "none"))},
            "both_right": both, "top1_agree": agree / max(both, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--records", type=int, default=48, help="public records (texts)")
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from fedkt.config import parse_config
    from fedkt.data.splits import run_data
    from fedkt.models.install import require_models

    torch.set_num_threads(int(os.environ.get("FEDKT_THREADS", "1")))
    names = sorted({MODELS[p] for pair in args.pairs for p in pair.split("-")})
    require_models(names, f"--pairs {' '.join(args.pairs)}")
    cfg = parse_config({
        "seed": args.seed, "method": {"name": "fedmkt"},
        "server": {"name": "qwen2.5-0.5b"}, "clients": {"num_clients": 2, "models": [
            {"name": "smollm2-135m"}]},
        "data": {"dataset": {"name": "intent_recognition"}, "max_length": 64,
                 "split": {"scheme": "fedmkt", "test_size": 70}}})
    fd = run_data(cfg.data, 2, args.seed)
    records = fd.public[: args.records]
    print(f"cpu: {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores visible, "
          f"{torch.get_num_threads()} torch thread(s); load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; {len(records)} intent texts "
          f"(public records, prompt + answer), top-K {args.top_k}")
    sides: dict[str, Side] = {}
    for key in sorted({p for pair in args.pairs for p in pair.split("-")}):
        t0 = time.perf_counter()
        sides[key] = Side(MODELS[key], cfg, records, args.top_k, fd)
        print(f"{MODELS[key]}: loaded and ran in {time.perf_counter() - t0:.1f}s")
    rows = []
    for pair in args.pairs:
        t, s = pair.split("-")
        t0 = time.perf_counter()
        r = measure(sides[t], sides[s])
        rows.append((f"{MODELS[t]} -> {MODELS[s]}", r, time.perf_counter() - t0))
    print()
    print("| teacher -> student | student positions with a teacher position | teacher top-K "
          "mass there | share of it kept | kept, all positions | same string | tokens 1:1 / "
          "many-to-1 / 1-to-many / many-to-many / none | both right | projected top-1 = "
          "student's | s |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for name, r, sec in rows:
        print(f"| {name} | {r['aligned']:.3f} | {r['topk_mass']:.3f} | {r['kept']:.3f} | "
              f"{r['overall']:.3f} | {r['same_string']:.3f} | {r['one_one']:.3f} / "
              f"{r['many_one']:.3f} / {r['one_many']:.3f} / {r['many_many']:.3f} / "
              f"{r['none']:.3f} | {r['both_right']} | {r['top1_agree']:.3f} | {sec:.1f} |")


if __name__ == "__main__":
    from fedkt.models.install import run_script

    run_script(main)
