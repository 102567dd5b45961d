"""Many-way choice scoring: each (context, label) as a whole row against one shared context.

SmolLM2-135M (offline alias ``smollm2-135m``) scores test utterances against every label
name, posed as ``evaluate_causal_lm`` poses a classification item (``Text: ...\\nLabel:``,
each label after one space), once per layout of :func:`fedkt.eval.scorer.score_choices`
in one process, in turn:

* ``pairs``: every (context, label) as one sequence, batched by length (the rows path);
* ``shared``: each context's forward once, its key/value cache copied to every label, the
  labels' tokens after it;
* ``auto``: per chunk, whichever the scorer's cost model prices lower (the default).

Label sets, from fedkt's vendored datasets: CLINC150's 30 intents of two domains
(``clinc150``, ``classes: "0-29"``: banking and credit cards, items from its test split),
Banking77's 77 intents (``banking77:test``, evenly spread over it) and SNIPS' 7
(``intent_recognition``).  For each it prints wall and
CPU seconds per item, how many items' answers (``acc`` and ``acc_norm`` argmax) differ
from the ``pairs`` layout's, and the largest absolute difference of a log-likelihood.

    python benchmarks/many_way_scoring.py [--items 40] [--batch-size 8]
        [--precision fp32|bf16] [--threads 1] [--sets banking77,snips] [--json out.json]
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
LAYOUTS = ("pairs", "shared", "auto")


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


def run_set(model: Any, tokenizer: Any, records: list[dict[str, Any]], names: list[str],
            *, batch_size: int, max_length: int, precision: str) -> dict[str, Any]:
    """Score ``records`` in every layout; per layout: seconds per item, answers, scores."""
    import torch

    from fedkt.data.formatting import mc_view
    from fedkt.eval.scorer import _score_grouped, mc_predictions

    views = [mc_view(r, "classification", names) for r in records]
    contexts = [v[0] for v in views]
    choices = [list(v[1]) for v in views]
    golds = [v[2] for v in views]
    out: dict[str, Any] = {"items": len(records), "labels": len(names)}
    for layout in LAYOUTS:
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
               else torch.autocast("cpu", enabled=False))
        wall, cpu = time.perf_counter(), time.process_time()
        with ctx:
            scored = _score_grouped(model, tokenizer, contexts, choices,
                                    batch_size=batch_size, max_length=max_length,
                                    layout=layout)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        scores = [[s for s, _ in row] for row in scored]
        preds, norm = mc_predictions(scores, choices)
        out[layout] = {"wall_s": wall / len(records), "cpu_s": cpu / len(records),
                       "scores": scores, "preds": preds, "preds_norm": norm,
                       "acc": sum(p == g for p, g in zip(preds, golds, strict=True)) / len(golds),
                       "acc_norm": sum(p == g for p, g in zip(norm, golds, strict=True))
                       / len(golds)}
    base = out["pairs"]
    for layout in LAYOUTS[1:]:
        row = out[layout]
        row["differ"] = sum(a != b or c != d for a, b, c, d in zip(
            row["preds"], base["preds"], row["preds_norm"], base["preds_norm"], strict=True))
        row["max_abs_diff"] = max(abs(x - y) for r, b in zip(row["scores"], base["scores"],
                                                             strict=True)
                                  for x, y in zip(r, b, strict=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sets", default="banking77,snips")
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
    load1 = os.getloadavg()
    print("| labels | items | layout | wall s/item | CPU s/item | CPU vs pairs | acc | acc_norm "
          "| items whose answers differ | max abs diff of log-lik |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for res in results.values():
        base = res["pairs"]["cpu_s"]
        for layout in LAYOUTS:
            row = res[layout]
            diff = "-" if layout == "pairs" else f"{row['differ']}"
            delta = "-" if layout == "pairs" else f"{row['max_abs_diff']:.1e}"
            print(f"| {res['labels']} | {res['items']} | {layout} | {row['wall_s']:.3f} | "
                  f"{row['cpu_s']:.3f} | {base / row['cpu_s']:.2f}x | {row['acc']:.3f} | "
                  f"{row['acc_norm']:.3f} | {diff} | {delta} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load1)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "load": [load0, load1],
                                               "args": vars(args)}))


if __name__ == "__main__":
    main()
