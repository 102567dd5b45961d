"""Image classification data as tensors: a bundled set and readers for standard formats.

Every loader returns :class:`ImageData`: ``images`` float32 ``[N, C, H, W]`` in
``[0, 1]``, ``labels`` int64 ``[N]`` and ``class_names``.

* :func:`load_digits_dataset` needs no files: scikit-learn ships the 1,797 8x8
  handwritten digits (UCI optdigits).
* The others read the files users already have, in their published layouts:
  CIFAR-10 python pickles, (Fashion-)MNIST idx-ubyte (optionally gzipped), USPS
  (HDF5 or the LIBSVM bz2 text files), GTSRB (``Final_Training/Images``, one folder
  and one ``GT-*.csv`` per class) and any class-per-subfolder image folder. Nothing
  is downloaded; a missing file raises ``FileNotFoundError`` naming it.

CIFAR-10 batches are Python pickles: only load files from a source you trust.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CIFAR10_CLASSES",
    "FASHION_MNIST_CLASSES",
    "IMAGE_EXTENSIONS",
    "ImageData",
    "load_cifar10",
    "load_digits_dataset",
    "load_fashion_mnist",
    "load_gtsrb",
    "load_image_folder",
    "load_mnist",
    "load_usps",
    "read_idx",
]

CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".gif", ".tif", ".tiff")


class ImageData(NamedTuple):
    """Images ``[N, C, H, W]`` (float32, 0..1), labels ``[N]`` (int64), class names."""

    images: Tensor
    labels: Tensor
    class_names: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _from_uint8(arr: np.ndarray) -> Tensor:
    # copy: readers hand over read-only buffers (np.frombuffer, PIL)
    return torch.from_numpy(np.array(arr, dtype=np.uint8, copy=True)).to(torch.float32) / 255.0


def _labels(values: Sequence[int] | np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64))


# ---------------------------------------------------------------------------
# Bundled: scikit-learn digits
# ---------------------------------------------------------------------------


def load_digits_dataset() -> ImageData:
    """scikit-learn's 8x8 digits: 1,797 images ``[N, 1, 8, 8]`` (pixel 0..16 scaled by 1/16)."""
    from sklearn.datasets import load_digits  # noqa: PLC0415

    bunch = load_digits()
    images = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return ImageData(images, _labels(bunch.target), [str(i) for i in range(10)])


# ---------------------------------------------------------------------------
# PIL-based: image folders and GTSRB
# ---------------------------------------------------------------------------


def _pil():
    try:
        from PIL import Image  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(
            "reading image files needs Pillow; install it with `pip install pillow`"
        ) from exc
    return Image


def _image_to_tensor(img, grayscale: bool, size: int | tuple[int, int] | None) -> Tensor:
    img = img.convert("L" if grayscale else "RGB")
    if size is not None:
        w, h = (size, size) if isinstance(size, int) else (size[1], size[0])
        img = img.resize((w, h), _pil().Resampling.BILINEAR)
    arr = np.asarray(img, dtype=np.uint8)
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return _from_uint8(arr)


def _stack(tensors: list[Tensor], paths: list[Path]) -> Tensor:
    first = tensors[0].shape
    for t, p in zip(tensors, paths, strict=True):
        if t.shape != first:
            raise ValueError(
                f"{p} is {tuple(t.shape[1:])} but {paths[0]} is {tuple(first[1:])}; "
                "pass image_size to resize every image"
            )
    return torch.stack(tensors)


