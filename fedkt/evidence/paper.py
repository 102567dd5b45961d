"""A paper's published numbers beside a suite's own: a suite that runs a paper's table at
reduced scale names the table and the rows it sets its numbers beside.

    paper:
      source: "FedCoLLM (Fan et al.), Table 1, ARC-E, S1: GPT-2-Large server, GPT-2-Small clients"
      scale: "SmolLM2-135M server, its first 8 layers as the SLM; 4 clients; 1 round"
      rows:                        # the paper's value in fedkt's units (accuracy: a fraction)
        - {row: "server, Zero-Shot", paper: 0.532, fedkt: fedcollm@0.server.accuracy}
        - {row: "server, FedCoLLM", paper: 0.595, fedkt: fedcollm.server.accuracy}

``fedkt`` is a claim's side, ``ARM[@ROUND].GROUP.METRIC``.  The rows decide nothing: the
paper's models, data and scale are not the suite's, so its verdicts stay with its claims.
``suite.md`` shows each row's paper value beside the suite's mean ± std over its runs, and
``suite.json`` keeps them under ``paper``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator

from fedkt.config import _Strict
from fedkt.evidence.claims import Ref, is_ref
from fedkt.tracking.tables import format_table


class PaperRow(_Strict):
    """One of the paper's numbers and the suite's value it stands beside."""

    row: str = Field(..., min_length=1)
    paper: float
    fedkt: str

    @field_validator("paper")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return value

    @field_validator("fedkt")
    @classmethod
    def _ref(cls, text: str) -> str:
        if not is_ref(text):
            raise ValueError(f"{text!r}: write ARM[@ROUND].GROUP.METRIC, e.g. "
                             "'fedcollm@0.server.accuracy'")
        return text


class PaperReference(_Strict):
    """The table a suite runs at reduced scale (``paper:`` of a suite file)."""

    source: str = Field(..., min_length=1)
    scale: str | None = None
    rows: list[PaperRow] = Field(..., min_length=1)


def check_paper(paper: PaperReference, arms: set[str], groups: list[str]) -> None:
    """Refuse a row that names an arm the suite lacks or a group its table does not show."""
    for i, row in enumerate(paper.rows):
        ref = Ref.parse(row.fedkt)
        if ref.arm not in arms:
            raise ValueError(f"paper.rows[{i}] ({row.row!r}): arm {ref.arm!r} is not an arm "
                             f"of the suite ({sorted(arms)})")
        if ref.group not in groups:
            raise ValueError(f"paper.rows[{i}] ({row.row!r}): group {ref.group!r} is not one "
                             f"of the suite's groups ({groups})")


Value = Callable[[Ref], tuple[float, float, int] | None]  # mean, std, runs


def paper_result(paper: PaperReference, value: Value) -> dict[str, Any]:
    """suite.json's ``paper``: the source, the scale and each row with the suite's mean,
    std and run count (None where no run has it)."""
    rows = []
    for row in paper.rows:
        got = value(Ref.parse(row.fedkt))
        mean, std, n = got if got is not None else (None, None, 0)
        rows.append({"row": row.row, "paper": row.paper, "fedkt_ref": row.fedkt,
                     "mean": mean, "std": std, "runs": n,
                     "difference": None if mean is None else mean - row.paper})
    return {"source": paper.source, "scale": paper.scale, "rows": rows}


def paper_markdown(result: dict[str, Any]) -> str:
    """The section of ``suite.md`` (and docs/results.md) that sets a :func:`paper_result`'s
    rows side by side."""
    lines = [f"The paper: {result.get('source') or '-'}."]
    if result.get("scale"):
        lines.append(f"fedkt's scale: {result['scale']}.")
    lines += ["The paper's models, data and scale are not the suite's: these rows set the "
              "numbers side by side and decide nothing (the claims above do).", ""]
    table = [[r["row"], f"`{r['fedkt_ref']}`", f"{r['paper']:.3f}",
              "-" if r["mean"] is None else f"{r['mean']:.3f} ± {r['std']:.3f} ({r['runs']})",
              "-" if r["difference"] is None else f"{r['difference']:+.3f}"] for r in result["rows"]]
    lines.append(format_table(["the paper's row", "fedkt", "paper", "fedkt: mean ± std (runs)",
                               "fedkt − paper"], table, markdown=True))
    return "\n".join(lines)
