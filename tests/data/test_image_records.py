"""Image datasets as records for the split/partition code (task image_classification)."""

from __future__ import annotations

import pickle
import struct
from collections import Counter

import numpy as np
import pytest
import torch

from fedkt.config import DataConfig, DatasetConfig
from fedkt.data import DataError, client_splits, load_dataset_records
from fedkt.data.image_records import detect_format, is_image_source, list_image_builtin

Image = pytest.importorskip("PIL.Image")


def test_digits_builtin_records_share_pixels_between_copies():
    ds = load_dataset_records(DatasetConfig(name="digits"))
    assert ds.task == "image_classification" and len(ds.records) == 1797
    assert ds.label_names == [str(i) for i in range(10)]
    r = ds.records[7]
    assert set(r) == {"id", "image", "label"} and tuple(r["image"].shape) == (1, 8, 8)
    assert r["image"].min() >= 0.0 and r["image"].max() <= 1.0 and r["label"] == 7
    assert len({x["id"] for x in ds.records}) == 1797
    again = load_dataset_records(DatasetConfig(name="digits"))
    assert again.records is not ds.records and again.records[0] is not ds.records[0]
    assert again.records[0]["image"].data_ptr() == ds.records[0]["image"].data_ptr()
    assert "digits" in list_image_builtin()
    assert is_image_source(DatasetConfig(name="digits"))
    assert not is_image_source(DatasetConfig(name="intent_recognition"))
    with pytest.raises(DataError, match="image_classification task"):
        load_dataset_records(DatasetConfig(name="digits", task="classification"))
    with pytest.raises(DataError, match="no split"):
        load_dataset_records(DatasetConfig(name="digits:test"))


def test_digits_dirichlet_partition_by_label_is_disjoint_and_seeded():
    cfg = DataConfig.model_validate({
        "dataset": {"name": "digits"}, "split": {"test_size": 0.2, "public_fraction": 0.4},
        "partition": {"scheme": "dirichlet", "alpha": 1.0}})
    fd = client_splits(cfg, 5, seed=0)
    assert fd.task == "image_classification"
    ids = [r["id"] for part in (fd.public, fd.test, *fd.private) for r in part]
    assert len(ids) == len(set(ids)) == 1797
    # Dirichlet(1.0) gives clients different sizes and label mixes.
    sizes = [len(p) for p in fd.private]
    assert len(set(sizes)) == 5
    mixes = [Counter(r["label"] for r in p) for p in fd.private]
    assert mixes[0] != mixes[1]
    again = client_splits(cfg, 5, seed=0)
    assert [r["id"] for r in again.private[2]] == [r["id"] for r in fd.private[2]]
    assert [r["id"] for r in client_splits(cfg, 5, seed=1).private[2]] != \
        [r["id"] for r in fd.private[2]]


def _png(path, value):
    Image.fromarray(np.full((6, 6, 3), value, dtype=np.uint8)).save(path)


def test_image_folder_with_train_and_test_parts(tmp_path):
    for split, n in (("train", 3), ("test", 1)):
        for cls, value in (("cat", 255), ("dog", 0)):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                _png(tmp_path / split / cls / f"{i}.png", value)
    assert detect_format(tmp_path) == "image_folder"
    train = load_dataset_records(DatasetConfig(path=str(tmp_path), task="image_classification"))
    test = load_dataset_records(DatasetConfig(path=str(tmp_path), task="image_classification",
                                              hf_split="test"))
    assert len(train.records) == 6 and len(test.records) == 2
    assert train.label_names == ["cat", "dog"]
    assert [r["label"] for r in train.records] == [0, 0, 0, 1, 1, 1]
    assert train.records[0]["image"].min() == 1.0 and train.records[-1]["image"].max() == 0.0
    small = load_dataset_records(DatasetConfig(
        path=str(tmp_path), task="image_classification",
        fields={"image_size": "4", "grayscale": "true"}))
    assert tuple(small.records[0]["image"].shape) == (1, 4, 4)
    with pytest.raises(DataError, match="unknown option"):
        load_dataset_records(DatasetConfig(path=str(tmp_path), task="image_classification",
                                           fields={"text": "x"}))
    # A test set from the same folder keeps the class names, so splits accept it.
    cfg = DataConfig.model_validate({
        "dataset": {"path": str(tmp_path), "task": "image_classification"},
        "split": {"test_dataset": {"path": str(tmp_path), "task": "image_classification",
                                   "hf_split": "test"}}})
    fd = client_splits(cfg, 2, seed=0)
    assert len(fd.test) == 2 and sum(len(p) for p in fd.private) == 6


