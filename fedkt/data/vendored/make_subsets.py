"""Draw the vendored data subsets shipped with fedkt (one-off, reproducible).

Usage::

    python fedkt/data/vendored/make_subsets.py --src /path/to/data

``--src`` is a folder laid out like the project's shared data folder:
``dialogsum/{train,test}.jsonl``, ``tweeteval/<task>/{split}_{text,labels}.txt``,
``bigbench/{social_iqa,intent_recognition}.jsonl``, ``banking77/{train,test}.csv`` with
``categories.json``, ``clinc150/{data_full,domains}.json``, ``arc/ARC-{Easy,Challenge}/{train,dev,test}.jsonl`` and
``commonsenseqa/{train,dev}.jsonl`` (the last three whole; ARC's and CommonsenseQA's
``LICENSE.md`` notes are written by hand).  Samples are drawn with
``random.Random(SEED).sample`` over row indices; the kept rows stay in their original
order.  Tweets that are empty after stripping whitespace are dropped first.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
from pathlib import Path

SEED = 0
OUT = Path(__file__).resolve().parent

# name -> number of rows to keep (None: all)
DIALOGSUM = {"train": 1500, "test": 200}
TWEETEVAL = {
    "hate": {"train": 3000, "val": None, "test": 1500},
    "offensive": {"train": 3000, "val": None, "test": None},
}
BIGBENCH = ("social_iqa", "intent_recognition")
# (folder, split) copied whole; the same folder under --src and here
PAPER_TASKS = [*((f"arc/{s}", split) for s in ("ARC-Easy", "ARC-Challenge")
                 for split in ("train", "dev", "test")),
               ("commonsenseqa", "train"), ("commonsenseqa", "dev")]


def _sample(rows: list, k: int | None, tag: str) -> list:
    """Seeded sample of ``k`` rows, kept in their original order."""
    if k is None or k >= len(rows):
        return list(rows)
    rng = random.Random(f"{SEED}:{tag}")
    keep = sorted(rng.sample(range(len(rows)), k))
    return [rows[i] for i in keep]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{path.relative_to(OUT)}: {len(rows)} rows, {path.stat().st_size:,} bytes")


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _read_lines(path: Path) -> list[str]:
    # Split on "\n" only: tweets may contain other Unicode line separators.
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def make_dialogsum(src: Path) -> None:
    for split, k in DIALOGSUM.items():
        rows = _read_jsonl(src / "dialogsum" / f"{split}.jsonl")
        _write_jsonl(OUT / "dialogsum" / f"{split}.jsonl", _sample(rows, k, f"dialogsum/{split}"))
    shutil.copyfile(src / "dialogsum" / "LICENSE", OUT / "dialogsum" / "LICENSE")


def make_tweeteval(src: Path) -> None:
    for task, splits in TWEETEVAL.items():
        folder = src / "tweeteval" / task
        for split, k in splits.items():
            texts = _read_lines(folder / f"{split}_text.txt")
            labels = _read_lines(folder / f"{split}_labels.txt")
            if len(texts) != len(labels):
                raise SystemExit(f"{folder}/{split}: {len(texts)} texts but {len(labels)} labels")
            rows = [
                {"text": t, "label": int(lab)}
                for t, lab in zip(texts, labels, strict=True)
                if t.strip()
            ]
            _write_jsonl(
                OUT / "tweeteval" / task / f"{split}.jsonl",
                _sample(rows, k, f"tweeteval/{task}/{split}"),
            )
        shutil.copyfile(folder / "mapping.txt", OUT / "tweeteval" / task / "mapping.txt")
    shutil.copyfile(src / "tweeteval" / "README.txt", OUT / "tweeteval" / "README.txt")


def make_bigbench(src: Path) -> None:
    for task in BIGBENCH:
        rows = _read_jsonl(src / "bigbench" / f"{task}.jsonl")
        _write_jsonl(OUT / "bigbench" / task / "all.jsonl", rows)


def copy_paper_tasks(src: Path) -> None:
    """ARC and CommonsenseQA: every split whole, byte-for-byte copies."""
    for rel, split in PAPER_TASKS:
        (OUT / rel).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel / f"{split}.jsonl", OUT / rel / f"{split}.jsonl")


def make_banking77(src: Path) -> None:
    """All of Banking77: each CSV row ``text,category`` -> ``{"text", "label"}``, the label
    the category's index in ``categories.json`` (copied unchanged)."""
    folder = src / "banking77"
    categories = json.loads((folder / "categories.json").read_text(encoding="utf-8"))
    index = {name: i for i, name in enumerate(categories)}
    for split in ("train", "test"):
        with (folder / f"{split}.csv").open(encoding="utf-8", newline="") as fh:
            rows = [{"text": row["text"], "label": index[row["category"]]}
                    for row in csv.DictReader(fh)]
        _write_jsonl(OUT / "banking77" / f"{split}.jsonl", rows)
    for name in ("categories.json", "LICENSE"):
        shutil.copyfile(folder / name, OUT / "banking77" / name)


def make_clinc150(src: Path) -> None:
    """CLINC150's in-scope queries, all three splits: each row ``[text, intent]`` ->
    ``{"text", "label", "split"}``, the label the intent's index when the 10 domains of
    ``domains.json`` (copied unchanged) are read in order, 15 intents each; the
    out-of-scope rows are left out."""
    folder = src / "clinc150"
    domains = json.loads((folder / "domains.json").read_text(encoding="utf-8"))
    index = {name: i for i, name in enumerate(n for names in domains.values() for n in names)}
    full = json.loads((folder / "data_full.json").read_text(encoding="utf-8"))
    rows = [{"text": text, "label": index[intent], "split": split}
            for split in ("train", "val", "test") for text, intent in full[split]]
    _write_jsonl(OUT / "clinc150" / "all.jsonl", rows)
    for name in ("domains.json", "LICENSE"):
        shutil.copyfile(folder / name, OUT / "clinc150" / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", type=Path, default=Path("/work/shared/data"))
    args = parser.parse_args()
    make_dialogsum(args.src)
    make_tweeteval(args.src)
    make_bigbench(args.src)
    copy_paper_tasks(args.src)
    make_banking77(args.src)
    make_clinc150(args.src)


if __name__ == "__main__":
    main()
