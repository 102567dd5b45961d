"""The commands that made a suite folder: each ``fedkt suite run`` of it appends its
command line and when it began (UTC) to ``invocations.jsonl``, ``fedkt suite keep``
carries them into the kept folder, and ``fedkt suite report`` names them in suite.md and
suite.json (``commands``), which docs/results.md reads where a published folder's comment
states no command."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["INVOCATIONS_FILE", "check_commands", "commands_text", "keep_invocations",
           "read_invocations", "record_invocation"]

#: One JSON object a line: ``{"command": "fedkt suite run ...", "started": ISO 8601 UTC}``.
INVOCATIONS_FILE = "invocations.jsonl"


def record_invocation(folder: Path, command: str) -> dict[str, str]:
    """Append ``command`` and the time now to ``folder``'s record; returns the entry."""
    entry = {"command": command, "started": datetime.now(UTC).isoformat(timespec="seconds")}
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / INVOCATIONS_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")
    return entry


def read_invocations(folder: Path) -> list[dict[str, str]]:
    """``folder``'s recorded commands in the order they ran (none where it has no record);
    a line that is not an entry is a ``ValueError`` naming the file and line."""
    path = folder / INVOCATIONS_FILE
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {n}: not JSON ({exc.msg})") from None
        check_commands([entry], f"{path}: line {n}")
        out.append({"command": entry["command"], "started": entry["started"]})
    return out


def check_commands(entries: Any, where: str) -> None:
    """Refuse entries (suite.json's ``commands``, a record's lines) that are not
    ``{"command": text, "started": ISO 8601 time}``, naming ``where`` and the field."""
    if not isinstance(entries, list):
        raise ValueError(f"{where}: expected a list, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        at = where if len(entries) == 1 else f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: expected a mapping, got {type(entry).__name__}")
        for key in ("command", "started"):
            if not isinstance(entry.get(key), str):
                raise ValueError(f"{at}.{key}: expected str, got "
                                 f"{type(entry.get(key)).__name__}")
        try:
            datetime.fromisoformat(entry["started"])
        except ValueError:
            raise ValueError(f"{at}.started: not an ISO 8601 time: {entry['started']!r}"
                             ) from None


def keep_invocations(source: Path, dest: Path) -> None:
    """Add ``source``'s recorded commands that ``dest`` lacks to ``dest``'s record, in the
    order they began."""
    kept = read_invocations(dest)
    new = [e for e in read_invocations(source) if e not in kept]
    if not new:
        return
    merged = sorted(kept + new, key=lambda e: datetime.fromisoformat(e["started"]))
    dest.mkdir(parents=True, exist_ok=True)
    (dest / INVOCATIONS_FILE).write_text("".join(json.dumps(e) + "\n" for e in merged))


def commands_text(entries: list[dict[str, str]]) -> str:
    """The distinct commands, in the order first run, each with when it first began:
    ```fedkt suite run ...`` (2026-12-05 12:39:21 UTC)``, joined by ``; then``."""
    first: dict[str, str] = {}
    for e in entries:
        first.setdefault(e["command"], e["started"])
    return "; then ".join(
        f"`{cmd}` ({datetime.fromisoformat(at).astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)"
        for cmd, at in first.items())
