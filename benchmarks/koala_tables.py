"""KOALA's Tables 1 and 2 (Chen et al., arXiv:2407.05268), measured here, the paper's way.

Table 2 (always, seconds): parameters and forward FLOPs, counted with
``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per multiply-accumulate of
convolutions and matmuls), of

* ``as run``: the models of ``configs/koala/homo.yaml`` / ``hete.yaml`` on their 1x8x8
  digits (5 classes), and the same models counted at the paper's 3x64x64 input;
* ``paper widths``: the same builders at the papers' widths (VGG19 channels 64..512,
  MobileNetV2/V3-Small and EfficientNet-B0 at width 1.0, ShuffleNetV2 with 4-8-4 units)
  at 3x64x64, 10 classes;

with the clients' reductions computed as the paper does, ``1 - mean_k small_k / large``
(homo: one MobileNetV2; hete: the five small models), each hete client's own reduction,
and the paper's own Table 2 arithmetic next to them.

Table 1 (``--suite DIR``): per arm of the KOALA suite (``fedkt/configs/suites/koala.yaml``),
mean ± std over seeds of the large model's best and final test accuracy, and round 0.

    python benchmarks/koala_tables.py                             # Table 2
    python benchmarks/koala_tables.py --suite runs/suites/koala   # + Table 1 from the suite

The runs themselves are the suite: ``python -m fedkt.cli suite run suites/koala --jobs 2``
(its measured time is in docs/records/koala.md, the one place it is stated).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from fedkt.models.vision import build_vision_model, count_flops, count_params

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "koala"
LARGE = ("VGG19 (large, server)", "vgg_small")
HOMO_MODEL = "mobilenet_v2_small"  # the paper's homo small model (Table 2, ID 3)
LABELS = {
    "mobilenet_v3_small": "MobileNetV3-Small", "mobilenet_v2_small": "MobileNetV2",
    "efficientnet_b0_small": "EfficientNet-B0", "shufflenet_v2_x0_5_small": "ShuffleNetV2 x0.5",
    "shufflenet_v2_x2_0_small": "ShuffleNetV2 x2.0", "vgg_small": "VGG19",
}
PAPER_WIDTHS = {
    "vgg_small": {"width": 64, "depth": 19},
    "mobilenet_v3_small": {"width_mult": 1.0},
    "mobilenet_v2_small": {"width_mult": 1.0},
    "efficientnet_b0_small": {"width_mult": 1.0, "depth_mult": 1.0},
    "shufflenet_v2_x0_5_small": {"stages_repeats": (4, 8, 4)},
    "shufflenet_v2_x2_0_small": {"stages_repeats": (4, 8, 4)},
}
# The paper's Table 2 (CIFAR-10/Fashion-MNIST/USPS column): params, FLOPs at 3x64x64.
# TorchVision VGG19 is 143,667,240 parameters; + Linear(1000 -> 10) = 143,677,250 = 143.68M.
PAPER_TABLE2 = {
    "vgg_small": (143.68e6, 3.43e9),
    "shufflenet_v2_x2_0_small": (7.40e6, 101.45e6),
    "efficientnet_b0_small": (5.30e6, 71.32e6),
    "mobilenet_v2_small": (3.51e6, 55.84e6),
    "mobilenet_v3_small": (2.55e6, 14.03e6),
    "shufflenet_v2_x0_5_small": (1.38e6, 9.18e6),
}
HETE_MODELS = ["mobilenet_v3_small", "mobilenet_v2_small", "efficientnet_b0_small",
               "shufflenet_v2_x0_5_small", "shufflenet_v2_x2_0_small"]
PAPER_CLAIMED = {"homo": (0.976, 0.984), "hete": (0.972, 0.986)}  # storage, FLOPs (§4.4)


def reductions(large: tuple[float, float], smalls: list[tuple[float, float]]
               ) -> tuple[float, float]:
    """``(1 - mean params / large params, 1 - mean FLOPs / large FLOPs)`` over clients."""
    n = len(smalls)
    return (1 - sum(p for p, _ in smalls) / n / large[0],
            1 - sum(f for _, f in smalls) / n / large[1])


def paper_reductions() -> dict[str, tuple[float, float]]:
    """The paper's §4.4 reductions recomputed from its own Table 2."""
    large = PAPER_TABLE2["vgg_small"]
    return {"homo": reductions(large, [PAPER_TABLE2[HOMO_MODEL]]),
            "hete": reductions(large, [PAPER_TABLE2[m] for m in HETE_MODELS])}


def _config_models(name: str) -> tuple[dict, list[tuple[str, dict]]]:
    from fedkt.config import load_config

    cfg = load_config(CONFIGS / f"{name}.yaml")
    return dict(cfg.server.tiny), [(m.name, dict(m.tiny)) for m in cfg.clients.models]