def test_cifar10_and_fashion_mnist_files_are_detected_and_read(tmp_path):
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
                 b"labels": [1, 9]}
        (cifar / name).write_bytes(pickle.dumps(batch))
    assert detect_format(tmp_path) == "cifar10"
    ds = load_dataset_records(DatasetConfig(path=str(tmp_path), task="image_classification"))
    assert len(ds.records) == 10 and tuple(ds.records[0]["image"].shape) == (3, 32, 32)
    assert ds.label_names[9] == "truck" and ds.records[1]["label"] == 9
    test = load_dataset_records(DatasetConfig(path=str(tmp_path), task="image_classification",
                                              hf_split="test"))
    assert len(test.records) == 2

    fm = tmp_path / "fashion"
    fm.mkdir()
    pixels = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    (fm / "train-images-idx3-ubyte").write_bytes(
        struct.pack(">BBBB", 0, 0, 8, 3) + struct.pack(">III", 3, 28, 28) + pixels.tobytes())
    (fm / "train-labels-idx1-ubyte").write_bytes(
        struct.pack(">BBBB", 0, 0, 8, 1) + struct.pack(">I", 3) + bytes([0, 9, 4]))
    assert detect_format(fm) == "fashion_mnist"
    ds = load_dataset_records(DatasetConfig(path=str(fm), task="image_classification"))
    assert [r["label"] for r in ds.records] == [0, 9, 4] and ds.label_names[9] == "Ankle boot"
    torch.testing.assert_close(ds.records[1]["image"][0],
                               torch.tensor(pixels[1], dtype=torch.float32) / 255)
    with pytest.raises(DataError, match="not one of"):
        load_dataset_records(DatasetConfig(path=str(fm), task="image_classification",
                                           fields={"format": "svhn"}))


def test_digits_class_filter_relabels_and_keeps_original_ids():
    low = load_dataset_records(DatasetConfig(name="digits", fields={"classes": "0-4"}))
    high = load_dataset_records(DatasetConfig(name="digits", fields={"classes": "9,5-8"}))
    full = load_dataset_records(DatasetConfig(name="digits"))
    assert low.label_names == ["0", "1", "2", "3", "4"]
    assert high.label_names == ["9", "5", "6", "7", "8"]  # the order given
    assert len(low.records) + len(high.records) == len(full.records) == 1797
    assert not {r["id"] for r in low.records} & {r["id"] for r in high.records}
    by_id = {r["id"]: r["label"] for r in full.records}
    assert all(by_id[r["id"]] == r["label"] for r in low.records)
    assert {by_id[r["id"]] for r in high.records if r["label"] == 0} == {9}
    assert {r["label"] for r in high.records} == set(range(5))
    capped = load_dataset_records(DatasetConfig(name="digits", fields={"classes": "0-4"},
                                                max_records=10))
    assert [r["id"] for r in capped.records] == [r["id"] for r in low.records[:10]]
    for bad in ("3-12", "1,1", "x"):
        with pytest.raises(DataError, match="fields.classes"):
            load_dataset_records(DatasetConfig(name="digits", fields={"classes": bad}))
    with pytest.raises(DataError, match="takes no 'fields' but 'classes'"):
        load_dataset_records(DatasetConfig(name="digits", fields={"format": "mnist"}))
