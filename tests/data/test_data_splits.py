"""Public / private / test splits, client partitions and caps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from fedkt.config import DataConfig, DatasetConfig, PartitionConfig, SplitConfig
from fedkt.data import DataError, client_splits, load_dataset_records, make_splits, partition


def _ids(records: list[dict]) -> list[str]:
    return [r["id"] for r in records]


def test_fedmkt_split_gives_equal_disjoint_parts() -> None:
    ds = load_dataset_records(DatasetConfig(name="social_iqa"))
    k = 4
    sp = make_splits(ds, SplitConfig(scheme="fedmkt", test_size=200), num_clients=k, seed=3)
    n_train = len(ds.records) - 200
    part = n_train // (k + 1)
    assert len(sp["test"]) == 200
    assert len(sp["public"]) == part
    assert len(sp["private_pool"]) == k * part
    all_ids = _ids(sp["test"]) + _ids(sp["public"]) + _ids(sp["private_pool"])
    assert len(set(all_ids)) == len(all_ids)

    data = client_splits(
        DataConfig(
            dataset=DatasetConfig(name="social_iqa"),
            split=SplitConfig(scheme="fedmkt", test_size=200),
        ),
        num_clients=k,
        seed=3,
    )
    assert [len(p) for p in data.private] == [part] * k
    # Identity partition: client c gets the c-th part of the pool.
    for c in range(k):
        assert _ids(data.private[c]) == _ids(sp["private_pool"][c * part : (c + 1) * part])
    assert _ids(data.public) == _ids(sp["public"])
    assert data.task == "multiple_choice" and data.label_names is None


def test_holdout_fraction_and_count() -> None:
    ds = load_dataset_records(DatasetConfig(name="intent_recognition"))
    sp = make_splits(ds, SplitConfig(test_size=0.2, public_fraction=0.25), 3, seed=0)
    n_test = int(0.2 * 693)
    assert len(sp["test"]) == n_test
    assert len(sp["public"]) == int(0.25 * (693 - n_test))
    assert len(sp["public"]) + len(sp["private_pool"]) == 693 - n_test
    sp2 = make_splits(ds, SplitConfig(test_size=50), 3, seed=0)
    assert len(sp2["test"]) == 50 and sp2["public"] == []
    with pytest.raises(DataError, match="leaves no training records"):
        make_splits(ds, SplitConfig(test_size=693), 3, seed=0)


def test_splits_are_seeded() -> None:
    ds = load_dataset_records(DatasetConfig(name="intent_recognition"))
    a = make_splits(ds, SplitConfig(test_size=100), 2, seed=7)
    b = make_splits(ds, SplitConfig(test_size=100), 2, seed=7)
    c = make_splits(ds, SplitConfig(test_size=100), 2, seed=8)
    assert _ids(a["test"]) == _ids(b["test"])
    assert _ids(a["test"]) != _ids(c["test"])


def test_separate_test_dataset() -> None:
    cfg = DataConfig(
        dataset=DatasetConfig(name="dialogsum"),
        split=SplitConfig(scheme="fedmkt", test_dataset=DatasetConfig(name="dialogsum:test")),
    )
    data = client_splits(cfg, num_clients=2, seed=0)
    assert len(data.test) == 200 and all("references" in r for r in data.test)
    assert len(data.public) == 500 and [len(p) for p in data.private] == [500, 500]
    assert data.template is not None and data.template.startswith("Dialogue:")
    bad = SplitConfig(test_dataset=DatasetConfig(name="social_iqa"))
    with pytest.raises(DataError, match="is a multiple_choice task"):
        make_splits(load_dataset_records(cfg.dataset), bad, 2, seed=0)


def test_iid_partition_sizes_and_disjointness() -> None:
    records = [{"id": str(i), "label": i % 5} for i in range(103)]
    parts = partition(records, 4, PartitionConfig(scheme="iid"), seed=1)
    assert [len(p) for p in parts] == [25] * 4
    flat = [i for p in parts for i in p]
    assert len(set(flat)) == 100 and all(0 <= i < 103 for i in flat)
    assert parts == partition(records, 4, PartitionConfig(scheme="iid"), seed=1)
    assert parts != partition(records, 4, PartitionConfig(scheme="iid"), seed=2)
    with pytest.raises(DataError, match="need at least 30"):
        partition(records, 4, PartitionConfig(scheme="iid", min_size=30), seed=1)


def _skew(records: list[dict], parts: list[list[int]], n_classes: int) -> float:
    """Mean over clients of the largest class share (1/n_classes when balanced)."""
    shares = []
    for p in parts:
        counts = Counter(records[i]["label"] for i in p)
        shares.append(max(counts.values()) / len(p))
    return float(np.mean(shares))


def test_dirichlet_small_alpha_is_skewed_and_deterministic() -> None:
    records = load_dataset_records(DatasetConfig(name="intent_recognition")).records
    k = 5
    iid = partition(records, k, PartitionConfig(scheme="iid"), seed=0)
    skewed = partition(records, k, PartitionConfig(scheme="dirichlet", alpha=0.1), seed=0)
    flat = [i for p in skewed for i in p]
    assert sorted(flat) == list(range(len(records)))  # a partition of every record
    assert all(len(p) >= 1 for p in skewed)
    assert _skew(records, iid, 7) < 0.3
    assert _skew(records, skewed, 7) > 0.5
    assert _skew(records, skewed, 7) > _skew(
        records, partition(records, k, PartitionConfig(scheme="dirichlet", alpha=100.0), seed=0), 7
    )
    again = partition(records, k, PartitionConfig(scheme="dirichlet", alpha=0.1), seed=0)
    other = partition(records, k, PartitionConfig(scheme="dirichlet", alpha=0.1), seed=1)
    assert skewed == again
    assert skewed != other


def test_dirichlet_min_size_and_label_errors() -> None:
    records = [{"id": str(i), "label": i % 2} for i in range(40)]
    with pytest.raises(DataError, match="no draw in 100 tries"):
        partition(records, 10, PartitionConfig(scheme="dirichlet", alpha=0.05, min_size=4), 0)
    gen = [{"id": str(i), "prompt": "p", "target": "t"} for i in range(10)]
    with pytest.raises(DataError, match="needs labels"):
        partition(gen, 2, PartitionConfig(scheme="dirichlet"), 0)
    parts = partition(gen, 2, PartitionConfig(scheme="dirichlet"), 0, labels=[0, 1] * 5)
    assert sorted(i for p in parts for i in p) == list(range(10))


def test_caps_are_applied_deterministically() -> None:
    base = {
        "dataset": DatasetConfig(name="tweeteval_hate"),
        "split": SplitConfig(test_size=300, public_fraction=0.1),
        "partition": PartitionConfig(scheme="dirichlet", alpha=0.5, min_size=30),
    }
    full = client_splits(DataConfig(**base), num_clients=3, seed=5)
    capped = client_splits(
        DataConfig(**base, max_private_per_client=20, max_public=15, max_test=40),
        num_clients=3,
        seed=5,
    )
    assert capped.sizes() == {"public": 15, "private": [20, 20, 20], "test": 40}
    assert _ids(capped.public) == _ids(full.public[:15])
    assert _ids(capped.test) == _ids(full.test[:40])
    for c in range(3):
        assert _ids(capped.private[c]) == _ids(full.private[c][:20])
    assert capped.label_names == ["not-hate", "hate"]
    # Each client's list is shuffled, so a cap is a random draw, not a class block.
    labels = [r["label"] for r in full.private[0]]
    assert len(set(labels)) == 2
    assert labels not in (sorted(labels), sorted(labels, reverse=True))


_SCRIPT = """
import json
from fedkt.config import DataConfig, DatasetConfig, PartitionConfig, SplitConfig
from fedkt.data import client_splits
cfg = DataConfig(dataset=DatasetConfig(name="intent_recognition"),
                 split=SplitConfig(test_size=0.1, public_fraction=0.2),
                 partition=PartitionConfig(scheme="dirichlet", alpha=0.3))
