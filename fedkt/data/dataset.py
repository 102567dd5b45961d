"""The records of one task, and the error bad data raises (shared by every loader)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DataError", "Dataset"]


class DataError(ValueError):
    """Data cannot be loaded or is invalid; the message names the file, record and field."""


@dataclass
class Dataset:
    """Normalised records of one task, with class names for classification."""

    name: str
    task: str
    records: list[dict[str, Any]]
    label_names: list[str] | None = None
    # Default prompt template (``{field}`` placeholders); None: the task's default prompt.
    template: str | None = None

    def __len__(self) -> int:
        return len(self.records)
