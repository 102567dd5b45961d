"""KOALA's shuffled-teacher control, replayed: why one permutation per round swings.

Takes the clients' soft labels on the proxy set from a finished run's last checkpoint
(``--from-run``: its global small model; the suite's ``homo`` config and the run's seed)
or, without it, from ``--rounds`` real rounds of the suite's ``homo`` arm; then replays
only the reverse distillation (the head on the cached proxy features, exactly
``KoalaServer.reverse_distill``) from the fresh adapter, for ``--draws`` permutation
draws x ``--replay`` rounds, under each teacher:

* ``real``: the clients' soft labels as they are;
* ``round``: ``teacher: shuffled, shuffle_every: round`` (one permutation per round);
* ``epoch``: ``teacher: shuffled, shuffle_every: epoch`` (a fresh one every pass);
* ``marginal``: ``teacher: marginal`` (every image the mean soft label; 2 draws);
* ``untrained``: a never-trained small model's soft labels.

For each it prints the large model's test accuracy after the last replayed round (mean,
std, min, max over draws), the mean over each draw's last 3 rounds, the swing within a
draw (max - min over rounds 2..R), and, for ``round``, how the accuracy follows the
permutation's *agreement*: the share of proxy images whose borrowed soft label's top
class is their own class (diagnostics only: the proxy labels are read here, never by
the server).

    python benchmarks/koala_shuffled.py --seed 7 --from-run runs/suites/koala/random_homo/seed_7
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from fedkt.evidence.suite import load_suite
from fedkt.methods import get_method
from fedkt.methods.koala.algorithm import shuffle_permutations
from fedkt.methods.koala.losses import homo_soft_labels
from fedkt.runtime.base import RuntimeClients, default_state_root
from fedkt.runtime.local import LocalTransport
from fedkt.train.vision import predict_logits

ROOT = Path(__file__).resolve().parents[1]


def teacher_server(server: Any, **method: Any) -> None:
    """Switch the server's teacher settings in place (the replay's only difference)."""
    server.cfg = server.cfg.model_copy(
        update={"method": server.cfg.method.model_copy(update=method)})


def test_accuracy(server: Any) -> tuple[float, np.ndarray]:
    pred = predict_logits(server.head, server.test_features).argmax(1)
    return float((pred == server.test_labels).float().mean()), pred.numpy()


def replay(server: Any, soft: torch.Tensor, draws: int, rounds: int) -> dict[str, Any]:
    """Accuracy per (draw, round) of the head trained from its fresh start."""
    accs = np.zeros((draws, rounds))
    preds = []
    for d in range(draws):
        server.head.load_state_dict(server.initial_head)
        for r in range(rounds):
            server.reverse_distill(1000 * (d + 1) + r, soft)
            accs[d, r], pred = test_accuracy(server)
        preds.append(pred)
    return {"acc": accs, "preds": preds}


def agreement(server: Any, soft: torch.Tensor, proxy_labels: torch.Tensor, rnd: int) -> float:
    """Share of proxy images whose borrowed (round-permuted) soft label's top class is
    their own class."""
    perm = shuffle_permutations(len(soft), 1, server.seed(rnd, "shuffle-teacher"))[0]
    return float((soft[perm].argmax(1) == proxy_labels).float().mean())


def summary(acc: np.ndarray) -> dict[str, float]:
    final, last3 = acc[:, -1], acc[:, -3:].mean(1)
    swing = acc[:, 1:].max(1) - acc[:, 1:].min(1)
    return {"final_mean": float(final.mean()), "final_std": float(final.std(ddof=1)),
            "final_min": float(final.min()), "final_max": float(final.max()),
            "final_below_0.12": float((final < 0.12).mean()),
            "last3_mean": float(last3.mean()), "last3_std": float(last3.std(ddof=1)),
            "swing_mean": float(swing.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2, help="real rounds before the replay")
    ap.add_argument("--from-run", help="a finished run of this seed: its last checkpoint's "
                    "small model is the teacher (no rounds are run)")
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--replay", type=int, default=10, help="replayed rounds per draw")
    ap.add_argument("--out", default="runs/koala_shuffled")
    ap.add_argument("--modes", nargs="+", default=["real", "round", "epoch", "marginal",
                                                   "untrained"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    suite = load_suite(ROOT / "fedkt/configs/suites/koala.yaml", args.out)
    cfg = suite.runs[("homo", suite.cfg.seeds[0])]
    cfg = cfg.model_copy(update={"seed": args.seed, "output_dir": f"{args.out}/seed_{args.seed}"})
    started = time.perf_counter()
    server = get_method("koala").server(cfg, cfg.run_dir)
    server.setup()
    if args.from_run:
        ckpt = Path(args.from_run) / "checkpoints"
        latest = json.loads((ckpt / "latest.json").read_text())
        server.load_state_dict(load_file(str(ckpt / latest["checkpoint"] / latest["state"])))
    else:
        clients = RuntimeClients(cfg, LocalTransport(default_state_root(cfg)))
        for rnd in range(1, args.rounds + 1):
            clients.start_round(rnd)
            server.round(rnd, clients)
    temp = cfg.method.temperature
    soft = homo_soft_labels(server.teacher_logits("global"), temp)
    proxy_labels = torch.tensor([r["label"] for r in server.data().public])
    teacher_acc = float((soft.argmax(1) == proxy_labels).float().mean())
    out: dict[str, Any] = {"seed": args.seed, "teacher_from": args.from_run or args.rounds,
                           "draws": args.draws,
                           "teacher_proxy_accuracy": teacher_acc,
                           "test_class_shares": np.bincount(server.test_labels.numpy(),
                                                            minlength=5).tolist()}
    modes = {"real": {"teacher": "clients"},
             "round": {"teacher": "shuffled", "shuffle_every": "round"},
             "epoch": {"teacher": "shuffled", "shuffle_every": "epoch"},
             "marginal": {"teacher": "marginal"}}
    for name, method in modes.items():
        if name not in args.modes:
            continue
        teacher_server(server, **method)
        draws = 1 if name == "real" else args.draws if name != "marginal" else 2
        got = replay(server, soft, draws, args.replay)
        out[name] = summary(got["acc"]) if draws > 1 else {"final": float(got["acc"][0, -1])}
        out[name]["predicted_class_shares"] = np.bincount(got["preds"][-1], minlength=5).tolist()
        if name == "round":  # accuracy against the permutation's agreement, every round
            agree = np.array([[agreement(server, soft, proxy_labels, 1000 * (d + 1) + r)
                               for r in range(args.replay)] for d in range(args.draws)])
            acc = got["acc"]
            out[name]["agreement_mean"] = float(agree.mean())
            out[name]["corr_acc_agreement"] = (
                float(np.corrcoef(agree.ravel(), acc.ravel())[0, 1])
                if acc.std() > 0 and agree.std() > 0 else None)
            worst = int(acc[:, -1].argmin())
            out[name]["worst_draw"] = {
                "accuracy_per_round": [round(float(a), 3) for a in acc[worst]],
                "predicted_class_shares": np.bincount(got["preds"][worst],
                                                      minlength=5).tolist()}
    if "untrained" in args.modes:
        teacher_server(server, teacher="untrained")
        untrained = homo_soft_labels(server.teacher_logits("global"), temp)
        got = replay(server, untrained, 1, args.replay)
        out["untrained"] = {"final": float(got["acc"][0, -1]),
                            "accuracy_per_round": [round(float(a), 3) for a in got["acc"][0]],
                            "predicted_class_shares": np.bincount(got["preds"][0],
                                                                  minlength=5).tolist()}
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"seed_{args.seed}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