d = client_splits(cfg, 3, seed=11)
print(json.dumps([[r["id"] for r in d.public], [[r["id"] for r in p] for p in d.private],
                  [r["id"] for r in d.test]]))
"""


def test_independent_of_hash_randomisation() -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SCRIPT],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            stdout=subprocess.PIPE,
            text=True,
        )
        for hash_seed in ("1", "987")
    ]
    outs = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        outs.append(json.loads(stdout))
    assert outs[0] == outs[1]
    assert len(outs[0][1]) == 3 and all(outs[0][1])


# --------------------------------------------------------------------------- by_field


def _speakers(n_speakers: int, per: int = 3) -> list[dict]:
    """A constructed set with a natural key: ``speaker`` kept in each record's extra."""
    return [{"id": f"{s}-{i}", "text": f"utterance {i} of {s}", "label": i % 2,
             "extra": {"speaker": f"spk{s:02d}"}}
            for s in range(n_speakers) for i in range(per + s % 2)]


def test_by_field_one_client_per_value_keeps_each_value_on_its_own_client() -> None:
    records = _speakers(4)
    cfg = PartitionConfig(scheme="by_field", field="speaker")
    parts = partition(records, 4, cfg, seed=0)
    # sorted values, one per client; every record placed once, in pool order
    assert [{records[i]["extra"]["speaker"] for i in p} for p in parts] == [
        {"spk00"}, {"spk01"}, {"spk02"}, {"spk03"}]
    assert sorted(i for p in parts for i in p) == list(range(len(records)))
    assert all(p == sorted(p) for p in parts)
    assert parts == partition(records, 4, cfg, seed=99)  # one per value: no randomness


