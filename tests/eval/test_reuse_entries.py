"""Reuse entries are checked before use (fedkt.eval.reuse): an entry of the eval store that is
corrupt (a flipped byte, no ``tables``, ``seconds`` that is no number, a NaN metric) or
that was planted (its content and key do not match its recorded hash) is recomputed with
a warning naming the file, never a crash and never a result that the model did not give.
The same for the knowledge store (top-K logits, posteriors)."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from fedkt.eval import reuse
from tests.conftest import run_data_of
from tests.eval.test_reuse import cfg_records


def _entry(reuse_store: Path) -> Path:
    (entry,) = (reuse_store / "eval").glob("*.json.gz")
    return entry


def _edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads(gzip.decompress(path.read_bytes()))
        edit(data)
        path.write_bytes(gzip.compress(json.dumps(data).encode(), mtime=0))

    return damage


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _planted(data: dict) -> None:
    data["metrics"] = {k: (0.999 if "accuracy" in k else v) for k, v in data["metrics"].items()}


DAMAGE = {
    "flipped_byte": _flip_byte,
    "no_tables": _edit(lambda d: d.pop("tables")),
    "seconds_text": _edit(lambda d: d.update(seconds="abc")),
    "nan_metric": _edit(lambda d: d["metrics"].update(accuracy=float("nan"))),
    "tables_not_a_mapping": _edit(lambda d: d.update(tables=[1, 2])),
    "planted_metrics": _edit(_planted),
    "no_hash": _edit(lambda d: d.pop("check", None)),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_or_planted_entry_is_recomputed_with_a_warning(make_config, reuse_store,
                                                                 caplog, case):
    from fedkt.train.lm import client_lm, evaluate_lm

    cfg = make_config()
    lm = client_lm(cfg, 0)
    test = cfg_records(cfg)[:4]
    first = evaluate_lm(cfg, lm, test, data=run_data_of(cfg))
    entry = _entry(reuse_store)
    DAMAGE[case](entry)
    before = reuse.stats()
    with caplog.at_level(logging.WARNING, logger="fedkt"):
        assert evaluate_lm(cfg, lm, test, data=run_data_of(cfg)) == first
    assert reuse.stats()["computed"] == before["computed"] + 1
    assert any(str(entry) in r.getMessage() and "recomput" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING), caplog.text
    assert json.loads(gzip.decompress(entry.read_bytes()))["metrics"] == first  # replaced
    caplog.clear()
    again = reuse.stats()
    assert evaluate_lm(cfg, lm, test, data=run_data_of(cfg)) == first  # the replacement is reused, silently
    assert reuse.stats()["reused"] == again["reused"] + 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_damaged_knowledge_entry_is_recomputed_with_a_warning(reuse_store, caplog):
    import torch

    calls = []

    def compute() -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"logits": torch.arange(12, dtype=torch.float32).reshape(3, 4)}

    first = reuse.tensors(True, "topk", None, None, {"set": "x"}, compute)
    (entry,) = (reuse_store / "knowledge").glob("*.safetensors")
    data = bytearray(entry.read_bytes())
    data[-4:] = b"\x00\x00\xc0\x7f"  # the last float becomes NaN: still a valid file
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="fedkt"):
        got = reuse.tensors(True, "topk", None, None, {"set": "x"}, compute)
    assert len(calls) == 2 and torch.equal(got["logits"], first["logits"])
    assert any(str(entry) in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING), caplog.text
