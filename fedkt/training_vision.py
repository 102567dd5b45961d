"""Shared training pieces for image-classification methods (KOALA, FedKD, baselines).

* :func:`image_tensors` stacks ``image_classification`` records into tensors;
  :func:`data_spec` reads classes, channels and image size from a federation's data;
* :func:`build_model` makes the model a :class:`~fedkt.config.ModelConfig` names
  (a plain-torch model of :mod:`fedkt.models.vision`, or ``torchvision:<name>`` /
  ``timm:<name>`` when those libraries import), seeded;
* :func:`train_classifier` runs epochs of Adam over aligned tensors with the task
  loss (cross-entropy), a replacement ``loss_fn`` or an ``extra_loss`` term;
  :func:`evaluate_classifier` gives accuracy and loss; :func:`predict_logits` and
  :func:`features_and_logits` run a model without / with intermediate features;
* :func:`server_pretrain_records` and :func:`pretrained_model` give a server model a
  backbone trained on labelled data disjoint from the federated task's classes (a
  stand-in for ImageNet pretraining; :func:`check_pretrain_source` refuses an overlap),
  cached on disk; :func:`split_server_data` turns the public split into unlabelled
  proxy images.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from fedkt.config import ConfigError, DatasetConfig, ModelConfig, _Strict
from fedkt.eval import predictions
from fedkt.eval.timing import timed_evaluation
from fedkt.precision import autocast, grad_scaler, resolve_precision, upcast
from fedkt.training import optimizer_step

__all__ = [
    "DataSpec",
    "ExternalClassifier",
    "VisionPretrain",
    "build_model",
    "check_pretrain_source",
    "data_spec",
    "evaluate_classifier",
    "features_and_logits",
    "head_module",
    "image_tensors",
    "pool_features",
    "predict_logits",
    "pretrained_model",
    "server_pretrain_records",
    "split_server_data",
    "train_classifier",
]

# ImageNet's per-channel input statistics (torchvision's and timm's pretrained weights).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

LossFn = Callable[[nn.Module, list[Tensor]], Tensor]
ExtraLoss = Callable[[nn.Module, list[Tensor], Tensor, int], Tensor]


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about the images: classes, channels, size."""

    num_classes: int
    in_channels: int
    image_size: int


def image_tensors(records: Sequence[dict[str, Any]]) -> tuple[Tensor, Tensor]:
    """``image_classification`` records -> images ``[N, C, H, W]`` and labels ``[N]``."""
    if not records:
        raise ValueError("no image records")
    if "image" not in records[0]:
        raise ValueError("records have no 'image' field; use an image_classification dataset")
    images = torch.stack([r["image"] for r in records]).float()
    labels = torch.tensor([int(r["label"]) for r in records], dtype=torch.int64)
    return images, labels


def data_spec(fd: Any) -> DataSpec:
    """Classes, channels and (square) image size of a :class:`FederatedData`."""
    if fd.task != "image_classification":
        raise ValueError(f"an image method needs an image_classification dataset, got {fd.task!r}")
    sample = next(iter(fd.test or fd.public or fd.private[0]))["image"]
    return DataSpec(len(fd.label_names), int(sample.shape[0]), int(max(sample.shape[1:])))


# --------------------------------------------------------------------------- models