def test_by_field_groups_values_into_k_clients_as_natural_id_partitioner() -> None:
    from fedkt.data.splits import field_groups

    records = _speakers(11)
    cfg = PartitionConfig(scheme="by_field", field="speaker")
    groups = field_groups(records, 3, "speaker", seed=5)
    assert sorted(len(g) for g in groups) == [3, 4, 4]  # 11 values, sizes differ by <= 1
    assert sorted(v for g in groups for v in g) == [f"spk{s:02d}" for s in range(11)]
    parts = partition(records, 3, cfg, seed=5)
    for group, part in zip(groups, parts, strict=True):
        assert {records[i]["extra"]["speaker"] for i in part} == set(group)
    assert parts == partition(records, 3, cfg, seed=5)
    assert field_groups(records, 3, "speaker", seed=6) != groups  # the seed deals them


def test_by_field_on_a_vendored_set_with_a_natural_key() -> None:
    """DialogSum's ``topic`` (kept in extra): no topic is split across clients."""
    data = client_splits(
        DataConfig(dataset=DatasetConfig(name="dialogsum"), split=SplitConfig(test_size=100),
                   partition=PartitionConfig(scheme="by_field", field="topic")),
        num_clients=5, seed=1)
    topics = [{r["extra"]["topic"] for r in p} for p in data.private]
    assert all(topics)
    for a in range(5):
        for b in range(a + 1, 5):
            assert not topics[a] & topics[b]
    assert sum(len(p) for p in data.private) == 1500 - 100


def test_by_field_errors_name_the_field() -> None:
    records = _speakers(2)
    with pytest.raises(DataError, match="'speaker' has 2 distinct value.*num_clients=3"):
        partition(records, 3, PartitionConfig(scheme="by_field", field="speaker"), seed=0)
    with pytest.raises(DataError, match="record '0-0' has no field 'user'"):
        partition(records, 2, PartitionConfig(scheme="by_field", field="user"), seed=0)
    with pytest.raises(DataError, match=r"client\(s\) \[0\].*min_size=4"):
        partition(records, 2, PartitionConfig(scheme="by_field", field="speaker",
                                              min_size=4), seed=0)
    with pytest.raises(ValueError, match="field: scheme by_field needs"):
        PartitionConfig(scheme="by_field")
    with pytest.raises(ValueError, match="only scheme by_field reads it"):
        PartitionConfig(scheme="iid", field="speaker")


def test_by_field_label_gives_one_class_per_client() -> None:
    records = _speakers(3)
    parts = partition(records, 2, PartitionConfig(scheme="by_field", field="label"), seed=0)
    assert [{records[i]["label"] for i in p} for p in parts] == [{0}, {1}]
