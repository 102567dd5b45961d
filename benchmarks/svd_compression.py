"""Benchmark FedKD's SVD update compression (Eqs. 8-9) on per-round model updates.

The core is :func:`measure`: give it the update dict of each round (parameter name
-> update tensor, e.g. a FedKD student's ``new - old`` weights) and an energy
threshold schedule; it returns one row per (round, parameter) plus a
``__total__`` row per round with ranks, bytes, compression ratio and the relative
reconstruction error ``||u - u_hat||^2 / ||u||^2`` (Eq. 8 guarantees ``<= 1 - T``).

Real student updates: ``--fedkd CONFIG`` runs a FedKD job (local runtime) and records
every update the method compresses: each client's student update (upload) and the
server's aggregate (download). It prints, per round, the threshold ``T`` (Eq. 9), the
compression ratio of the uploads and of the download, their relative reconstruction
error, and the time of compress + reconstruct as a share of one local training step
(the clients' mean ``train/step_seconds`` in that round)::

    python benchmarks/svd_compression.py --fedkd configs/fedkd/quick.yaml
    python benchmarks/svd_compression.py --fedkd configs/fedkd/fedkd.yaml --set rounds=3

Without ``--fedkd`` it trains a toy MLP (or a ``fedkt.models.vision`` model) on the
scikit-learn digits for a few rounds and prints the per-parameter table::

    python benchmarks/svd_compression.py --model mlp --rounds 5
    python benchmarks/svd_compression.py --model mobilenet_v3_small --csv runs/svd.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from fedkt.federated.compression import (
    compress_state,
    decompress_state,
    svd_reconstruct,
    threshold_schedule,
)

Schedule = Callable[[int, int], float] | Sequence[float] | float

FIELDS = [
    "round",
    "T",
    "param",
    "shape",
    "rank",
    "full_rank",
    "dense_bytes",
    "compressed_bytes",
    "ratio",
    "rel_error",
    "method",
]


def _threshold(schedule: Schedule, t: int, total: int) -> float:
    if callable(schedule):
        return float(schedule(t, total))
    if isinstance(schedule, (int, float)):
        return float(schedule)
    values = list(schedule)
    if len(values) != total:
        raise ValueError(f"schedule lists {len(values)} thresholds for {total} rounds")
    return float(values[t])


def measure(updates_per_round: list[dict[str, Tensor]], schedule: Schedule) -> list[dict]:
    """Compress each round's updates with that round's threshold and report the cost.

    ``schedule``: a callable ``(round_index, total_rounds) -> T`` (e.g.
    :func:`fedkt.federated.compression.threshold_schedule`), one ``T`` per round, or a
    constant ``T``. Returns rows with the keys in ``FIELDS``.
    """
    rows: list[dict] = []
    total = len(updates_per_round)
    for t, update in enumerate(updates_per_round):
        T = _threshold(schedule, t, total)
        compressed = compress_state(update, T)
        dense_sum = comp_sum = 0
        err_sum = energy_sum = 0.0
        for name, tensor in update.items():
            c = compressed[name]
            dense = tensor.numel() * tensor.element_size()
            energy = tensor.detach().double().pow(2).sum().item()
            err = (svd_reconstruct(c).double() - tensor.double()).pow(2).sum().item()
            full_rank = min(tensor.shape[0], tensor[0].numel()) if tensor.dim() >= 2 else None
            rows.append(
                {
                    "round": t,
                    "T": T,
                    "param": name,
                    "shape": "x".join(map(str, tensor.shape)),
                    "rank": c.rank,
                    "full_rank": full_rank,
                    "dense_bytes": dense,
                    "compressed_bytes": c.nbytes,
                    "ratio": dense / c.nbytes if c.nbytes else float("inf"),
                    "rel_error": err / energy if energy > 0 else 0.0,
                    "method": c.method,
                }
            )
            dense_sum += dense
            comp_sum += c.nbytes
            err_sum += err
            energy_sum += energy
        rows.append(
            {
                "round": t,
                "T": T,
                "param": "__total__",
                "shape": "",
                "rank": None,
                "full_rank": None,
                "dense_bytes": dense_sum,
                "compressed_bytes": comp_sum,
                "ratio": dense_sum / comp_sum if comp_sum else float("inf"),
                "rel_error": err_sum / energy_sum if energy_sum > 0 else 0.0,
                "method": "",
            }
        )
    return rows


def _toy_model(name: str) -> nn.Module:
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
            nn.Linear(64, 10),
        )  # fmt: skip
    from fedkt.models.vision import build_vision_model  # noqa: PLC0415

    return build_vision_model(name, num_classes=10, in_channels=1, image_size=8)


def simulate_updates(
    model: nn.Module, rounds: int, steps: int, lr: float = 0.05, seed: int = 0
) -> list[dict[str, Tensor]]:
    """Train ``model`` on the digits with SGD; return each round's parameter deltas."""
    from fedkt.data.images import load_digits_dataset  # noqa: PLC0415

    torch.manual_seed(seed)
    data = load_digits_dataset()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    updates = []
    for _ in range(rounds):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for _ in range(steps):
            idx = torch.randint(0, len(data.labels), (64,), generator=gen)
            loss = nn.functional.cross_entropy(model(data.images[idx]), data.labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        updates.append({n: p.detach() - before[n] for n, p in model.named_parameters()})
    return updates


# --------------------------------------------------------------------------- FedKD runs


def record_fedkd_run(config: Path, overrides: Sequence[str] = (), keep: Path | None = None
                     ) -> tuple[list[dict], list[dict]]:
    """Run a FedKD job; return every compressed update and the run's metric rows.

    Each record: ``{"round", "role": "upload" | "download", "T", "update"}`` where
    ``update`` is the dense update the method handed to SVD compression. ``keep``: the
    run folder to keep (a normal run, e.g. for ``fedkt report``); default a temporary one.
    """
    import fedkt.methods.exchange as exchange  # noqa: PLC0415
    import fedkt.methods.fedkd.algorithm as fedkd  # noqa: PLC0415
    from fedkt.config import load_config  # noqa: PLC0415
    from fedkt.configs.catalog import resolve_config  # noqa: PLC0415
    from fedkt.models.install import check_installed  # noqa: PLC0415
    from fedkt.runtime.base import default_state_root  # noqa: PLC0415
    from fedkt.runtime.job import run_job  # noqa: PLC0415
    from fedkt.runtime.local import LocalTransport  # noqa: PLC0415

    cfg = load_config(resolve_config(str(config)), list(overrides))
    check_installed(cfg)
    if cfg.method.name != "fedkd" or not cfg.method.compress:
        raise SystemExit(f"{config}: expected a fedkd config with compress: true")
    records: list[dict] = []
    # Every encode is the server's (the aggregate, "download") but those inside a client's
    # upload_update ("upload"); the server encodes after its clients of the same round.
    state = {"round": 1, "role": "download"}
    encode, upload = exchange.encode_update, fedkd.upload_update

    def recording_encode(update: dict[str, Tensor], T: float | None) -> dict[str, Tensor]:
        records.append({**state, "T": T, "update": {k: v.detach().clone()
                                                   for k, v in update.items()}})
        return encode(update, T)

    def recording_upload(ctx, update, T):  # noqa: ANN001, ANN202
        state.update(round=ctx.rnd, role="upload")
        try:
            return upload(ctx, update, T)
        finally:
            state.update(role="download")

    exchange.encode_update = recording_encode
    fedkd.upload_update = recording_upload
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = keep if keep is not None else Path(tmp) / "run"
            cfg = cfg.model_copy(update={"output_dir": str(out)})
            rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    finally:
        exchange.encode_update = encode
        fedkd.upload_update = upload
    return records, rows


def _timed(update: dict[str, Tensor], T: float, repeats: int = 3) -> tuple[float, float]:
    """Best-of-``repeats`` seconds of compress (Eq. 8) and of reconstruct."""
    best_c = best_r = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        comp = compress_state(update, T)
        t1 = time.perf_counter()
        decompress_state(comp)
        t2 = time.perf_counter()
        best_c, best_r = min(best_c, t1 - t0), min(best_r, t2 - t1)
    return best_c, best_r


def fedkd_table(records: list[dict], rows: list[dict]) -> list[dict]:
    """Per round: upload / download ratios and errors, and SVD time vs a local step."""
    out = []
    for rnd in sorted({r["round"] for r in records}):
        steps = [r.get("step_seconds") for r in rows
                 if r.get("round") == rnd and r.get("split") == "train"
                 and str(r.get("participant", "")).startswith("client")]
        steps = [s for s in steps if isinstance(s, int | float) and s > 0]
        line: dict = {"round": rnd, "step_seconds": statistics.mean(steps) if steps else None}
        for role in ("upload", "download"):
            mine = [r for r in records if r["round"] == rnd and r["role"] == role]
            if not mine:
                continue
            T = mine[0]["T"]
            totals = [m for m in measure([r["update"] for r in mine], T)
                      if m["param"] == "__total__"]
            times = [_timed(r["update"], T) for r in mine]
            line.update({
                "T": T,
                f"{role}_dense_mb": totals[0]["dense_bytes"] / 1e6,
                f"{role}_mb": statistics.mean(t["compressed_bytes"] for t in totals) / 1e6,
                f"{role}_ratio": statistics.mean(t["ratio"] for t in totals),
                f"{role}_rel_error": max(t["rel_error"] for t in totals),
                f"{role}_compress_s": statistics.mean(t[0] for t in times),
                f"{role}_reconstruct_s": statistics.mean(t[1] for t in times),
            })
        # one round of SVD work seen by a client: compress its upload, reconstruct the
        # download; by the server: reconstruct each upload, compress the aggregate
        svd = sum(line.get(k, 0.0) for k in ("upload_compress_s", "download_reconstruct_s"))
        line["client_svd_s"] = svd
        if line["step_seconds"]:
            line["client_svd_share_of_step"] = svd / line["step_seconds"]
        out.append(line)
    return out


def print_fedkd_table(table: list[dict]) -> None:
    """Per round: sizes and ratios (dense / sent), errors, and SVD time in ms.

    ``client ms`` = compress the upload + reconstruct the download (one client's SVD
    work in a round); ``SVD/step`` is that over the mean local training step.
    """
    print(f"{'round':>5} {'T':>6} {'dense MB':>8} {'up MB':>7} {'up x':>5} {'up err':>7} "
          f"{'down MB':>7} {'down x':>6} {'down err':>8} {'comp ms':>7} {'recon ms':>8} "
          f"{'client ms':>9} {'step ms':>8} {'SVD/step':>8}")  # fmt: skip
    nan = float("nan")
    for r in table:
        share = r.get("client_svd_share_of_step")
        step = r.get("step_seconds")
        print(
            f"{r['round']:>5} {r['T']:>6.4f} {r['upload_dense_mb']:>8.3f} {r['upload_mb']:>7.3f} "
            f"{r['upload_ratio']:>5.2f} {r['upload_rel_error']:>7.4f} "
            f"{r.get('download_mb', nan):>7.3f} {r.get('download_ratio', nan):>6.2f} "
            f"{r.get('download_rel_error', nan):>8.4f} {1e3 * r['upload_compress_s']:>7.1f} "
            f"{1e3 * r.get('download_reconstruct_s', nan):>8.2f} "
            f"{1e3 * r['client_svd_s']:>9.1f} {1e3 * step if step else nan:>8.1f} "
            f"{share if share is not None else nan:>8.1%}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="'mlp' or a fedkt.models.vision name")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="SGD steps per round")
    parser.add_argument("--t-start", type=float, default=0.95)
    parser.add_argument("--t-end", type=float, default=0.98)
    parser.add_argument("--csv", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--all-params", action="store_true", help="print every parameter row")
    parser.add_argument("--fedkd", type=Path, default=None, metavar="CONFIG",
                        help="measure the real student updates of this FedKD run instead")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for --fedkd (repeatable)")
    parser.add_argument("--keep", type=Path, default=None, metavar="RUN_DIR",
                        help="--fedkd: keep the run folder here (else a temporary one)")
    args = parser.parse_args(argv)

    if args.fedkd is not None:
        records, rows = record_fedkd_run(args.fedkd, args.set, args.keep)
        table = fedkd_table(records, rows)
        print_fedkd_table(table)
        if args.csv is not None:
            args.csv.parent.mkdir(parents=True, exist_ok=True)
            with open(args.csv, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=sorted({k for r in table for k in r}))
                writer.writeheader()
                writer.writerows(table)
        return 0

    torch.manual_seed(0)  # same initial model every run
    updates = simulate_updates(_toy_model(args.model), args.rounds, args.steps)
    rows = measure(
        updates,
        lambda t, n: threshold_schedule(t, n, args.t_start, args.t_end),
    )
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    print(f"{'round':>5} {'T':>6} {'param':<32} {'rank':>9} {'dense B':>10} {'comp B':>10} "
          f"{'ratio':>7} {'rel err':>9}")  # fmt: skip
    for r in rows:
        if not args.all_params and r["param"] != "__total__" and r["rank"] is None:
            continue
        rank = "" if r["rank"] is None else f"{r['rank']}/{r['full_rank']}"
        print(
            f"{r['round']:>5} {r['T']:>6.4f} {r['param'][:32]:<32} {rank:>9} "
            f"{r['dense_bytes']:>10} {r['compressed_bytes']:>10} {r['ratio']:>7.2f} "
            f"{r['rel_error']:>9.2e}"
        )
    return 0


if __name__ == "__main__":
    from fedkt.models.install import run_script

    run_script(lambda: sys.exit(main()))
