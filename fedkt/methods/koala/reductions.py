"""KOALA's Table 2: how much smaller the clients' models are than the server's."""

from __future__ import annotations

from fedkt.config import ModelConfig, RunConfig
from fedkt.data.images import DataSpec
from fedkt.models.vision import build_model

__all__ = ["client_reductions"]


def client_reductions(cfg: RunConfig, spec: DataSpec) -> dict[str, float]:
    """Table 2's arithmetic on counted parameters and FLOPs, as the paper states it.

    Storage: ``1 - mean_k params(small_k) / params(large)``; FLOPs: ``1 - mean_k
    FLOPs(small_k) / FLOPs(large)`` (the mean over the clients' models: one model in
    homo, each client's own in hete), at the run's input (``*_flops_reduction``) and at
    the paper's 3x64x64 counting input (``*_flops_reduction_64``), with the models built
    as configured. Logged with every server evaluation, so suite claims can test them.
    """
    from fedkt.models.vision import count_flops, count_params

    def counts(mcfg: ModelConfig, s: DataSpec) -> tuple[int, int]:
        model = build_model(mcfg, s, 0)
        return count_params(model), count_flops(model, (s.in_channels, s.image_size,
                                                        s.image_size))

    paper = DataSpec(spec.num_classes, 3, 64)
    smalls = [cfg.clients.model_for(c) for c in cfg.client_ids()]
    out: dict[str, float] = {}
    for tag, s in (("", spec), ("_64", paper)):
        lp, lf = counts(cfg.server, s)
        got = [counts(m, s) for m in smalls]
        mean_p = sum(p for p, _ in got) / len(got)
        out[f"client_storage_reduction{tag}"] = 1 - mean_p / lp
        out[f"client_flops_reduction{tag}"] = 1 - sum(f for _, f in got) / len(got) / lf
        if not tag:
            out.update(large_params=float(lp), client_params_mean=mean_p,
                       client_storage_reduction_min=1 - max(p for p, _ in got) / lp)
    return out