def load_image_folder(
    root: str | Path,
    *,
    image_size: int | tuple[int, int] | None = None,
    grayscale: bool = False,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
) -> ImageData:
    """Class-per-subfolder images (``root/<class>/<file>.png``), classes sorted by name.

    Images are converted to RGB (or ``L`` with ``grayscale``) and, with
    ``image_size`` (int or ``(H, W)``), resized; otherwise they must share a size.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    Image = _pil()
    exts = {e.lower() for e in extensions}
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise FileNotFoundError(f"{root} has no class subfolders (expected root/<class>/<image>)")
    tensors: list[Tensor] = []
    paths: list[Path] = []
    labels: list[int] = []
    for idx, cls in enumerate(classes):
        for path in sorted((root / cls).iterdir()):
            if path.is_file() and path.suffix.lower() in exts:
                with Image.open(path) as img:
                    tensors.append(_image_to_tensor(img, grayscale, image_size))
                paths.append(path)
                labels.append(idx)
    if not tensors:
        raise FileNotFoundError(
            f"no images with extensions {sorted(exts)} under the class folders of {root}"
        )
    return ImageData(_stack(tensors, paths), _labels(labels), classes)


def _gtsrb_base(root: Path, sub: str) -> Path:
    for cand in (root / sub, root / "GTSRB" / sub):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"GTSRB folder {root / sub} (or {root / 'GTSRB' / sub}) not found")


def _read_gt_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"GTSRB annotation file {path} not found")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter=";"))
    need = {"Filename", "ClassId", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2"}
    if rows and not need <= set(rows[0]):
        raise ValueError(f"{path} lacks columns {sorted(need - set(rows[0]))}")
    return rows


def load_gtsrb(
    root: str | Path, train: bool = True, *, image_size: int = 32, crop_roi: bool = True
) -> ImageData:
    """German Traffic Sign Recognition Benchmark, 43 classes, resized to ``image_size``.

    Train: ``root/[GTSRB/]Final_Training/Images/<00000..00042>/`` with
    ``GT-<class>.csv`` (semicolon-separated: Filename;Width;Height;Roi.X1;Roi.Y1;
    Roi.X2;Roi.Y2;ClassId) beside the ``.ppm`` files. Test:
    ``root/[GTSRB/]Final_Test/Images/`` with ``GT-final_test.csv`` (the separately
    published annotations). ``crop_roi`` crops each sign to its ROI box first.
    """
    root = Path(root)
    Image = _pil()
    entries: list[tuple[Path, dict[str, str]]] = []
    if train:
        base = _gtsrb_base(root, "Final_Training/Images")
        class_dirs = sorted(d for d in base.iterdir() if d.is_dir())
        if not class_dirs:
            raise FileNotFoundError(f"{base} has no class folders (00000, 00001, ...)")
        for d in class_dirs:
            for row in _read_gt_csv(d / f"GT-{d.name}.csv"):
                entries.append((d / row["Filename"], row))
    else:
        base = _gtsrb_base(root, "Final_Test/Images")
        csv_path = base / "GT-final_test.csv"
        if not csv_path.is_file():
            csv_path = root / "GT-final_test.csv"
        for row in _read_gt_csv(csv_path):
            entries.append((base / row["Filename"], row))
    if not entries:
        raise FileNotFoundError(f"no GTSRB annotations found under {base}")
    tensors, labels = [], []
    for path, row in entries:
        if not path.is_file():
            raise FileNotFoundError(f"GTSRB image {path} listed in the annotations is missing")
        with Image.open(path) as img:
            if crop_roi:
                box = tuple(int(row[k]) for k in ("Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2"))
                img = img.crop(box)
            tensors.append(_image_to_tensor(img, False, image_size))
        labels.append(int(row["ClassId"]))
    return ImageData(torch.stack(tensors), _labels(labels), [str(i) for i in range(43)])


# ---------------------------------------------------------------------------
# CIFAR-10 python pickles
# ---------------------------------------------------------------------------


def _find_dir(root: Path, names: Sequence[str], sub: str) -> Path:
    """``root`` if it holds the first file, else ``root/sub`` if that does."""
    for cand in (root, root / sub):
        if (cand / names[0]).is_file():
            return cand
    return root if not (root / sub).is_dir() else root / sub


def load_cifar10(root: str | Path, train: bool = True) -> ImageData:
    """CIFAR-10 from the python version: ``data_batch_1..5`` (train) or ``test_batch``.

    ``root`` is the ``cifar-10-batches-py`` folder or its parent. Each batch is a
    pickle with ``data`` (uint8 ``[N, 3072]``: 1024 red, 1024 green, 1024 blue
    values, rows of 32) and ``labels``.
    """
    root = Path(root)
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    base = _find_dir(root, names, "cifar-10-batches-py")
    images, labels = [], []
    for name in names:
        path = base / name
        if not path.is_file():
            raise FileNotFoundError(f"CIFAR-10 file {path} not found")
        with open(path, "rb") as fh:
            batch = pickle.load(fh, encoding="bytes")
        data = batch.get(b"data", batch.get("data"))
        labs = batch.get(b"labels", batch.get("labels"))
        if data is None or labs is None:
            raise ValueError(f"{path} is not a CIFAR-10 batch (no data/labels entries)")
        images.append(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.extend(int(x) for x in labs)
    class_names = list(CIFAR10_CLASSES)
    meta = base / "batches.meta"
    if meta.is_file():
        with open(meta, "rb") as fh:
            m = pickle.load(fh, encoding="bytes")
        raw = m.get(b"label_names", m.get("label_names"))
        if raw:
            class_names = [x.decode() if isinstance(x, bytes) else str(x) for x in raw]
    return ImageData(_from_uint8(np.concatenate(images)), _labels(labels), class_names)


# ---------------------------------------------------------------------------
# idx-ubyte: MNIST and Fashion-MNIST
# ---------------------------------------------------------------------------

_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx file (LeCun's format; ``.gz`` is decompressed) into an array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file (bad magic number {data[:4].hex()})")
    dtype, ndim = np.dtype(_IDX_DTYPES[data[2]]), data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    count = int(np.prod(dims)) if dims else 1
    offset = 4 + 4 * ndim
    if len(data) - offset != count * dtype.itemsize:
        raise ValueError(f"{path} holds {len(data) - offset} bytes of data, its header says {dims}")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(dims)


def _find_idx(root: Path, name: str) -> Path:
    tried = []
    for folder in (root, root / "raw"):
        for cand in (folder / name, folder / f"{name}.gz"):
            tried.append(cand)
            if cand.is_file():
                return cand
    raise FileNotFoundError(f"idx file {name} not found; looked for {', '.join(map(str, tried))}")


def _load_idx_pair(root: str | Path, train: bool) -> tuple[Tensor, Tensor]:
    root = Path(root)
    prefix = "train" if train else "t10k"
    images = read_idx(_find_idx(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_find_idx(root, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"idx shapes do not fit: images {images.shape}, labels {labels.shape} in {root}"
        )
    return _from_uint8(images.astype(np.uint8)[:, None]), _labels(labels)


def load_mnist(root: str | Path, train: bool = True) -> ImageData:
    """MNIST from ``train-/t10k-images-idx3-ubyte`` and ``-labels-idx1-ubyte`` (``.gz`` ok).

    Files are looked up in ``root`` and ``root/raw``.
    """
    images, labels = _load_idx_pair(root, train)
    return ImageData(images, labels, [str(i) for i in range(10)])


def load_fashion_mnist(root: str | Path, train: bool = True) -> ImageData:
    """Fashion-MNIST: same idx files and names as MNIST, clothing classes."""
    images, labels = _load_idx_pair(root, train)
    return ImageData(images, labels, list(FASHION_MNIST_CLASSES))


# ---------------------------------------------------------------------------
# USPS
# ---------------------------------------------------------------------------


def _usps_libsvm(path: Path) -> tuple[Tensor, Tensor]:
    opener = bz2.open if path.suffix == ".bz2" else open
    images, labels = [], []
    with opener(path, "rt") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            label = int(float(parts[0]))
            if not 1 <= label <= 10:
                raise ValueError(f"{path}:{lineno}: label {label} outside 1..10")
            pixels = np.zeros(256, dtype=np.float32)  # omitted features are 0
            for item in parts[1:]:
                idx, val = item.split(":")
                pixels[int(idx) - 1] = float(val)
            images.append(pixels)
            labels.append(label - 1)
    if not images:
        raise ValueError(f"{path} holds no samples")
    arr = (np.stack(images).reshape(-1, 1, 16, 16) + 1.0) / 2.0  # [-1, 1] -> [0, 1]
    return torch.from_numpy(np.clip(arr, 0.0, 1.0)), _labels(labels)


def _usps_h5(path: Path, train: bool) -> tuple[Tensor, Tensor]:
    try:
        import h5py  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(
            f"reading {path} needs h5py (`pip install h5py`); or use the LIBSVM files "
            "usps.bz2 / usps.t.bz2"
        ) from exc
    split = "train" if train else "test"
    with h5py.File(path, "r") as fh:
        if split not in fh:
            raise ValueError(f"{path} has no {split!r} group")
        data = np.asarray(fh[split]["data"], dtype=np.float32)
        target = np.asarray(fh[split]["target"], dtype=np.int64)
    return torch.from_numpy(data.reshape(-1, 1, 16, 16)), _labels(target)


def load_usps(root: str | Path, train: bool = True) -> ImageData:
    """USPS 16x16 digits from ``usps.h5`` (groups train/test with data in [0, 1] and
    target) or the LIBSVM files ``usps.bz2`` (train) / ``usps.t.bz2`` (test), whose
    labels 1..10 become 0..9 and values in [-1, 1] are mapped to [0, 1].
    """
    root = Path(root)
    h5 = root / "usps.h5"
    if h5.is_file():
        images, labels = _usps_h5(h5, train)
    else:
        stem = "usps" if train else "usps.t"
        cands = [root / f"{stem}.bz2", root / stem]
        path = next((p for p in cands if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"USPS not found: looked for {h5} and {', '.join(map(str, cands))}"
            )
        images, labels = _usps_libsvm(path)
    return ImageData(images, labels, [str(i) for i in range(10)])


# --------------------------------------------------------------------------- as tensors


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
