"""fedkt's log-likelihood scorer against lm-evaluation-harness's own CLI, side by side.

The same float weights (SmolLM2-135M, the offline alias ``smollm2-135m``: the folder
fedkt dequantises its GGUF checkpoint to, which both sides load), the same items, fp32,
batch 32, one torch thread each, on two multiple-choice tasks:

* ``piqa``: PIQA-style items, a short question and two answers a sentence long.  No PIQA
  data is vendored, so they are built from fedkt's vendored DialogSum (MIT,
  ``fedkt/data/vendored/dialogsum``): train dialogue k gives the context
  ``"Question: Summarise a conversation about {topic}.\\nAnswer:"`` and the choices
  its own summary and the summary of another dialogue with a different topic (drawn
  with seed 0), the gold one at a random position (seed 0);
* ``intents``: the shipped ``intent_recognition`` dataset's test items (holdout split,
  seed 0), 7 intents, with the context and choices ``evaluate_causal_lm`` scores.

Each side runs as a whole command in its own process, interleaved (fedkt, lm-eval,
fedkt, lm-eval, ... for ``--reps``): fedkt through ``python benchmarks/scorer_vs_lm_eval.py
--worker`` (load the model with fedkt's loader, score with ``score_choices``' scorer),
lm-eval through ``lm_eval --model hf ...`` on a task YAML and JSONL written to a temp
folder.  Printed per task: items, whole-command seconds (wall, and CPU seconds of the
process and its children: steadier on a shared machine) and items/s of each side (median
and range over the reps), their ratios, the scoring time alone (fedkt: measured around
the scorer; lm-eval: the elapsed time its progress bar prints, 1 s resolution), both
accuracies and the per-item agreement of the predicted answers.  The fedkt worker also
scores the items with the layouts forced (``shared``, ``pairs``) after its timed run, and
breaks its scoring time down: tokenisation, the model's forward passes, the rest
(padding, the cache copy, log-softmax, Python), the padded share of the token slots.

    python benchmarks/scorer_vs_lm_eval.py                      # 100 + 100 items, 2 reps
    python benchmarks/scorer_vs_lm_eval.py --piqa 400 --intents 400 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
MAX_LENGTH = 1024


# --------------------------------------------------------------------------- items


def piqa_items(n: int) -> list[dict[str, Any]]:
    """PIQA-style 2-choice items from vendored DialogSum (see the module docstring)."""
    path = ROOT / "fedkt" / "data" / "vendored" / "dialogsum" / "train.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if n > len(records):
        raise SystemExit(f"--piqa {n}: DialogSum's vendored train split has {len(records)}")
    rng = random.Random(0)
    items = []
    for k, rec in enumerate(records[:n]):
        other = rng.choice([r for r in records if r["topic"] != rec["topic"]])
        choices = [rec["summary"].strip(), other["summary"].strip()]
        label = rng.randrange(2)
        if label:
            choices.reverse()
        items.append({"id": f"dialogsum-{k}", "label": label, "choices": choices,
                      "context": f"Question: Summarise a conversation about "
                                 f"{rec['topic'].strip()}.\nAnswer:"})
    return items


def intent_items(n: int) -> list[dict[str, Any]]:
    """The shipped intent_recognition's test items, as ``evaluate_causal_lm`` poses them."""
    from fedkt.config import parse_config
    from fedkt.data.formatting import mc_view
    from fedkt.data.splits import run_data

    cfg = parse_config({
        "name": "scorer-bench", "seed": 0, "method": "zero_shot",
        "clients": {"num_clients": 1, "models": [{"name": MODEL}]},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "holdout", "test_size": n}},
    }, "benchmarks/scorer_vs_lm_eval.py")
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    items = []
    for k, rec in enumerate(fd.test[:n]):
        context, choices, gold = mc_view(rec, fd.task, fd.label_names, fd.template)
        if not all(c.startswith(" ") for c in choices):
            raise SystemExit("intent choices should follow the context after one space")
        items.append({"id": str(rec.get("id", k)), "label": gold, "context": context,
                      "choices": [c[1:] for c in choices]})
    return items


# --------------------------------------------------------------------------- fedkt side


