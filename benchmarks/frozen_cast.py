"""Evaluation and choice knowledge with frozen weights cast once, against a cast per forward.

Under bf16 autocast every forward casts each frozen fp32 weight to bf16 afresh. Since
:func:`fedkt.infra.precision.frozen_cast`, an evaluation (:func:`fedkt.train.lm.evaluate_lm`)
and a choice-knowledge pass (:func:`fedkt.alignment.choices.choice_knowledge`) hold one bf16
copy of each frozen linear weight for the whole pass. This script runs both passes both ways,
in turn and in one process, on the server LLM of ``suites/clinc150_fedmkt_transfer`` (its
fold 0, first seed: SmolLM2-135M, LoRA on every linear layer, adapters given nonzero values
as after training), and prints wall and CPU seconds per item of each and whether the two
ways' metrics and posteriors are equal (``FEDKT_FROZEN_CAST=0`` is the per-forward cast).

    python benchmarks/frozen_cast.py [--items 200] [--repeats 2] [--threads 1]

Needs ``fedkt models install smollm2-135m``. bf16 needs AVX512-BF16 or AMX (elsewhere
``precision: auto`` is fp32, and there is nothing to cast).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "fedkt" / "configs" / "suites" / "clinc150_fedmkt_transfer.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from fedkt.alignment.choices import choice_knowledge
    from fedkt.data.splits import run_data
    from fedkt.evidence.suite import load_suite
    from fedkt.infra.precision import FROZEN_CAST_ENV, autocast_dtype, set_threads
    from fedkt.train.lm import evaluate_lm, server_lm

    set_threads(args.threads)
    suite = load_suite(SUITE, ROOT / "runs" / "frozen_cast_bench")
    cfg = suite.runs[("fedmkt", suite.seeds[0])]
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"reuse": False})})
    data = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    test, public = data.test[: args.items], data.public[: args.items]
    lm = server_lm(cfg, data)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=gen)
    lm.model.eval()
    print(f"{cfg.server.name}, precision {cfg.training.precision} "
          f"({autocast_dtype(cfg.training, 'cpu')}), {args.threads} torch thread(s), "
          f"eval.batch_size {cfg.eval.batch_size}, {args.items} test items and "
          f"{args.items} public records, CPU {torch.backends.cpu.get_cpu_capability()}, "
          f"load average before {os.getloadavg()[0]:.2f}")

    passes = {"eval": lambda: evaluate_lm(cfg, lm, test, data=data),
              "knowledge": lambda: choice_knowledge(cfg, lm, public, data=data)}
    ways = {"cast per forward": "0", "cast once": "1"}
    best: dict[tuple[str, str], tuple[float, float]] = {}
    results: dict[tuple[str, str], object] = {}
    for _ in range(args.repeats):  # the ways in turn, so drift on a shared host hits both
        for way, env in ways.items():
            os.environ[FROZEN_CAST_ENV] = env
            for name, run in passes.items():
                wall, cpu = time.perf_counter(), time.process_time()
                results[(name, way)] = run()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                old = best.get((name, way))
                best[(name, way)] = (wall, cpu) if old is None or cpu < old[1] else old
    print("\n| pass | way | wall s/item | CPU s/item | CPU vs per forward | equal |")
    print("|---|---|---:|---:|---:|---|")
    for name in passes:
        base_cpu = best[(name, "cast per forward")][1]
        for way in ways:
            wall, cpu = best[(name, way)]
            a, b = results[(name, "cast per forward")], results[(name, way)]
            same = (a == b) if isinstance(a, dict) else bool(torch.equal(a, b))
            print(f"| {name} | {way} | {wall / args.items:.4f} | {cpu / args.items:.4f} | "
                  f"{base_cpu / cpu:.2f}x | {'yes' if same else 'NO'} |")
    print(f"\nbest of {args.repeats} per cell (least CPU); load average after "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