class ExternalClassifier(nn.Module):
    """A torchvision/timm model split into a backbone and its last linear layer (the head).

    Offers the :class:`~fedkt.models.vision.VisionClassifier` calls KOALA uses, for the
    whole backbone only: ``features(x)`` ``[B, D]``, ``feature_dim()``, ``head``.
    Grey images are repeated to 3 channels; ``input_size`` resizes inputs first;
    ``normalize`` (on for ImageNet-pretrained weights) then applies ImageNet's mean/std,
    the input statistics those weights were trained on.
    """

    def __init__(self, model: nn.Module, in_channels: int, input_size: int | None = None,
                 normalize: bool = False) -> None:
        super().__init__()
        last = None
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                last = name
        if last is None:
            raise ValueError("model has no nn.Linear classifier to use as its head")
        parent_name, _, attr = last.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        self.head = getattr(parent, attr)
        setattr(parent, attr, nn.Identity())
        self.backbone = model
        self.in_channels = in_channels
        self.input_size = input_size
        self.normalize = normalize
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1),
                             persistent=False)
        self.num_blocks = 0

    def _prep(self, x: Tensor) -> Tensor:
        if self.in_channels == 1:
            x = x.repeat(1, 3, 1, 1)
        if self.input_size:
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear",
                              align_corners=False)
        if self.normalize:
            x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return x

    def features(self, x: Tensor, upto: int | None = None) -> Tensor:
        if upto not in (None, 0):
            raise ValueError("external models expose only their whole backbone (upto=None)")
        return torch.flatten(self.backbone(self._prep(x)), 1)

    def pooled_features(self, x: Tensor, upto: int | None = None) -> Tensor:
        return self.features(x, upto)

    def feature_dim(self, h: int | None = None) -> int:
        return int(self.head.in_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def build_model(model_cfg: ModelConfig, spec: DataSpec, seed: int) -> nn.Module:
    """The model ``model_cfg`` names, initialised from ``seed``.

    ``name``: a model of :data:`fedkt.models.vision.VISION_MODELS` (``tiny`` holds its
    keyword arguments, e.g. ``{width: 16}``), or ``torchvision:<name>`` /
    ``timm:<name>`` (``tiny``: ``pretrained``, ``input_size``) when installed.
    """
    from fedkt.models.vision import build_vision_model, load_timm_model, load_torchvision_backbone

    kwargs = dict(model_cfg.tiny)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lib, _, name = model_cfg.name.partition(":")
        if name and lib in ("torchvision", "timm"):
            pretrained = bool(kwargs.pop("pretrained", False))
            input_size = kwargs.pop("input_size", None)
            if kwargs:
                raise ValueError(f"{model_cfg.name}: unknown options {sorted(kwargs)}")
            loader = load_torchvision_backbone if lib == "torchvision" else load_timm_model
            return ExternalClassifier(loader(name, spec.num_classes, pretrained),
                                      spec.in_channels, input_size, normalize=pretrained)
        return build_vision_model(model_cfg.name, spec.num_classes, spec.in_channels,
                                  spec.image_size, **kwargs)


def head_module(model: nn.Module) -> nn.Module:
    """The classifier head (KOALA's "adapter" of the large model)."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no 'head' module")
    return head


def pool_features(features: Tensor, size: int = 1) -> Tensor:
    """Average-pool a feature map to ``size`` x ``size`` (``size=1``: vectors ``[B, C]``)."""
    if features.dim() == 2:
        return features
    pooled = F.adaptive_avg_pool2d(features, size)
    return torch.flatten(pooled, 1) if size == 1 else pooled


def features_and_logits(model: nn.Module, x: Tensor, upto: int | None) -> tuple[Tensor, Tensor]:
    """``(model.features(x, upto), model(x))`` in one pass where the model allows it."""
    from fedkt.models.vision import VisionClassifier

    if not isinstance(model, VisionClassifier):
        return model.features(x, upto), model(x)
    h = model.num_blocks if upto is None else upto
    if not 0 <= h <= model.num_blocks:
        raise ValueError(f"upto must be in [0, {model.num_blocks}] or None, got {upto}")
    y = model.stem(x)
    feat = y
    for i, block in enumerate(model.blocks):
        if i == h:
            feat = y
        y = block(y)
    if h == model.num_blocks:
        feat = y
    return feat, model.head(torch.flatten(model.pool(y), 1))


@torch.no_grad()
def predict_logits(model: nn.Module, inputs: Tensor, batch_size: int = 256,
                   precision: str = "auto") -> Tensor:
    """Logits (fp32) of ``model`` (in eval mode) on ``inputs``; the model's mode is restored.

    ``precision``: ``training.precision`` (:mod:`fedkt.precision`).
    """
    was = model.training
    model.eval()
    try:
        device = _device_of(model)
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
        device = _device_of(model)
        outs = []
        for i in range(0, len(images), batch_size):
            with autocast(precision, device):
                f = model.features(images[i:i + batch_size].to(device), upto)
                f = f if pool is None else pool_features(f, pool)
            outs.append(f.float().cpu())
    finally:
        model.train(was)
    return torch.cat(outs)


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


# --------------------------------------------------------------------------- training


def train_classifier(
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
    number of examples. ``precision``: ``training.precision`` (:mod:`fedkt.precision`; the
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
    device = _device_of(model)
    scaler = grad_scaler(precision, device)
    torch.manual_seed(seed)  # dropout and other in-model randomness
    model.train()
    for m in modules:
        m.train()
    losses: list[float] = []
    step = 0
    epoch = 0
    while step < total:
        gen = torch.Generator().manual_seed(seed * 1000003 + epoch)
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            if step >= total:
                break
            idx = order[start:start + batch_size]
            batch = [t[idx].to(device) for t in tensors]
            logits = None
            with autocast(precision, device):
                if loss_fn is not None:
                    loss = loss_fn(model, batch)
                else:
                    logits = model(batch[0])
                    loss = task_weight * F.cross_entropy(upcast(logits), batch[1])
                if extra_loss is not None:
                    loss = loss + extra_loss(model, batch, logits, step)
            losses.append(optimizer_step(loss, opt, None, params, max_grad_norm, scaler))
            step += 1
        epoch += 1
    model.eval()
    for m in modules:
        m.eval()
    return {"loss": sum(losses) / len(losses), "steps": step, "num_examples": n}


@timed_evaluation
@torch.no_grad()
def evaluate_classifier(model: nn.Module, inputs: Tensor, labels: Tensor,
                        batch_size: int = 256, ids: Sequence[str] | None = None,
                        precision: str = "auto") -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``inputs`` (eval mode).

    The per-example predictions (``ids``: the records' ids, else positions) go to
    :func:`fedkt.eval.predictions.emit`."""
    logits = predict_logits(model, inputs, batch_size, precision)
    labels = labels.to(logits.device)
    predictions.emit({"id": list(ids) if ids is not None else list(range(len(labels))),
                      "gold": labels.tolist(), "pred": logits.argmax(-1).tolist()},
                     task="classifier")
    return {"accuracy": float((logits.argmax(-1) == labels).float().mean()),
            "loss": float(F.cross_entropy(logits, labels))}


# --------------------------------------------------------------------------- pretraining


class VisionPretrain(_Strict):
    """A server model's backbone, trained before round 1 on data the federation never labels.

    Stands in for the ImageNet pretraining the papers start from, and must not learn
    from the federated task's labels: ``dataset`` is a labelled image dataset whose
    classes are disjoint from the task's (another dataset, or other classes of the same
    one, e.g. ``{name: digits, fields: {classes: "5-9"}}`` for a task on digits 0-4;
    :func:`check_pretrain_source` refuses a class overlap with ``data.dataset``). The
    backbone trains with a temporary linear head for the pretraining classes; the task
    head (the adapter) is then freshly initialised, so federated training starts from
    chance. The server's whole public split, labels removed, is the proxy set.

    ``enabled: false`` is refused for the plain-torch models: a random frozen backbone's
    eval-mode features collapse (about 1e-9) and every method on it lands at chance. It
    is accepted for ``torchvision:``/``timm:`` models with ``pretrained: true``.
    """

    enabled: bool = True
    dataset: DatasetConfig | None = None
    epochs: float = Field(30.0, gt=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-6, ge=0)
    batch_size: int = Field(64, ge=1)
    # Cache the pretrained weights on disk ($FEDKT_CACHE or ~/.cache/fedkt).
    cache: bool = True


def _classes_of(ds: DatasetConfig) -> set[int] | None:
    from fedkt.data.image_records import parse_classes

    text = ds.fields.get("classes")
    return None if text is None else set(parse_classes(text, 10**6))


def check_pretrain_source(model_cfg: ModelConfig, task: DatasetConfig,
                          pretrain: VisionPretrain, where: str = "method.pretrain") -> None:
    """Refuse a pretraining set-up that is missing or would see the task's labels."""
    external = model_cfg.name.partition(":")[0] in ("torchvision", "timm")
    if not pretrain.enabled:
        if external and model_cfg.tiny.get("pretrained"):
            return
        raise ConfigError(
            f"{where}.enabled: false leaves {model_cfg.name}'s backbone random and frozen; "
            "its eval-mode features collapse (about 1e-9) and the adapter lands at chance. "
            f"Name labelled data disjoint from the task in {where}.dataset, or use a "
            "torchvision:/timm: model with tiny: {pretrained: true}")
    if pretrain.dataset is None:
        raise ConfigError(
            f"{where}.dataset: name the labelled data that pretrains the server's backbone, "
            "disjoint from the federated task's labels (e.g. {name: digits, fields: "
            "{classes: '5-9'}} with data.dataset {name: digits, fields: {classes: '0-4'}})")
    pre = pretrain.dataset
    same_source = (pre.name or "").partition(":")[0] == (task.name or "").partition(":")[0] \
        and pre.path == task.path and pre.hf_name == task.hf_name
    if same_source:
        a, b = _classes_of(pre), _classes_of(task)
        if a is None or b is None or a & b:
            raise ConfigError(
                f"{where}.dataset: pretraining on {pre.name or pre.path} classes "
                f"{sorted(a) if a else 'all'} would teach the server the federated task's "
                f"labels (data.dataset classes {sorted(b) if b else 'all'}); give both "
                "fields.classes, disjoint")


def server_pretrain_records(pretrain: VisionPretrain) -> tuple[list[dict[str, Any]], int]:
    """The labelled pretraining records and their number of classes (none: ``[], 0``)."""
    if not pretrain.enabled or pretrain.dataset is None:
        return [], 0
    from fedkt.data import load_dataset_records

    ds = load_dataset_records(pretrain.dataset)
    if ds.task != "image_classification":
        raise ConfigError(f"method.pretrain.dataset: {ds.name!r} is not an image dataset")
    return ds.records, len(ds.label_names)


def split_server_data(public: list[dict[str, Any]]) -> Tensor:
    """The server's public records -> the unlabelled proxy images (labels are dropped)."""
    if not public:
        raise ValueError("no proxy data: set data.split.public_fraction > 0")
    return torch.stack([r["image"] for r in public]).float()


def _fingerprint(*tensors: Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def pretrained_model(
    model_cfg: ModelConfig,
    spec: DataSpec,
    records: list[dict[str, Any]],
    pretrain: VisionPretrain,
    seed: int,
    precision: str = "auto",
    num_classes: int | None = None,
) -> nn.Module:
    """``model_cfg``'s model with its backbone trained on ``records`` (CE, Adam), cached.

    ``records`` are the pretraining set's (:func:`server_pretrain_records`, ``num_classes``
    its classes): the backbone trains under a temporary linear head of that many classes,
    and the returned model carries a fresh task head (``spec.num_classes``), initialised
    from ``seed`` alone. The cache key covers the model config, data shape, pretraining
    settings, seed and the exact pixels and labels of ``records``. Without ``records``
    (``enabled: false`` on a pretrained external model) the model is returned as built.
    """
    from fedkt.cache import cache_dir, cached
    from fedkt.methods.base import derive_seed

    model = build_model(model_cfg, spec, derive_seed(seed, "pretrain-init", model_cfg.name))
    if not pretrain.enabled or not records:
        return model
    images, labels = image_tensors(records)
    if tuple(images.shape[1:]) != (spec.in_channels, spec.image_size, spec.image_size):
        raise ConfigError(
            f"method.pretrain.dataset: images {tuple(images.shape[1:])} differ from the "
            f"task's {(spec.in_channels, spec.image_size, spec.image_size)}")
    n_pre = int(num_classes or int(labels.max()) + 1)
    fields = {
        "model": model_cfg.model_dump(mode="json"), "spec": spec.__dict__,
        "pretrain": pretrain.model_dump(mode="json", exclude={"cache"}), "seed": seed,
        "data": _fingerprint(images, labels), "classes": n_pre, "version": 2,
    }
    dtype = resolve_precision(precision, model)
    if dtype is not None:  # fp32 keeps the keys of weights cached before precision existed
        fields["precision"] = str(dtype)
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_dir("vision-pretrained") / f"{model_cfg.name.replace(':', '_')}-{key}.safetensors"
    task_head = head_module(model)

    def pretrain_model(tmp: Path | None = None) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, "pretrain-probe", model_cfg.name))
            model.head = nn.Linear(model.feature_dim(), n_pre).to(_device_of(model))
        try:
            train_classifier(model, (images, labels), epochs=pretrain.epochs,
                             batch_size=pretrain.batch_size, lr=pretrain.lr,
                             weight_decay=pretrain.weight_decay,
                             seed=derive_seed(seed, "pretrain"), precision=precision)
        finally:
            model.head = task_head  # the adapter never saw the pretraining classes
        if tmp is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
                      str(tmp))

    if pretrain.cache:
        cached(path, pretrain_model, lambda p: model.load_state_dict(load_file(str(p))))
    else:
        pretrain_model()
    return model
