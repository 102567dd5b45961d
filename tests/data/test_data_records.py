"""Loading built-in and user datasets into validated records."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from fedkt.config import DatasetConfig
from fedkt.data import DataError, list_builtin, load_dataset_records

EXPECTED = {
    # name: (task, records, number of label names or None)
    "dialogsum": ("generation", 1500, None),
    "dialogsum:test": ("generation", 200, None),
    "social_iqa": ("multiple_choice", 1954, None),
    "arc_easy": ("multiple_choice", 2251, None),
    "arc_easy:dev": ("multiple_choice", 570, None),
    "arc_easy:test": ("multiple_choice", 2376, None),
    "arc_challenge": ("multiple_choice", 1119, None),
    "arc_challenge:dev": ("multiple_choice", 299, None),
    "arc_challenge:test": ("multiple_choice", 1170, None),
    "commonsense_qa": ("multiple_choice", 9741, None),
    "commonsense_qa:dev": ("multiple_choice", 1221, None),
    "intent_recognition": ("classification", 693, 7),
    "banking77": ("classification", 10003, 77),
    "banking77:test": ("classification", 3080, 77),
    "clinc150": ("classification", 22500, 150),
    "tweeteval_hate": ("classification", 3000, 2),
    "tweeteval_hate:val": ("classification", 999, 2),
    "tweeteval_hate:test": ("classification", 1500, 2),
    "tweeteval_offensive": ("classification", 3000, 2),
    "tweeteval_offensive:val": ("classification", 1324, 2),
    "tweeteval_offensive:test": ("classification", 860, 2),
}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_list_builtin_names_every_dataset() -> None:
    names = list_builtin()
    assert set(names) == {n.split(":")[0] for n in EXPECTED}
    assert all(isinstance(d, str) and d for d in names.values())
    assert "dialogsum:test" in names["dialogsum"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_loads_valid_records(name: str) -> None:
    task, count, n_labels = EXPECTED[name]
    ds = load_dataset_records(DatasetConfig(name=name))
    assert ds.task == task
    assert len(ds.records) == count
    assert len({r["id"] for r in ds.records}) == count
    if n_labels is None:
        assert ds.label_names is None
    else:
        assert ds.label_names is not None and len(ds.label_names) == n_labels
    for r in ds.records:
        if task == "classification":
            assert isinstance(r["text"], str) and r["text"] == r["text"].strip() and r["text"]
            assert 0 <= r["label"] < n_labels
        elif task == "multiple_choice":
            assert r["prompt"] and len(r["choices"]) >= 2
            assert 0 <= r["label"] < len(r["choices"])
        else:
            assert r["prompt"] and r["target"]
    if task != "generation":
        # Every class (or answer position of the usual number of choices) occurs.
        labels = {r["label"] for r in ds.records}
        sizes = Counter(len(r.get("choices", ())) for r in ds.records)
        assert set(range(n_labels or sizes.most_common(1)[0][0])) <= labels


def test_builtin_specifics() -> None:
    test = load_dataset_records(DatasetConfig(name="dialogsum:test"))
    assert all(len(r["references"]) == 3 for r in test.records)
    assert all(r["target"] == r["references"][0] for r in test.records)
    assert test.template is not None and "Summary:" in test.template
    train = load_dataset_records(DatasetConfig(name="dialogsum"))
    assert "references" not in train.records[0]
    assert train.records[0]["extra"]["topic"]
    intent = load_dataset_records(DatasetConfig(name="intent_recognition"))
    assert not any(r["text"].startswith("Utterance") for r in intent.records)
    assert intent.label_names[0] == "add_to_playlist"
    hate = load_dataset_records(DatasetConfig(name="tweeteval_hate"))
    assert hate.label_names == ["not-hate", "hate"]


def test_unknown_builtin_lists_allowed_names() -> None:
    with pytest.raises(DataError, match="unknown built-in dataset 'squad'") as info:
        load_dataset_records(DatasetConfig(name="squad"))
    assert "social_iqa" in str(info.value) and "tweeteval_hate" in str(info.value)
    with pytest.raises(DataError, match="no split 'dev'; splits: train, test"):
        load_dataset_records(DatasetConfig(name="dialogsum:dev"))


def test_builtin_rejects_wrong_task_and_fields() -> None:
    with pytest.raises(DataError, match="is a multiple_choice task"):
        load_dataset_records(DatasetConfig(name="social_iqa", task="generation"))
    with pytest.raises(DataError, match="fixed fields"):
        load_dataset_records(DatasetConfig(name="social_iqa", fields={"prompt": "q"}))


def test_builtin_label_names_can_be_renamed() -> None:
    ds = load_dataset_records(DatasetConfig(name="tweeteval_hate", label_names=["no", "yes"]))
    assert ds.label_names == ["no", "yes"]
    with pytest.raises(DataError, match="has 2 classes"):
        load_dataset_records(DatasetConfig(name="tweeteval_hate", label_names=["a", "b", "c"]))


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match=f"data file not found: {missing}"):
        load_dataset_records(DatasetConfig(path=str(missing), task="classification"))


def test_local_requires_task(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": 0}])
    with pytest.raises(DataError, match="task is required"):
        load_dataset_records(DatasetConfig(path=str(path)))


def test_jsonl_custom_fields_and_error_naming_record(tmp_path: Path) -> None:
    rows = [{"tweet": f"tweet number {i}", "y": i % 3, "lang": "en"} for i in range(20)]
    path = _write_jsonl(tmp_path / "tweets.jsonl", rows)
    cfg = DatasetConfig(
        path=str(path),
        task="classification",
        fields={"text": "tweet", "label": "y"},
        label_names=["neg", "neu", "pos"],
    )
    ds = load_dataset_records(cfg)
    assert [r["text"] for r in ds.records] == [r["tweet"] for r in rows]
    assert [r["label"] for r in ds.records] == [r["y"] for r in rows]
    assert ds.records[0]["extra"] == {"lang": "en"}
    assert ds.label_names == ["neg", "neu", "pos"]

    rows[16] = {"body": "oops", "y": 1}
    _write_jsonl(path, rows)
    with pytest.raises(DataError) as info:
        load_dataset_records(cfg)
    msg = str(info.value)
    assert f"{path} record 17 (line 17)" in msg
    assert "missing field 'tweet' (mapped from 'text')" in msg
    assert "fields present: ['body', 'y']" in msg


def test_unmapped_missing_field_suggests_mapping(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"sentence": "hi", "label": 0}])
    with pytest.raises(DataError, match=r"record 1 \(line 1\): missing field 'text'; .*fields: "):
        load_dataset_records(DatasetConfig(path=str(path), task="classification"))


@pytest.mark.parametrize(
    ("task", "row", "extra_cfg", "pattern"),
    [
        (
            "classification",
            {"text": "a", "label": 5},
            {"label_names": ["x", "y"]},
            r"label 'label' = 5 is out of range for 2 label_names",
        ),
        ("classification", {"text": "a", "label": -1}, {}, "is negative"),
        ("classification", {"text": "a", "label": 1.5}, {}, "is not an integer"),
        (
            "classification",
            {"text": "a", "label": "pos"},
            {},
            "is not an integer: 'pos'; give label_names",
        ),
        ("classification", {"text": "", "label": 0}, {}, "field 'text' is empty"),
        ("classification", {"text": 7, "label": 0}, {}, "field 'text' must be a string"),
        (
            "multiple_choice",
            {"prompt": "q", "choices": [], "label": 0},
            {},
            "field 'choices' is an empty list",
        ),
        (
            "multiple_choice",
            {"prompt": "q", "choices": ["a", "b"], "label": 2},
            {},
            "= 2 is out of range for 2 choices",
        ),
        (
            "multiple_choice",
            {"prompt": "q", "choices": "a b", "label": 0},
            {},
            "field 'choices' must be a list",
        ),
        ("generation", {"prompt": "p"}, {}, "missing field 'target'"),
    ],
)
def test_invalid_records_are_rejected(
    tmp_path: Path, task: str, row: dict, extra_cfg: dict, pattern: str
) -> None:
    good = {
        "classification": {"text": "fine", "label": 0},
        "multiple_choice": {"prompt": "q", "choices": ["a", "b"], "label": 1},
        "generation": {"prompt": "p", "target": "t"},
    }[task]
    path = _write_jsonl(tmp_path / "d.jsonl", [good, good, row])
    with pytest.raises(DataError, match=pattern) as info:
        load_dataset_records(DatasetConfig(path=str(path), task=task, **extra_cfg))
    assert f"{path} record 3 (line 3)" in str(info.value)


def test_invalid_json_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 0}\n{"text": "b", \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"record 2 \(line 2\): not valid JSON"):
        load_dataset_records(DatasetConfig(path=str(path), task="classification"))


def test_csv_custom_fields(tmp_path: Path) -> None:
    path = tmp_path / "quiz.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["question", "A", "B", "C", "answer"])
        w.writerow(["Sky colour?", "blue", "green", "red", "0"])
        w.writerow(["Grass colour?", "blue", "green", "red", "green"])  # answer by text
        w.writerow(["2+2?", "3", "4", "5", "1"])
    cfg = DatasetConfig(
        path=str(path),
        task="multiple_choice",
        fields={"prompt": "question", "choices": "A,B,C", "label": "answer"},
    )
    ds = load_dataset_records(cfg)
    assert [r["label"] for r in ds.records] == [0, 1, 1]
    assert ds.records[1]["choices"] == ["blue", "green", "red"]
    assert ds.records[2]["prompt"] == "2+2?"

    # Classification with string label names in a CSV, and a bad row.
    path2 = tmp_path / "sent.csv"
    path2.write_text("review,stars\ngood film,pos\nbad film,neg\nmeh,neutral\n", encoding="utf-8")
    cfg2 = DatasetConfig(
        path=str(path2),
        task="classification",
        fields={"text": "review", "label": "stars"},
        label_names=["neg", "pos"],
    )
    with pytest.raises(DataError, match=r"record 3 \(line 4\): label 'stars' .*'neutral'"):
        load_dataset_records(cfg2)
    cfg3 = cfg2.model_copy(update={"label_names": ["neg", "pos", "neutral"]})
    assert [r["label"] for r in load_dataset_records(cfg3).records] == [1, 0, 2]


def test_json_list_and_generation_references(tmp_path: Path) -> None:
    rows = [
        {"doc": f"document {i}", "sum": f"summary {i}", "alt": [f"s{i}", f"t{i}"]} for i in range(5)
    ]
    path = tmp_path / "gen.json"
    path.write_text(json.dumps({"data": rows}), encoding="utf-8")
    cfg = DatasetConfig(
        path=str(path),
        task="generation",
        fields={"prompt": "doc", "target": "sum", "references": "alt"},
    )
    ds = load_dataset_records(cfg)
    assert ds.records[3] == {
        "id": "gen:3",
        "prompt": "document 3",
        "target": "summary 3",
        "references": ["s3", "t3"],
    }


def test_folder_with_split_files(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 1}])
    _write_jsonl(tmp_path / "test.jsonl", [{"text": "c", "label": 1}])
    ds = load_dataset_records(DatasetConfig(path=str(tmp_path), task="classification"))
    assert [r["text"] for r in ds.records] == ["a", "b"]
    assert ds.label_names == ["0", "1"]
    ds = load_dataset_records(
        DatasetConfig(path=str(tmp_path), task="classification", hf_split="test")
    )
    assert [r["text"] for r in ds.records] == ["c"]


def test_max_records_truncates_deterministically() -> None:
    full = load_dataset_records(DatasetConfig(name="social_iqa"))
    cut = load_dataset_records(DatasetConfig(name="social_iqa", max_records=25))
    assert [r["id"] for r in cut.records] == [r["id"] for r in full.records[:25]]


def test_cache_returns_copies_and_sees_file_changes(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": 0}])
    cfg = DatasetConfig(path=str(path), task="classification")
    first = load_dataset_records(cfg)
    first.records[0]["text"] = "mutated"
    assert load_dataset_records(cfg).records[0]["text"] == "a"
    _write_jsonl(path, [{"text": "changed file", "label": 1}, {"text": "b", "label": 0}])
    assert load_dataset_records(cfg).records[0]["text"] == "changed file"


def test_template_checked_at_load(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "d.jsonl", [{"text": "hi", "label": 0, "lang": "en"}, {"text": "x", "label": 1}]
    )
    base = {"path": str(path), "task": "classification"}
    with pytest.raises(DataError, match=r"placeholder \{lang\} is not a field of record d:1"):
        load_dataset_records(DatasetConfig(**base, template="[{lang}] {text}\nLabel:"))
    ds = load_dataset_records(DatasetConfig(**base, template="{text} ({labels})\nLabel:"))
    assert ds.template == "{text} ({labels})\nLabel:"


def test_hf_datasets_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "y": datasets.ClassLabel(names=["bad", "good"])}
    )
    saved = datasets.Dataset.from_dict(
        {"sentence": ["great", "awful", "fine"], "y": [1, 0, 1]}, features=features
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    cfg = DatasetConfig(
        path=str(tmp_path / "saved"),
        task="classification",
        fields={"text": "sentence", "label": "y"},
    )
    ds = load_dataset_records(cfg)
    assert ds.label_names == ["bad", "good"]
    assert [(r["text"], r["label"]) for r in ds.records] == [
        ("great", 1),
        ("awful", 0),
        ("fine", 1),
    ]

    # ``hf_name`` goes through datasets.load_dataset; a local folder needs no network.
    folder = tmp_path / "hf_local"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", [{"q": "why?", "a": "because"}, {"q": "how?", "a": "so"}])
    ds = load_dataset_records(
        DatasetConfig(hf_name=str(folder), task="generation", fields={"prompt": "q", "target": "a"})
    )
    assert [r["target"] for r in ds.records] == ["because", "so"]
