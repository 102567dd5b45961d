"""A data reader defined outside fedkt, as a plugin would define one
(``tests/data/test_register_reader.py``): tab-separated files with a header row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedkt.data import register_reader

SUFFIX = ".tsv"


def read_tsv(path: Path) -> Iterator[dict[str, Any]]:
    """Each line after the header as a dict of its named columns."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    for line in lines[1:]:
        if line.strip():
            yield dict(zip(header, line.split("\t"), strict=True))


def install() -> None:
    """Register the reader (a plugin does this when it is imported)."""
    register_reader(SUFFIX, read_tsv)


install()
