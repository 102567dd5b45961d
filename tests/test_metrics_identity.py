"""benchmarks/metrics_identity.py: the comparison that decides "identical" for a refactor."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark


def _rows(server_train: dict, test_loss: float = 2.0) -> list[dict]:
    return [{"round": 1, "participant": "server", "split": "train", **server_train},
            {"round": 1, "participant": "client_0", "split": "test", "loss": test_loss}]


def test_a_moved_meaning_differs_until_it_is_renamed_and_only_on_the_server_train_row():
    mi = load_benchmark("metrics_identity")
    before = _rows({"loss": 0.5, "client_loss": 1.5, "bytes_sent": 10})
    after = _rows({"server_loss": 0.5, "loss": 1.5, "bytes_sent": 10})
    assert mi.compare(before, after).startswith("DIFFERS at row 0")
    swap = mi.renamed(before, {"loss": "server_loss", "client_loss": "loss"})
    assert mi.compare(swap, after) == "identical"
    assert swap[1]["loss"] == 2.0  # a client's test loss keeps its name
    # a mapping that lands on a kept key is refused, a changed value is still caught
    with pytest.raises(ValueError, match="become 'loss'"):
        mi.renamed(before, {"client_loss": "loss"})
    changed = _rows({"server_loss": 0.5, "loss": 1.25, "bytes_sent": 10})
    assert mi.compare(swap, changed).startswith("DIFFERS at row 0")


def test_a_dropped_key_and_a_byte_change_are_reported_as_such():
    mi = load_benchmark("metrics_identity")
    before = _rows({"loss": 0.7, "reverse_kl": 0.7, "client_loss": 1.5, "bytes_sent": 10})
    after = _rows({"reverse_kl": 0.7, "loss": 1.5, "bytes_sent": 9})
    kept = mi.renamed(before, {"loss": "", "client_loss": "loss"})
    assert mi.compare(kept, after) == "BYTES ONLY: server bytes_sent -1"
