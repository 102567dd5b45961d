"""A server model's backbone, pretrained before round 1 on labelled data the federation never
labels (KOALA and its FedAvg baseline).

Stands in for the ImageNet pretraining the papers start from: :class:`VisionPretrain`
names the data, :func:`check_pretrain_source` refuses a source that overlaps the task's
classes, :func:`pretrained_model` trains the backbone (cached on disk) and gives it a
fresh task head; :func:`split_server_data` turns the public split into unlabelled proxy
images.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from fedkt.config import DatasetConfig, ModelConfig
from fedkt.config.method_settings import VisionPretrain as VisionPretrain  # re-exported
from fedkt.data.images import DataSpec, image_tensors
from fedkt.errors import ConfigError
from fedkt.infra.precision import resolve_precision
from fedkt.models.vision import build_model, head_module
from fedkt.train.vision import device_of, train_vision

__all__ = ["VisionPretrain", "check_pretrain_source", "pretrained_model",
           "server_pretrain_records", "split_server_data"]


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
    from fedkt.infra.cache import cache_dir, cached
    from fedkt.infra.seeds import derive_seed

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
            model.head = nn.Linear(model.feature_dim(), n_pre).to(device_of(model))
        try:
            train_vision(model, (images, labels), epochs=pretrain.epochs,
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
