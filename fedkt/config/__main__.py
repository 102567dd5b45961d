"""``python -m fedkt.config``: print docs/configuration.md; ``--write`` writes it."""

from __future__ import annotations

import sys
from pathlib import Path

from fedkt.config.reference import write_reference

if __name__ == "__main__":
    if "--write" in sys.argv:
        write_reference(Path(__file__).resolve().parents[2] / "docs" / "configuration.md")
    else:
        print(write_reference(), end="")
