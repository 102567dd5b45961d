"""Adding a data reader: ``register_reader(suffix, fn)`` outside fedkt, and a dataset in a
file (or a folder of split files) with that suffix loads through it like a built-in
format; before, the file is refused with the registered suffixes listed."""

from __future__ import annotations

import importlib

import pytest

from fedkt.config import DatasetConfig
from fedkt.data import DataError, load_dataset_records, register_reader, registered_suffixes
from fedkt.data import readers as R
from fedkt.data.records import clear_cache

ROWS = [("play some jazz", "1"), ("what's the weather", "0"), ("add milk to my list", "2")]


@pytest.fixture
def tsv(monkeypatch, tmp_path):
    """A TSV file and the plugin's reader, registered for this test only."""
    monkeypatch.setattr(R, "_READERS", dict(R._READERS))
    plugin = importlib.import_module("tests.support.plugin_reader")
    R._READERS.pop(".tsv", None)  # as before the plugin's import
    path = tmp_path / "train.tsv"
    path.write_text("utterance\tintent\n" + "".join(f"{t}\t{y}\n" for t, y in ROWS))
    yield plugin, path
    clear_cache()


def config(path) -> DatasetConfig:
    return DatasetConfig(path=str(path), task="classification",
                         fields={"text": "utterance", "label": "intent"},
                         label_names=["weather", "music", "shopping"])


def test_a_reader_registered_outside_fedkt_loads_a_dataset(tsv):
    plugin, path = tsv
    with pytest.raises(DataError, match=r"train\.tsv: unsupported file type '\.tsv'; use "
                                        r"\.jsonl, \.json or \.csv \(register_reader"):
        load_dataset_records(config(path))
    with pytest.raises(DataError, match=r"without a 'train\.jsonl', 'train\.json' or "
                                        r"'train\.csv' file"):
        load_dataset_records(config(path.parent))

    plugin.install()
    assert registered_suffixes() == [".jsonl", ".json", ".csv", ".tsv"]
    for source in (path, path.parent):  # the file, or the folder's train split
        ds = load_dataset_records(config(source))
        assert [(r["text"], r["label"]) for r in ds.records] == [(t, int(y)) for t, y in ROWS]
        assert ds.label_names == ["weather", "music", "shopping"]
    with pytest.raises(DataError, match=r"\.xml: unsupported file type '\.xml'; use \.jsonl, "
                                        r"\.json, \.csv or \.tsv"):
        (path.parent / "d.xml").write_text("<a/>")
        load_dataset_records(config(path.parent / "d.xml"))


def test_a_registered_reader_is_checked_and_its_bad_rows_are_named(tsv, tmp_path):
    _, path = tsv
    with pytest.raises(ValueError, match="suffix 'tsv' must be a file suffix"):
        register_reader("tsv", lambda p: [])
    with pytest.raises(TypeError, match="fn must be a function"):
        register_reader(".tsv", "read_tsv")
    register_reader(".TSV", lambda p: [{"utterance": "hi", "intent": "0"}, ["not", "a", "row"]])
    with pytest.raises(DataError, match=r"train\.tsv record 2: expected an object with named "
                                        r"fields, got list"):
        load_dataset_records(config(path))
