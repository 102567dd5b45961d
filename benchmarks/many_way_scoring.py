"""Many-way choice scoring: each (context, label) as a whole row against one shared context.

SmolLM2-135M (offline alias ``smollm2-135m``) scores test utterances against every label
name, posed as ``evaluate_causal_lm`` poses a classification item (``Text: ...\\nLabel:``,
each label after one space), once per layout of :func:`fedkt.eval.scorer.score_choices`
in one process, in turn:

* ``pairs``: every (context, label) as one sequence, batched by length (the rows path);
* ``shared_rows``: each context's forward once, its key/value cache copied to every label,
  then one row per label of its tokens after the first (the label trie off);
* ``shared``: the same with the label trie: labels whose tokens but the last begin another
  label's are scored from that label's row, so each distinct run of tokens runs once
  (:func:`fedkt.eval.layout.carriers`);
* ``auto``: per chunk, whichever the scorer's cost model prices lower (the default, with
  the trie).

With ``--distill N`` it also times the trained path (:func:`fedkt.alignment.choices.
choice_logprobs`, forward and backward of a KL to a fixed target through a LoRA adapter,
batches of 8 items) on the first N items, with the label trie off and on, and prints the
largest differences of the log-posteriors and of the adapter's gradients.

Label sets, from fedkt's vendored datasets: CLINC150's 30 intents of two domains
(``clinc150``, ``classes: "0-29"``: banking and credit cards, items from its test split),
Banking77's 77 intents (``banking77:test``, evenly spread over it) and SNIPS' 7
(``intent_recognition``).  For each it prints wall and
CPU seconds per item, how many items' answers (``acc`` and ``acc_norm`` argmax) differ
from the ``pairs`` layout's, and the largest absolute difference of a log-likelihood.

    python benchmarks/many_way_scoring.py [--items 40] [--batch-size 8]
        [--precision fp32|bf16] [--threads 1] [--sets banking77,snips] [--distill 16]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "smollm2-135m"
# (arm, the scorer's layout, label trie)
ARMS = (("pairs", "pairs", True), ("shared_rows", "shared", False), ("shared", "shared", True),
        ("auto", "auto", True))


def _builtin(spec: dict[str, Any], n: int, split: str | None = None
             ) -> tuple[list[dict[str, Any]], list[str]]:
    """``n`` records of a built-in (vendored) dataset, evenly spaced, and its class names;
    ``split``: only the records from that part of the source (``extra.split``)."""
    from fedkt.config.data_schema import DatasetConfig
    from fedkt.data.records import load_dataset_records

    data = load_dataset_records(DatasetConfig(**spec))
    rows = [r for r in data.records
            if split is None or (r.get("extra") or {}).get("split") == split]
    step = max(1, len(rows) // n)
    return ([{"text": r["text"], "label": r["label"]} for r in rows[::step][:n]],
            list(data.label_names or []))


def banking77(n: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``n`` Banking77 test utterances, evenly spaced over the split, and the 77 intents."""
    return _builtin({"name": "banking77:test"}, n)