def worker(items_path: str, out_path: str, batch_size: int, layouts: list[str]) -> None:
    """Load the model with fedkt's loader and score the items (first layout timed as the
    whole command's work; the others after it, timed on their own)."""
    started = time.perf_counter()
    import torch

    from fedkt.config import ModelConfig
    from fedkt.eval import inputs, scorer
    from fedkt.eval.layout import model_plan
    from fedkt.models.causal_lm import load_causal_lm

    torch.set_num_threads(1)
    items = [json.loads(line) for line in Path(items_path).read_text().splitlines()]
    model, tokenizer = load_causal_lm(ModelConfig(name=MODEL, dtype="float32"))
    model.eval()
    contexts = [it["context"] for it in items]
    conts = [[" " + c for c in it["choices"]] for it in items]

    timing = {"encode": 0.0, "forward": 0.0, "calls": 0, "slots": 0, "real": 0}
    encode = inputs._encode_example

    def timed_encode(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return encode(*a, **k)
        finally:
            timing["encode"] += time.perf_counter() - t

    def before(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        timing["calls"] += 1
        timing["slots"] += ids.numel()
        timing["real"] += int(mask[:, -ids.shape[1]:].sum())
        timing["t0"] = time.perf_counter()

    def after(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        timing["forward"] += time.perf_counter() - timing["t0"]

    scorer._encode_example = timed_encode  # the name the scorer calls
    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    out: dict[str, Any] = {"ready": time.perf_counter() - started, "layouts": {}}
    for layout in layouts:
        for key in ("encode", "forward", "calls", "slots", "real"):
            timing[key] = 0 if key in ("calls", "slots", "real") else 0.0
        t, c = time.perf_counter(), time.process_time()
        scored = scorer._score_grouped(model, tokenizer, contexts, conts,
                                       batch_size=batch_size, max_length=MAX_LENGTH,
                                       layout=layout)
        seconds, cpu = time.perf_counter() - t, time.process_time() - c
        prefix = inputs._special_prefix(tokenizer)
        encoded = [encode(tokenizer, c, cs, prefix) for c, cs in zip(contexts, conts,
                                                                     strict=True)]
        plan = model_plan(model, encoded, batch_size=batch_size, max_length=MAX_LENGTH,
                          layout=layout)
        out["layouts"][layout] = {
            "seconds": seconds, "cpu": cpu, "scores": [[s for s, _ in row] for row in scored],
            "shared_items": sum(len(c) for c in plan.shared),
            "cost": plan.cost, **{k: timing[k] for k in ("encode", "forward", "calls",
                                                         "slots", "real")}}
    out["first_done"] = out["ready"] + out["layouts"][layouts[0]]["seconds"]
    Path(out_path).write_text(json.dumps(out))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_fedkt(items_path: Path, out_path: Path, batch_size: int, layouts: list[str]
              ) -> tuple[float, float, dict[str, Any]]:
    """(whole-command wall and CPU seconds up to the end of the first layout's scoring,
    worker output)."""
    t, c = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, __file__, "--worker", str(items_path), str(out_path),
                    "--batch-size", str(batch_size), "--layouts", ",".join(layouts)],
                   check=True, env=_env(), cwd=ROOT)
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    out = json.loads(out_path.read_text())
    extra = [v for k, v in out["layouts"].items() if k != layouts[0]]
    return (wall - sum(v["seconds"] for v in extra), cpu - sum(v["cpu"] for v in extra), out)


# --------------------------------------------------------------------------- lm-eval side


TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

BAR = re.compile(r"Running loglikelihood requests: 100%\|[^|]*\| (\d+)/\d+ "
                 r"\[(?:(\d+):)?(\d+):(\d+)<")


def run_lm_eval(task: str, folder: Path, model_dir: Path, batch_size: int, rep: int
                ) -> tuple[float, float, float | None, list[list[float]]]:
    """(whole-command wall and CPU seconds, scoring seconds from its progress bar,
    log-likelihoods)."""
    out_dir = folder / f"lm_eval_{rep}"
    cmd = ["lm_eval", "--model", "hf", "--model_args",
           f"pretrained={model_dir},dtype=float32,max_length={MAX_LENGTH}",
           "--tasks", task, "--include_path", str(folder), "--batch_size", str(batch_size),
           "--device", "cpu", "--output_path", str(out_dir), "--log_samples"]
    t, c = time.perf_counter(), _children_cpu()
    done = subprocess.run(cmd, env=_env(), cwd=folder, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    if done.returncode:
        raise SystemExit(f"lm_eval failed ({done.returncode}):\n{done.stderr[-3000:]}")
    bars = BAR.findall(done.stderr.replace("\r", "\n"))
    scoring = None
    if bars:
        _, h, m, s = bars[-1]
        scoring = 3600 * int(h or 0) + 60 * int(m) + int(s)
    samples = sorted(out_dir.rglob(f"samples_{task}_*.jsonl"))
    if not samples:
        raise SystemExit(f"lm_eval wrote no samples under {out_dir}")
    rows = [json.loads(line) for line in samples[-1].read_text().splitlines()]
    rows.sort(key=lambda r: r["doc_id"])
    scores = [[float(resp[0]) for resp in r["filtered_resps"]] for r in rows]
    return wall, cpu, scoring, scores


# --------------------------------------------------------------------------- report


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _argmax(row: list[float]) -> int:
    return max(range(len(row)), key=lambda i: (row[i], -i))


def _norm_argmax(row: list[float], choices: list[str]) -> int:
    return _argmax([s / max(1, len(c)) for s, c in zip(row, choices, strict=True)])


def _spread(values: list[float]) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.1f}"
    return f"{med:.1f} [{min(values):.1f}-{max(values):.1f}]"


def bench_task(name: str, items: list[dict[str, Any]], folder: Path, model_dir: Path,
               args: argparse.Namespace) -> dict[str, Any]:
    task = f"fedkt_bench_{name}"
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in items))
    (folder / f"{task}.yaml").write_text(TASK_YAML.format(task=task, data=data))
    layouts = ["auto", *(["shared", "pairs"] if args.compare_layouts else [])]
    f_wall, l_wall, f_cpu, l_cpu, l_score, f_out, l_scores = [], [], [], [], [], None, None
    for rep in range(args.reps):
        sides = ["fedkt", "lm_eval"] if rep % 2 == 0 else ["lm_eval", "fedkt"]
        for side in sides:
            if side == "fedkt":
                wall, cpu, f_out = run_fedkt(data, folder / f"{name}_fedkt_{rep}.json",
                                             args.batch_size,
                                             layouts if rep == 0 else ["auto"])
                f_wall.append(wall)
                f_cpu.append(cpu)
                print(f"  {name} rep {rep + 1}: fedkt {wall:.1f} s ({cpu:.1f} CPU s)",
                      flush=True)
            else:
                wall, cpu, scoring, l_scores = run_lm_eval(task, folder, model_dir,
                                                           args.batch_size, rep)
                l_wall.append(wall)
                l_cpu.append(cpu)
                if scoring is not None:
                    l_score.append(scoring)
                print(f"  {name} rep {rep + 1}: lm-eval {wall:.1f} s ({cpu:.1f} CPU s)",
                      flush=True)
        if rep == 0:
            first = f_out
    assert f_out is not None and l_scores is not None
    golds = [it["label"] for it in items]
    choices = [it["choices"] for it in items]
    f_scores = first["layouts"]["auto"]["scores"]
    f_pred = [_argmax(r) for r in f_scores]
    l_pred = [_argmax(r) for r in l_scores]
    f_norm = [_norm_argmax(r, c) for r, c in zip(f_scores, choices, strict=True)]
    l_norm = [_norm_argmax(r, c) for r, c in zip(l_scores, choices, strict=True)]
    n = len(items)
    diff = max(abs(a - b) for fr, lr in zip(f_scores, l_scores, strict=True)
               for a, b in zip(fr, lr, strict=True))
    autos = [json.loads((folder / f"{name}_fedkt_{r}.json").read_text())["layouts"]["auto"]
             for r in range(args.reps)]
    return {
        "name": name, "items": n, "choices": len(choices[0]),
        "f_wall": f_wall, "l_wall": l_wall, "f_cpu": f_cpu, "l_cpu": l_cpu,
        "f_score": [a["seconds"] for a in autos], "f_score_cpu": [a["cpu"] for a in autos],
        "l_score": l_score,
        "f_acc": sum(p == g for p, g in zip(f_pred, golds, strict=True)) / n,
        "l_acc": sum(p == g for p, g in zip(l_pred, golds, strict=True)) / n,
        "f_acc_norm": sum(p == g for p, g in zip(f_norm, golds, strict=True)) / n,
        "l_acc_norm": sum(p == g for p, g in zip(l_norm, golds, strict=True)) / n,
        "agree": sum(a == b for a, b in zip(f_pred, l_pred, strict=True)) / n,
        "agree_norm": sum(a == b for a, b in zip(f_norm, l_norm, strict=True)) / n,
        "max_diff": diff, "layouts": first["layouts"], "ready": first["ready"],
        "tokens": _token_stats(first["layouts"]["auto"]),
    }