def _count(name: str, kwargs: dict, shape: tuple[int, int, int], classes: int
           ) -> tuple[int, int]:
    torch.manual_seed(0)
    model = build_vision_model(name, classes, shape[0], shape[1], **kwargs)
    return count_params(model), count_flops(model, shape)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table2() -> str:
    lines = ["## Table 2: parameters, FLOPs and the clients' reductions (counted)", ""]
    large_kw, _ = _config_models("homo")
    scales = [("as run, 1x8x8 (5 classes)", (1, 8, 8), 5, None),
              ("as run, counted at the paper's 3x64x64", (3, 64, 64), 5, None),
              ("paper widths, 3x64x64 (10 classes)", (3, 64, 64), 10, PAPER_WIDTHS)]
    paper = paper_reductions()
    lines += ["| model | " + " | ".join(f"{t}: params / MFLOPs" for t, *_ in scales)
              + " | paper: params / MFLOPs |", "|---" * (len(scales) + 2) + "|"]
    counted: dict[str, list[tuple[int, int]]] = {}
    for name in ["vgg_small", *HETE_MODELS]:
        row = []
        for _title, shape, classes, widths in scales:
            kw = (widths or {}).get(name, large_kw if name == "vgg_small" and not widths else {})
            if widths is None and name != "vgg_small":
                kw = dict(_hete_kwargs().get(name, {}))
            p, f = _count(name, kw, shape, classes)
            counted.setdefault(name, []).append((p, f))
            row.append(f"{p:,} / {f / 1e6:.2f}")
        pp, pf = PAPER_TABLE2[name]
        lines.append(f"| {LABELS[name]} | " + " | ".join(row)
                     + f" | {pp / 1e6:.2f}M / {pf / 1e6:.2f} |")
    lines += ["", "Clients' reductions, 1 - mean(small) / large (storage = parameters):", "",
              "| mode | " + " | ".join(t for t, *_ in scales)
              + " | paper, recomputed from its Table 2 | paper, as stated |",
              "|---" * (len(scales) + 3) + "|"]
    for mode, models in (("homo", [HOMO_MODEL]), ("hete", HETE_MODELS)):
        cells = []
        for i in range(len(scales)):
            s, f = reductions(counted["vgg_small"][i], [counted[m][i] for m in models])
            cells.append(f"{_pct(s)} storage, {_pct(f)} FLOPs")
        ps, pf = paper[mode]
        cs, cf = PAPER_CLAIMED[mode]
        lines.append(f"| {mode} | " + " | ".join(cells)
                     + f" | {_pct(ps)}, {_pct(pf)} | {_pct(cs)}, {_pct(cf)} |")
    lines += ["", "Each hete client's own reduction, as run (1x8x8) and at paper widths:", "",
              "| client model | as run: storage / FLOPs | paper widths: storage / FLOPs |",
              "|---|---:|---:|"]
    for m in HETE_MODELS:
        a = reductions(counted["vgg_small"][0], [counted[m][0]])
        b = reductions(counted["vgg_small"][2], [counted[m][2]])
        lines.append(f"| {LABELS[m]} | {_pct(a[0])} / {_pct(a[1])} | "
                     f"{_pct(b[0])} / {_pct(b[1])} |")
    return "\n".join(lines) + "\n"


def _hete_kwargs() -> dict[str, dict]:
    _, models = _config_models("hete")
    return dict(models)


# --------------------------------------------------------------------------- Table 1


def _server_rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("participant") == "server" and r.get("split") == "test"
            and isinstance(r.get("accuracy"), float | int)]


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * std:.1f}"


def table1(folder: Path) -> str:
    """Mean ± std over seeds of the server's best, final and round-0 accuracy, per arm."""
    lines = ["## Table 1: the large model's test accuracy (%), mean ± std over seeds", "",
             "| arm | seeds | best round | final round | round 0 |", "|---|---:|---:|---:|---:|"]
    for arm in sorted(p for p in folder.iterdir() if p.is_dir() and any(p.glob("seed_*"))):
        best, final, zero = [], [], []
        for run in sorted(arm.glob("seed_*")):
            if not (run / "metrics.jsonl").is_file():
                continue
            rows = _server_rows(run)
            trained = [r for r in rows if r["round"] >= 1]
            if not trained:
                continue
            best.append(max(r["accuracy"] for r in trained))
            final.append(max(trained, key=lambda r: r["round"])["accuracy"])
            zero += [r["accuracy"] for r in rows if r["round"] == 0]
        if best:
            lines.append(f"| {arm.name} | {len(best)} | {_mean_std(best)} | {_mean_std(final)} "
                         f"| {_mean_std(zero)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, help="print Table 1 from this suite folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(table2())
    if args.suite:
        print(table1(args.suite))
    return 0


if __name__ == "__main__":
    sys.exit(main())
