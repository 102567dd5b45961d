"""What reuse costs and what it spares (fedkt.eval.reuse), side by side in one run.

On a real model (default SmolLM2-135M with the run's LoRA adapter, offline alias
``smollm2-135m``) and ``--items`` test items of SNIPS intents (7 choices each), it times:

* the key's model digest: the first (every frozen base weight hashed), again (the frozen
  weights remembered: only the LoRA weights hashed), and after the adapter changed;
* the tokenizer digest (first, then remembered);
* one evaluation with ``eval.reuse: false`` (the model runs), with reuse on and an empty
  store (the model runs, its result is stored), and with reuse on again (read back).

Wall and CPU seconds of the process are printed: on a machine shared with other work the
CPU seconds are the cost, the wall seconds also the wait for a core.  A fresh temporary
store is used (``$FEDKT_REUSE_CACHE``); nothing in fedkt's cache changes.

    python benchmarks/reuse.py [--model smollm2-135m] [--items 100] [--batch 32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    os.environ["FEDKT_REUSE_CACHE"] = tempfile.mkdtemp(prefix="fedkt-reuse-bench-")

    import torch

    from fedkt.config import parse_config
    from fedkt.data.splits import run_data
    from fedkt.eval import reuse
    from fedkt.train.lm import client_lm, evaluate_lm

    torch.set_num_threads(1)
    cfg = parse_config({
        "name": "reuse-bench", "seed": 0, "rounds": 1, "output_dir": tempfile.mkdtemp(),
        "method": {"name": "fedavg"},
        "clients": {"num_clients": 2, "models": [{"name": args.model}]},
        "data": {"dataset": {"name": "intent_recognition"},
                 "split": {"scheme": "holdout", "test_size": args.items}, "max_length": 128},
        "eval": {"batch_size": args.batch, "plots": False}}, "benchmark")
    off = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"reuse": False})})
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    test = fd.test
    lm = client_lm(cfg, 0)
    params = sum(p.numel() for p in lm.model.parameters())
    trainable = sum(p.numel() for p in lm.model.parameters() if p.requires_grad)

    def timed(fn) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - start, time.process_time() - cpu

    rows = [("model digest, first (all weights hashed)", timed(lambda: reuse.model_digest(
        lm.model)))]
    rows.append(("model digest, again (frozen base remembered)",
                 timed(lambda: reuse.model_digest(lm.model))))
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.requires_grad:
                p.add_(1e-3)
    rows.append(("model digest, after the adapter changed",
                 timed(lambda: reuse.model_digest(lm.model))))
    lm.reset()
    rows.append(("tokenizer digest, first", timed(lambda: reuse.tokenizer_digest(lm.tokenizer))))
    rows.append(("tokenizer digest, again", timed(lambda: reuse.tokenizer_digest(lm.tokenizer))))
    plain = timed(lambda: evaluate_lm(off, lm, test, data=fd))
    rows.append(("evaluation, eval.reuse: false", plain))
    rows.append(("evaluation, reuse on, computed and stored",
                 timed(lambda: evaluate_lm(cfg, lm, test, data=fd))))
    rows.append(("evaluation, reuse on, reused", timed(lambda: evaluate_lm(cfg, lm, test, data=fd))))
    assert reuse.stats() == {"computed": 1, "reused": 1}, reuse.stats()

    print(f"{args.model}: {params / 1e6:.1f}M parameters ({trainable / 1e6:.2f}M trainable), "
          f"{len(test)} items x 7 choices, batch {args.batch}, 1 torch thread, "
          f"CPU {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| step | wall (s) | CPU (s) | CPU vs the evaluation |")
    print("|---|---:|---:|---:|")
    for name, (wall, cpu) in rows:
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {100 * cpu / plain[1]:.1f}% |")


if __name__ == "__main__":
    main()