def _token_stats(layout: dict[str, Any]) -> str:
    return f"{layout['real']} real tokens in {layout['slots']} slots"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--piqa", type=int, default=100, help="PIQA-style items (0: skip)")
    ap.add_argument("--intents", type=int, default=100, help="intent items (0: skip)")
    ap.add_argument("--reps", type=int, default=2, help="interleaved runs of each side")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--no-compare-layouts", dest="compare_layouts", action="store_false",
                    help="skip scoring with the layouts forced (shared, pairs)")
    ap.add_argument("--json", help="also write the measurements to this file")
    ap.add_argument("--from-json", help="print the tables of a --json file, measure nothing")
    ap.add_argument("--worker", nargs=2, metavar=("ITEMS", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--layouts", default="auto", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker, args.batch_size, args.layouts.split(","))
        return

    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        report(saved["results"], saved["load"], saved["reps"], saved["compare_layouts"])
        return

    import torch

    from fedkt.models.causal_lm import gguf_float_dir
    from fedkt.models.offline import resolve_offline

    resolved = resolve_offline(MODEL)
    model_dir = (gguf_float_dir(resolved.path, resolved.gguf_file) if resolved.gguf_file
                 else resolved.path)
    load0 = os.getloadavg()
    print(f"{MODEL} ({model_dir}), fp32, batch {args.batch_size}, 1 torch thread per side; "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores;"
          f" load average {' '.join(f'{x:.2f}' for x in load0)}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="fedkt-scorer-bench-") as tmp:
        folder = Path(tmp)
        if args.piqa:
            results.append(bench_task("piqa", piqa_items(args.piqa), folder, model_dir, args))
        if args.intents:
            results.append(bench_task("intents", intent_items(args.intents), folder,
                                      model_dir, args))
    load = [list(load0), list(os.getloadavg())]
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "load": load,
                                               "reps": args.reps,
                                               "compare_layouts": args.compare_layouts}))
    report(results, load, args.reps, args.compare_layouts)