def snips(n: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``n`` SNIPS utterances (BIG-bench intent_recognition), evenly spaced, and 7 intents."""
    return _builtin({"name": "intent_recognition"}, n)


def clinc150(n: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``n`` CLINC150 test utterances of two of its domains (banking, credit cards: 30
    intents, ``classes: "0-29"`` as the suites take them), evenly spaced, and those 30."""
    return _builtin({"name": "clinc150", "classes": "0-29"}, n, split="test")


SETS = {"banking77": banking77, "snips": snips, "clinc150": clinc150}


def _autocast(precision: str) -> Any:
    """bf16 autocast on the CPU for ``bf16``, none for ``fp32``."""
    import torch

    return (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
            else torch.autocast("cpu", enabled=False))


def run_set(model: Any, tokenizer: Any, records: list[dict[str, Any]], names: list[str],
            *, batch_size: int, max_length: int, precision: str) -> dict[str, Any]:
    """Score ``records`` in every arm (:data:`ARMS`); per arm: seconds per item, answers,
    scores."""
    from fedkt.data.formatting import mc_view
    from fedkt.eval.scorer import _score_grouped, mc_predictions

    views = [mc_view(r, "classification", names) for r in records]
    contexts = [v[0] for v in views]
    choices = [list(v[1]) for v in views]
    golds = [v[2] for v in views]
    out: dict[str, Any] = {"items": len(records), "labels": len(names)}
    for arm, layout, trie in ARMS:
        wall, cpu = time.perf_counter(), time.process_time()
        with _autocast(precision):
            scored = _score_grouped(model, tokenizer, contexts, choices,
                                    batch_size=batch_size, max_length=max_length,
                                    layout=layout, trie=trie)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        scores = [[s for s, _ in row] for row in scored]
        preds, norm = mc_predictions(scores, choices)
        out[arm] = {"wall_s": wall / len(records), "cpu_s": cpu / len(records),
                       "scores": scores, "preds": preds, "preds_norm": norm,
                       "acc": sum(p == g for p, g in zip(preds, golds, strict=True)) / len(golds),
                       "acc_norm": sum(p == g for p, g in zip(norm, golds, strict=True))
                       / len(golds)}
    base = out["pairs"]
    for arm, _, _ in ARMS[1:]:
        row = out[arm]
        row["differ"] = sum(a != b or c != d for a, b, c, d in zip(
            row["preds"], base["preds"], row["preds_norm"], base["preds_norm"], strict=True))
        row["max_abs_diff"] = max(abs(x - y) for r, b in zip(row["scores"], base["scores"],
                                                             strict=True)
                                  for x, y in zip(r, b, strict=True))
    return out


def run_distill(model: Any, tokenizer: Any, records: list[dict[str, Any]], names: list[str],
                *, max_length: int, precision: str) -> dict[str, Any]:
    """The trained path on ``records`` through a fresh LoRA adapter (r 8, all linear layers,
    B drawn non-zero so that its A has gradients), batches of 8, label trie off and on: CPU
    seconds per item of a forward and backward, the log-posteriors and the gradients."""
    import torch
    from peft import LoraConfig, get_peft_model

    from fedkt.alignment.choices import choice_logprobs
    from fedkt.data.formatting import mc_view
    from fedkt.eval.inputs import encode_scored

    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                            lora_dropout=0.0))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in peft.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    encoded = [[encode_scored(tokenizer, ctx, c, max_length) for c in conts]
               for ctx, conts, _ in (mc_view(r, "classification", names) for r in records)]
    target = torch.softmax(torch.randn(len(records), len(names), generator=gen), -1)
    pad = tokenizer.pad_token_id or 0
    out: dict[str, Any] = {"items": len(records), "labels": len(names)}
    for trie in (False, True):
        peft.zero_grad(set_to_none=True)
        logqs = []
        wall, cpu = time.perf_counter(), time.process_time()
        for s in range(0, len(encoded), 8):
            with _autocast(precision):
                logq = choice_logprobs(peft, encoded[s : s + 8], pad, layout="shared",
                                       trie=trie)
            t = target[s : s + 8]
            (t * (t.log() - logq.float())).sum().backward()
            logqs.append(logq.detach().float())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out["trie" if trie else "rows"] = {
            "wall_s": wall / len(records), "cpu_s": cpu / len(records),
            "logq": torch.cat(logqs),
            "grads": {n: p.grad.clone() for n, p in peft.named_parameters() if p.requires_grad}}
    rows, trie_ = out["rows"], out["trie"]
    out["max_abs_diff_logq"] = float((rows["logq"] - trie_["logq"]).abs().max())
    scale = max(float(g.abs().max()) for g in rows["grads"].values())
    out["max_rel_diff_grad"] = max(float((trie_["grads"][n] - g).abs().max())
                                   for n, g in rows["grads"].items()) / scale
    out["answers_differ"] = int((rows["logq"].argmax(-1) != trie_["logq"].argmax(-1)).sum())
    for key in ("rows", "trie"):
        del out[key]["logq"], out[key]["grads"]
    peft.unload()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sets", default="banking77,snips")
    parser.add_argument("--distill", type=int, default=0,
                        help="also time the trained path on this many items per set")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    import torch

    from fedkt.config import ModelConfig
    from fedkt.models.causal_lm import load_causal_lm

    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(ModelConfig(name=MODEL, dtype="float32"))
    model.eval()
    load0 = os.getloadavg()
    print(f"{MODEL}, {args.precision}, {args.threads} torch thread(s), batch_size "
          f"{args.batch_size}, cpu {torch.backends.cpu.get_cpu_capability()}, load average "
          f"{' '.join(f'{x:.2f}' for x in load0)}", flush=True)
    results = {}
    for name in args.sets.split(","):
        records, names = SETS[name](args.items)
        results[name] = run_set(model, tokenizer, records, names, batch_size=args.batch_size,
                                max_length=args.max_length, precision=args.precision)
        if args.distill:
            results[name]["distill"] = run_distill(
                model, tokenizer, records[: args.distill], names, max_length=args.max_length,
                precision=args.precision)
    load1 = os.getloadavg()
    print("| labels | items | layout | wall s/item | CPU s/item | CPU vs pairs | acc | acc_norm "
          "| items whose answers differ | max abs diff of log-lik |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for res in results.values():
        base = res["pairs"]["cpu_s"]
        for arm, _, _ in ARMS:
            row = res[arm]
            diff = "-" if arm == "pairs" else f"{row['differ']}"
            delta = "-" if arm == "pairs" else f"{row['max_abs_diff']:.1e}"
            print(f"| {res['labels']} | {res['items']} | {arm} | {row['wall_s']:.3f} | "
                  f"{row['cpu_s']:.3f} | {base / row['cpu_s']:.2f}x | {row['acc']:.3f} | "
                  f"{row['acc_norm']:.3f} | {diff} | {delta} |")
    distilled = [res for res in results.values() if "distill" in res]
    if distilled:
        print("\nTrained path (forward and backward, layout shared, batches of 8):")
        print("| labels | items | CPU s/item, one row per label | CPU s/item, label trie | "
              "speed-up | answers that differ | max abs diff of log-posterior | "
              "max diff of a gradient (of its largest) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for res in distilled:
            d = res["distill"]
            print(f"| {d['labels']} | {d['items']} | {d['rows']['cpu_s']:.3f} | "
                  f"{d['trie']['cpu_s']:.3f} | {d['rows']['cpu_s'] / d['trie']['cpu_s']:.2f}x | "
                  f"{d['answers_differ']} | {d['max_abs_diff_logq']:.1e} | "
                  f"{d['max_rel_diff_grad']:.1e} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load1)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "load": [load0, load1],
                                               "args": vars(args)}))


if __name__ == "__main__":
    main()
