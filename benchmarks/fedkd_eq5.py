"""The magnitudes of FedKD's loss terms at initialisation.

Builds one client's teacher, student and ``W_h`` from a FedKD config and evaluates, on
the first N training tweets as one batch, the task losses (Eqs. 1-2), the adaptive KL
terms (Eqs. 3-4), the Eq. 5 term, the raw hidden-state and attention MSE of each layer
pair, the teacher's mean square state at its deepest matched layer, and, per teacher
layer, the gradient norm of Eq. 5 and of Eq. 3 over that of the task loss
(:func:`fedkt.methods.fedkd.loss_magnitudes`). Dropout is off (eval mode)::

    python benchmarks/fedkd_eq5.py configs/fedkd/suite_base.yaml --examples 32
"""

from __future__ import annotations

import argparse

import torch

from fedkt.config import load_config
from fedkt.data.splits import run_data
from fedkt.methods.fedkd.losses import loss_magnitudes
from fedkt.methods.fedkd.models import FedKDModels
from fedkt.train.encoder import check_text_classification, model_inputs, text_batches
from fedkt.train.losses import hidden_mse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--set", action="append", default=[], help="config override")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.set)
    torch.set_num_threads(cfg.runtime.torch_threads or 1)
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    models = FedKDModels.build(cfg, check_text_classification(fd, cfg.method.name))
    for m in (models.teacher, models.student, models.projections):
        m.eval()
    records = [r for part in fd.private for r in part][: args.examples]
    batch = text_batches(models.tokenizer, records, len(records), cfg.data.max_length, None)[0]
    terms = loss_magnitudes(models, cfg.method, batch)
    print(f"{len(records)} tweets, pooling {cfg.method.pooling}, pairs {models.pairs}")
    for key in ("teacher_task", "student_task", "teacher_kd", "student_kd", "hidden"):
        print(f"{key:14s} {terms[key]:.4g}")
    inputs = model_inputs(batch, next(models.teacher.parameters()).device)
    with torch.no_grad():
        t = models.teacher(**inputs, output_hidden_states=True, output_attentions=True)
        s = models.student(**inputs, output_hidden_states=True, output_attentions=True)
    mask = inputs["attention_mask"]
    for i, (ls, lt) in enumerate(models.pairs):
        h = hidden_mse(t.hidden_states[lt], models.projections[i](s.hidden_states[ls]), mask)
        a = hidden_mse(t.attentions[lt - 1], s.attentions[ls - 1])
        print(f"pair student {ls} -> teacher {lt}: hidden MSE {h.item():.4g}, "
              f"attention MSE {a.item():.4g}")
    deepest = max(lt for _, lt in models.pairs)
    sq = hidden_mse(t.hidden_states[deepest], torch.zeros_like(t.hidden_states[deepest]), mask)
    print(f"teacher layer {deepest} mean square: {sq.item():.4g}")
    for i in range(len([k for k in terms if k.startswith("grad_ratio/hidden/")])):
        print(f"teacher layer {i}: |grad Eq.5| / |grad task| "
              f"{terms[f'grad_ratio/hidden/layer_{i}']:.3g}, |grad Eq.3| / |grad task| "
              f"{terms[f'grad_ratio/kd/layer_{i}']:.3g}")


if __name__ == "__main__":
    main()