def report(results: list[dict[str, Any]], load: list[list[float]], reps: int,
           compare_layouts: bool) -> None:
    """Print the two tables."""
    load0, load1 = load
    print(f"\nload average before {' '.join(f'{x:.2f}' for x in load0)}, after "
          f"{' '.join(f'{x:.2f}' for x in load1)}; median [min-max] over {reps} "
          "interleaved runs\n")
    print("| task | items | fedkt wall s | lm-eval wall s | items/s fedkt / lm-eval | wall "
          "ratio | fedkt CPU s | lm-eval CPU s | CPU ratio | scoring only: fedkt wall s (CPU "
          "s) | lm-eval wall s | ratio | agreement (acc, acc_norm) | accuracy fedkt / "
          "lm-eval | max abs Δ log-lik |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        fw, lw = statistics.median(r["f_wall"]), statistics.median(r["l_wall"])
        fc, lc = statistics.median(r["f_cpu"]), statistics.median(r["l_cpu"])
        fs = statistics.median(r["f_score"])
        ls = statistics.median(r["l_score"]) if r["l_score"] else float("nan")
        print(f"| {r['name']} ({r['choices']}-way) | {r['items']} | {_spread(r['f_wall'])} | "
              f"{_spread(r['l_wall'])} | {r['items'] / fw:.2f} / {r['items'] / lw:.2f} | "
              f"{lw / fw:.2f}x | {_spread(r['f_cpu'])} | {_spread(r['l_cpu'])} | "
              f"{lc / fc:.2f}x | {_spread(r['f_score'])} ({_spread(r['f_score_cpu'])}) | "
              f"{_spread(r['l_score']) if r['l_score'] else 'n/a'} | {ls / fs:.2f}x | "
              f"{r['agree']:.3f}, {r['agree_norm']:.3f} | {r['f_acc']:.3f} / {r['l_acc']:.3f}"
              f" (norm {r['f_acc_norm']:.3f} / {r['l_acc_norm']:.3f}) | {r['max_diff']:.1e} |")
    if not compare_layouts:
        return
    print("\nfedkt's scorer per layout (first run; 'auto' is the one timed above): scoring "
          "seconds and where they go\n")
    print("| task | layout | items shared | est. cost | s | CPU s | tokenisation | forward | "
          "rest | forwards | rest per forward | padded slots | forward share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for layout, v in r["layouts"].items():
            rest = v["seconds"] - v["encode"] - v["forward"]
            cost = v["cost"]["chosen"]
            print(f"| {r['name']} | {layout} | {v['shared_items']}/{r['items']} | "
                  f"{cost:.0f} | {v['seconds']:.1f} | {v['cpu']:.1f} | {v['encode']:.2f} | "
                  f"{v['forward']:.1f} | {rest:.2f} | {v['calls']} | "
                  f"{1000 * rest / max(1, v['calls']):.0f} ms | "
                  f"{1 - v['real'] / max(1, v['slots']):.1%} | "
                  f"{v['forward'] / v['seconds']:.1%} |")
        same = all(_argmax(a) == _argmax(b) for k in r["layouts"] for a, b in
                   zip(r["layouts"][k]["scores"], r["layouts"]["auto"]["scores"],
                       strict=True))
        diff = max(abs(x - y) for k in r["layouts"] for a, b in
                   zip(r["layouts"][k]["scores"], r["layouts"]["auto"]["scores"],
                       strict=True) for x, y in zip(a, b, strict=True))
        print(f"| {r['name']} | layouts agree on every answer: {same}; max abs Δ log-lik "
              f"{diff:.1e}; model loaded {r['ready']:.1f} s after start | | | | | | | | | | | |")


if __name__ == "__main__":
    main()
