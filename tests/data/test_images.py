"""Image loaders, each tested on small synthetic files written in the exact format."""

from __future__ import annotations

import bz2
import gzip
import pickle
import struct
import sys

import numpy as np
import pytest
import torch

from fedkt.data import images as I

Image = pytest.importorskip("PIL.Image")


def test_digits_dataset():
    from sklearn.datasets import load_digits

    data = I.load_digits_dataset()
    assert data.images.shape == (1797, 1, 8, 8) and data.images.dtype == torch.float32
    assert data.labels.shape == (1797,) and data.labels.dtype == torch.int64
    # sklearn pixels are 0..16, so /16 puts the maximum at exactly 1.0
    assert data.images.min().item() == 0.0 and data.images.max().item() == 1.0
    ref = load_digits()
    torch.testing.assert_close(data.images[5, 0], torch.tensor(ref.images[5] / 16.0).float())
    assert data.labels.tolist()[:10] == list(range(10)) and data.num_classes == 10


def _png(path, value, size=(4, 4)):
    Image.fromarray(np.full((*size, 3), value, dtype=np.uint8)).save(path)


def test_image_folder(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "dog").mkdir()
    _png(tmp_path / "cat" / "a.png", 255)
    _png(tmp_path / "cat" / "b.png", 0)
    _png(tmp_path / "dog" / "c.png", 51)  # 51 / 255 = 0.2
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    data = I.load_image_folder(tmp_path)
    assert data.class_names == ["cat", "dog"]
    assert data.labels.tolist() == [0, 0, 1]
    assert data.images.shape == (3, 3, 4, 4)
    assert data.images[0].min().item() == 1.0 and data.images[1].max().item() == 0.0
    assert data.images[2, 0, 0, 0].item() == pytest.approx(0.2)
    gray = I.load_image_folder(tmp_path, grayscale=True)
    assert gray.images.shape == (3, 1, 4, 4)
    # mismatched sizes need image_size
    _png(tmp_path / "dog" / "d.png", 10, size=(6, 6))
    with pytest.raises(ValueError, match="pass image_size"):
        I.load_image_folder(tmp_path)
    assert I.load_image_folder(tmp_path, image_size=8).images.shape == (4, 3, 8, 8)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        I.load_image_folder(tmp_path / "missing")


def _cifar_batch(path, n, seed):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).tolist()
    with open(path, "wb") as fh:
        pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, fh, protocol=2)
    return data, labels


def test_cifar10_pickles(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    batches = [_cifar_batch(base / f"data_batch_{i}", 2, i) for i in range(1, 6)]
    test_data, test_labels = _cifar_batch(base / "test_batch", 3, 99)
    names = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j"]
    with open(base / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": names}, fh)
    train = I.load_cifar10(tmp_path)  # parent folder works
    assert train.images.shape == (10, 3, 32, 32)
    assert train.labels.tolist() == sum((lab for _, lab in batches), [])
    assert train.class_names[:2] == ["a", "b"]
    # layout: row r of a batch, channel c, pixel (y, x) = data[r, c * 1024 + y * 32 + x]
    data0 = batches[0][0]
    assert train.images[1, 2, 5, 7].item() == pytest.approx(data0[1, 2 * 1024 + 5 * 32 + 7] / 255)
    test = I.load_cifar10(base, train=False)
    assert test.images.shape == (3, 3, 32, 32) and test.labels.tolist() == test_labels
    (base / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        I.load_cifar10(base)


def _write_idx(path, arr, gz):
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = header + arr.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_and_fashion_idx(tmp_path, gz):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labs = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", imgs, gz)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", labs, gz)
    data = I.load_mnist(tmp_path, train=False)
    assert data.images.shape == (5, 1, 28, 28)
    assert data.labels.tolist() == [3, 1, 4, 1, 5]
    assert data.images[2, 0, 10, 11].item() == pytest.approx(imgs[2, 10, 11] / 255)
    fashion = I.load_fashion_mnist(tmp_path, train=False)
    assert fashion.class_names[9] == "Ankle boot"
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        I.load_mnist(tmp_path, train=True)


def test_idx_bad_magic_and_truncated(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="bad magic"):
        I.read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="header says"):
        I.read_idx(short)


def test_usps_libsvm_bz2(tmp_path):
    # two samples: label 1 -> class 0, label 10 -> class 9
    # sample 0: pixel 1 = -1 (-> 0.0), pixel 2 = 1 (-> 1.0), omitted pixels are 0 (-> 0.5)
    lines = ["1 1:-1 2:1\n", "10 256:0.5\n"]
    with bz2.open(tmp_path / "usps.t.bz2", "wt") as fh:
        fh.writelines(lines)
    data = I.load_usps(tmp_path, train=False)
    assert data.images.shape == (2, 1, 16, 16) and data.labels.tolist() == [0, 9]
    flat = data.images.view(2, -1)
    assert flat[0, 0].item() == 0.0 and flat[0, 1].item() == 1.0 and flat[0, 2].item() == 0.5
    # (0.5 + 1) / 2 = 0.75
    assert flat[1, 255].item() == pytest.approx(0.75)
    with pytest.raises(FileNotFoundError, match=r"usps\.bz2"):
        I.load_usps(tmp_path, train=True)


def test_usps_h5_needs_h5py(tmp_path, monkeypatch):
    (tmp_path / "usps.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match="needs h5py"):
        I.load_usps(tmp_path)


def test_usps_h5_format(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "usps.h5", "w") as fh:
        g = fh.create_group("train")
        g.create_dataset("data", data=np.linspace(0, 1, 2 * 256).reshape(2, 256))
        g.create_dataset("target", data=np.array([7, 2]))
    data = I.load_usps(tmp_path)
    assert data.images.shape == (2, 1, 16, 16) and data.labels.tolist() == [7, 2]


def _ppm(path, size, roi):
    # black image with a white ROI box [x1, x2) x [y1, y2)
    w, h = size
    arr = np.zeros((h, w, 3), dtype=np.uint8)
    x1, y1, x2, y2 = roi
    arr[y1:y2, x1:x2] = 255
    Image.fromarray(arr).save(path, format="PPM")


def _gt_csv(path, rows):
    header = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId\n"
    body = "".join(";".join(map(str, r)) + "\n" for r in rows)
    path.write_text(header + body)


def test_gtsrb_training_layout(tmp_path):
    base = tmp_path / "GTSRB" / "Final_Training" / "Images"
    for cls, files in (
        ("00000", ["00000_00000.ppm", "00000_00001.ppm"]),
        ("00001", ["00001_00000.ppm"]),
    ):
        d = base / cls
        d.mkdir(parents=True)
        rows = []
        for f in files:
            _ppm(d / f, (12, 10), (2, 3, 9, 8))
            rows.append((f, 12, 10, 2, 3, 9, 8, int(cls)))
        _gt_csv(d / f"GT-{cls}.csv", rows)
    data = I.load_gtsrb(tmp_path, image_size=8)
    assert data.images.shape == (3, 3, 8, 8) and data.labels.tolist() == [0, 0, 1]
    assert data.num_classes == 43
    # cropped to the white ROI: every pixel is 1
    assert data.images.min().item() == pytest.approx(1.0)
    uncropped = I.load_gtsrb(tmp_path, image_size=8, crop_roi=False)
    assert uncropped.images.min().item() < 0.5
    (base / "00001" / "GT-00001.csv").unlink()
    with pytest.raises(FileNotFoundError, match="GT-00001.csv"):
        I.load_gtsrb(tmp_path)
    with pytest.raises(FileNotFoundError, match="Final_Test"):
        I.load_gtsrb(tmp_path, train=False)
