"""Image datasets as records: ``{"id": str, "image": Tensor [C, H, W], "label": int}``.

The split and partition code (:mod:`fedkt.data.splits`) handles these records like
text classification records (Dirichlet partitions group by ``"label"``). Sources:

* built-in ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images,
  10 classes), no files or network needed;
* ``path`` + ``task: image_classification``: files users already have, read by
  :mod:`fedkt.data.images`. The format is detected from what the folder holds
  (CIFAR-10 python batches, (Fashion-)MNIST idx files, USPS ``usps.h5``/``usps.bz2``,
  GTSRB ``Final_Training``, else class-per-subfolder images) or named with
  ``fields: {format: cifar10}``. ``hf_split`` (default ``train``) picks the train or
  test part; an image folder with ``train/`` and ``test/`` subfolders uses the one
  named. Other ``fields`` keys: ``image_size`` (resize image files), ``grayscale``
  (``"true"``), ``crop_roi`` (GTSRB, ``"false"`` to keep the whole photo).

``fields: {classes: "0-4"}`` (also for the built-in ``digits``; ``"5,6,7,8,9"``,
``"0-2,7"``) keeps only those classes, relabelled ``0..k-1`` in the order given, with
their original names; ids keep the original index, so two class-disjoint views of one
dataset never share an id. KOALA uses it to pretrain the server's backbone on other
classes than the federated task's (``method.pretrain.dataset``).

Images are float32 in [0, 1] and every record's ``image`` is a view into one array,
which is never modified, so copies of the record list share the pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fedkt.data.classes import parse_class_spec
from fedkt.data.dataset import DataError, Dataset

if TYPE_CHECKING:  # images imports torch: imported where a dataset is read
    from fedkt.config import DatasetConfig
    from fedkt.data import images as I

__all__ = [
    "IMAGE_BUILTINS",
    "IMAGE_FORMATS",
    "detect_format",
    "is_image_source",
    "list_image_builtin",
    "load_image_records",
]

TASK = "image_classification"


def _load_digits() -> I.ImageData:
    from fedkt.data import images  # imports torch: only when the dataset is read

    return images.load_digits_dataset()


# name -> (description, loader)
IMAGE_BUILTINS: dict[str, tuple[str, Callable[[], I.ImageData]]] = {
    "digits": (
        "scikit-learn's bundled 8x8 handwritten digits (UCI optdigits), 1,797 images, "
        "10 classes [image_classification; split 'all']",
        _load_digits,
    ),
}
IMAGE_FORMATS = ("image_folder", "cifar10", "mnist", "fashion_mnist", "usps", "gtsrb")
_OPTIONS = ("format", "image_size", "grayscale", "crop_roi", "classes")


def list_image_builtin() -> dict[str, str]:
    """Built-in image dataset names -> one-line descriptions."""
    return {name: desc for name, (desc, _) in IMAGE_BUILTINS.items()}


def is_image_source(cfg: DatasetConfig) -> bool:
    """Whether ``cfg`` names an image dataset (built-in, or ``task: image_classification``)."""
    if cfg.name and cfg.name.partition(":")[0] in IMAGE_BUILTINS:
        return True
    return cfg.task == TASK


def _flag(value: str, key: str) -> bool:
    low = value.strip().lower()
    if low in ("1", "true", "yes"):
        return True
    if low in ("0", "false", "no"):
        return False
    raise DataError(f"fields.{key}: expected true or false, got {value!r}")


def detect_format(root: Path) -> str:
    """The image format a folder holds (see the module docstring)."""
    if not root.exists():
        raise DataError(f"image data path not found: {root}")
    if root.is_file():
        name = root.name.lower()
        if name.startswith("usps"):
            return "usps"
        raise DataError(f"{root}: give the folder that holds the image files, not a file")
    for sub in ("", "cifar-10-batches-py"):
        if (root / sub / "data_batch_1").is_file() or (root / sub / "test_batch").is_file():
            return "cifar10"
    if any((root / n).is_file() for n in ("usps.h5", "usps.bz2", "usps", "usps.t.bz2")):
        return "usps"
    for sub in ("", "GTSRB"):
        if (root / sub / "Final_Training").is_dir() or (root / sub / "Final_Test").is_dir():
            return "gtsrb"
    for folder in (root, root / "raw"):
        if any(folder.glob("*-images-idx3-ubyte*")):
            return "fashion_mnist" if "fashion" in str(root).lower() else "mnist"
    return "image_folder"


def _read(cfg: DatasetConfig) -> tuple[I.ImageData, str]:
    from fedkt.data import images  # imports torch: only when a dataset is read

    if cfg.hf_name:
        raise DataError(
            "task image_classification reads built-in 'digits' or local files ('path'); "
            "Hugging Face image datasets are not supported"
        )
    if cfg.name:
        name, _, split = cfg.name.partition(":")
        if name not in IMAGE_BUILTINS:
            raise DataError(
                f"{name!r} is not a built-in image dataset; allowed: "
                f"{', '.join(sorted(IMAGE_BUILTINS))} (or give 'path' to your image files)"
            )
        if split not in ("", "all"):
            raise DataError(f"built-in dataset {name!r} has no split {split!r}; splits: all")
        if cfg.task not in (None, TASK):
            raise DataError(
                f"built-in dataset {name!r} is an {TASK} task; task {cfg.task!r} was given"
            )
        if set(cfg.fields) - {"classes"}:
            raise DataError(f"built-in dataset {name!r} takes no 'fields' but 'classes'")
        return IMAGE_BUILTINS[name][1](), name
    unknown = sorted(set(cfg.fields) - set(_OPTIONS))
    if unknown:
        raise DataError(
            f"fields: unknown option(s) {unknown} for task {TASK}; allowed: {list(_OPTIONS)}"
        )
    root = Path(str(cfg.path)).expanduser()
    fmt = cfg.fields.get("format") or detect_format(root)
    if fmt not in IMAGE_FORMATS:
        raise DataError(f"fields.format: {fmt!r} is not one of {', '.join(IMAGE_FORMATS)}")
    split = cfg.hf_split
    if split not in ("train", "test") and fmt != "image_folder":
        raise DataError(f"hf_split: {fmt} has parts 'train' and 'test', got {split!r}")
    train = split == "train"
    size_text = cfg.fields.get("image_size")
    try:
        size = int(size_text) if size_text else None
    except ValueError:
        raise DataError(f"fields.image_size: expected an integer, got {size_text!r}") from None
    try:
        if fmt == "image_folder":
            folder = root / split if (root / split).is_dir() else root
            data = images.load_image_folder(
                folder, image_size=size,
                grayscale=_flag(cfg.fields.get("grayscale", "false"), "grayscale"))
        elif fmt == "cifar10":
            data = images.load_cifar10(root, train)
        elif fmt == "mnist":
            data = images.load_mnist(root, train)
        elif fmt == "fashion_mnist":
            data = images.load_fashion_mnist(root, train)
        elif fmt == "usps":
            data = images.load_usps(root if root.is_dir() else root.parent, train)
        else:
            data = images.load_gtsrb(root, train, image_size=size or 32,
                                     crop_roi=_flag(cfg.fields.get("crop_roi", "true"), "crop_roi"))
    except (FileNotFoundError, ValueError, ImportError) as exc:
        raise DataError(f"{fmt} data at {root}: {exc}") from exc
    return data, f"{root.name or fmt}"


def parse_classes(text: str, num_classes: int) -> list[int]:
    """``fields.classes`` (``"0-4"``, ``"5,6,7"``, ``"0-2,7"``) -> class indices, in order."""
    return parse_class_spec(text, num_classes, "fields.classes")


def load_image_records(cfg: DatasetConfig) -> Dataset:
    """Load an image dataset into records (the ``image_classification`` task)."""
    data, name = _read(cfg)
    keep = parse_classes(cfg.fields["classes"], data.num_classes) if "classes" in cfg.fields \
        else None
    n_classes = data.num_classes if keep is None else len(keep)
    label_names = list(data.class_names) if keep is None else [data.class_names[c] for c in keep]
    if cfg.label_names is not None:
        if len(cfg.label_names) != n_classes:
            raise DataError(
                f"label_names: {name!r} has {n_classes} classes {label_names}; "
                f"got {len(cfg.label_names)} names"
            )
        label_names = list(cfg.label_names)
    labels = data.labels.tolist()
    bad = [y for y in labels if not 0 <= y < data.num_classes]
    if bad:
        raise DataError(f"dataset {name!r}: label {bad[0]} outside 0..{data.num_classes - 1}")
    index = list(range(len(labels)))
    if keep is not None:
        new = {c: i for i, c in enumerate(keep)}
        index = [i for i in index if labels[i] in new]
        labels = [new.get(y, -1) for y in labels]
    count = len(index) if cfg.max_records is None else min(cfg.max_records, len(index))
    if count == 0:
        raise DataError(f"dataset {name!r}: no images found")
    split = cfg.hf_split if cfg.path else "all"
    records = [{"id": f"{name}:{split}:{i}", "image": data.images[i], "label": int(labels[i])}
               for i in index[:count]]
    return Dataset(name=name, task=TASK, records=records, label_names=label_names)
