"""Image classifiers: train on aligned tensors, predict, extract features, score.

* :func:`train_vision` runs epochs of Adam over aligned tensors (``[inputs, labels,
  ...]``) with the task loss (cross-entropy), a replacement ``loss_fn`` or an
  ``extra_loss`` term, through :func:`fedkt.train.loop.run_steps`;
* :func:`evaluate_vision` gives accuracy and loss; :func:`predict_logits` and
  :func:`extract_features` run a model (in eval mode, under ``training.precision``).

The models come from :func:`fedkt.models.vision.build_model`, the data from
:func:`fedkt.data.images.image_tensors`; a server's backbone pretraining is in
:mod:`fedkt.train.pretrain`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedkt.eval import predictions
from fedkt.infra.precision import autocast, autocast_dtype, grad_scaler, upcast
from fedkt.infra.timing import timed_evaluation
from fedkt.models.vision import pool_features
from fedkt.train.loop import run_steps
from fedkt.train.optim import step

__all__ = ["device_of", "evaluate_vision", "extract_features", "predict_logits",
           "train_vision"]

LossFn = Callable[[nn.Module, list[Tensor]], Tensor]
ExtraLoss = Callable[[nn.Module, list[Tensor], Tensor, int], Tensor]


@torch.no_grad()
def predict_logits(model: nn.Module, inputs: Tensor, batch_size: int = 256,
                   precision: str = "auto") -> Tensor:
    """Logits (fp32) of ``model`` (in eval mode) on ``inputs``; the model's mode is restored.

    ``precision``: ``training.precision`` (:mod:`fedkt.infra.precision`).
    """
    was = model.training
    model.eval()
    try:
        device = device_of(model)
        with autocast(precision, device):
            outs = [model(inputs[i:i + batch_size].to(device)).float().cpu()
                    for i in range(0, len(inputs), batch_size)]
    finally:
        model.train(was)
    return torch.cat(outs)


@torch.no_grad()
def extract_features(model: nn.Module, images: Tensor, upto: int | None = None,
                     pool: int | None = 1, batch_size: int = 256, precision: str = "auto"
                     ) -> Tensor:
    """``model.features(images, upto)`` (fp32) in eval mode, pooled to ``pool`` (None: as is)."""
    was = model.training
    model.eval()
    try:
        device = device_of(model)
        outs = []
        for i in range(0, len(images), batch_size):
            with autocast(precision, device):
                f = model.features(images[i:i + batch_size].to(device), upto)
                f = f if pool is None else pool_features(f, pool)
            outs.append(f.float().cpu())
    finally:
        model.train(was)
    return torch.cat(outs)


def device_of(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without any)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def train_vision(
    model: nn.Module,
    tensors: Sequence[Tensor],
    *,
    epochs: float = 1.0,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    seed: int = 0,
    params: Iterable[nn.Parameter] | None = None,
    loss_fn: LossFn | None = None,
    extra_loss: ExtraLoss | None = None,
    task_weight: float = 1.0,
    max_steps: int | None = None,
    max_grad_norm: float | None = None,
    modules: Sequence[nn.Module] = (),
    precision: str = "auto",
) -> dict[str, float]:
    """Adam over mini-batches of aligned ``tensors`` (``[inputs, labels, ...]``).

    Loss per batch: ``loss_fn(model, batch)`` if given, else ``task_weight *
    CE(model(batch[0]), batch[1])``; plus ``extra_loss(model, batch, logits, step)``
    (``logits`` is ``None`` with a ``loss_fn``). ``params`` default to the model's
    trainable parameters; ``modules`` (e.g. a bridging matrix) are put in train mode
    with the model. Batches follow a seeded shuffle per epoch; fractional ``epochs``
    stop part-way. The model is left in eval mode. Returns the mean loss, steps and
    number of examples. ``precision``: ``training.precision`` (:mod:`fedkt.infra.precision`; the
    forward pass and loss run under autocast, the losses in fp32).
    """
    n = len(tensors[0])
    if any(len(t) != n for t in tensors):
        raise ValueError(f"tensors differ in length: {[len(t) for t in tensors]}")
    if n == 0:
        return {"loss": float("nan"), "steps": 0, "num_examples": 0}
    per_epoch = math.ceil(n / batch_size)
    total = max(1, math.ceil(epochs * per_epoch))
    if max_steps is not None:
        total = min(total, max_steps)
    params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    if not params:
        raise ValueError("nothing to train: no parameter requires grad")
    opt = torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay)
    device = device_of(model)
    scaler = grad_scaler(precision, device)

    def batches() -> Iterator[list[Tensor]]:
        """``total`` batches: a seeded shuffle per epoch, the last epoch cut short."""
        done, epoch = 0, 0
        while done < total:
            gen = torch.Generator().manual_seed(seed * 1000003 + epoch)
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, batch_size):
                if done >= total:
                    return
                idx = order[start:start + batch_size]
                yield [t[idx].to(device) for t in tensors]
                done += 1
            epoch += 1

    def batch_loss(i: int, batch: list[Tensor]) -> Tensor:
        logits = None
        with autocast(precision, device):
            if loss_fn is not None:
                loss = loss_fn(model, batch)
            else:
                logits = model(batch[0])
                loss = task_weight * F.cross_entropy(upcast(logits), batch[1])
            if extra_loss is not None:
                loss = loss + extra_loss(model, batch, logits, i)
        return loss

    stats = run_steps(batches(), batch_loss,
                      lambda loss: step(loss, [opt], clip=[params], scaler=scaler,
                                        max_grad_norm=max_grad_norm),
                      modules=[model, *modules], seed=seed, total=total, desc="vision train",
                      cast=autocast_dtype(precision, device))
    return {"loss": stats.loss, "steps": stats.steps, "num_examples": n}


@timed_evaluation
def evaluate_vision(model: nn.Module, inputs: Tensor, labels: Tensor,
                    batch_size: int = 256, ids: Sequence[str] | None = None,
                    precision: str = "auto", reuse: bool = False) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``inputs`` (eval mode).

    The per-example predictions (``ids``: the records' ids, else positions) go to
    :func:`fedkt.eval.predictions.emit`.  ``reuse`` (``eval.reuse``): a stored evaluation
    of the same model, inputs and settings is reused (:mod:`fedkt.eval.reuse`)."""
    from fedkt.eval import reuse as reused

    return reused.evaluation(
        reuse, model, None, {"inputs": inputs, "labels": labels, "batch_size": batch_size,
                             "ids": None if ids is None else list(ids),
                             "precision": precision},
        lambda: _evaluate_vision(model, inputs, labels, batch_size, ids, precision))


@torch.no_grad()
def _evaluate_vision(model: nn.Module, inputs: Tensor, labels: Tensor, batch_size: int,
                     ids: Sequence[str] | None, precision: str) -> dict[str, float]:
    logits = predict_logits(model, inputs, batch_size, precision)
    labels = labels.to(logits.device)
    predictions.emit({"id": list(ids) if ids is not None else list(range(len(labels))),
                      "gold": labels.tolist(), "pred": logits.argmax(-1).tolist()},
                     task="classifier")
    return {"accuracy": float((logits.argmax(-1) == labels).float().mean()),
            "loss": float(F.cross_entropy(logits, labels))}
