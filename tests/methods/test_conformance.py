"""Conformance: every registered method, on the tiny config it declares, for two rounds.

Each method's uploads stay within its declaration, payload inspection is clean and a run
resumed after a crash in round 2 equals the uninterrupted one (:mod:`tests.conformance`).
A new method is checked by registering it (``tests/methods/test_new_method.py`` runs these
checks on a copied package); nothing here lists methods.
"""

from __future__ import annotations

import pytest
import torch

from fedkt.methods import available
from tests.conformance import conformance

# Minutes of tiny encoder runs that other tests already cover: checked with -m slow.
SLOW = {"standalone_encoder", "centralized_encoder"}


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m
                                  for m in available()])
def test_method_conforms(name):
    conformance(name)


def test_a_reply_beyond_its_declaration_is_caught(tmp_path):
    """The declaration check is not vacuous: an undeclared field or a wrong kind fails."""
    from fedkt.methods.uploads import ADAPTER, NUMBER, undeclared

    uploads = {"train": {"adapter": ADAPTER, "num_examples": NUMBER}}
    lora = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.zeros(2, 2)}
    assert undeclared(uploads, "train", {"adapter": lora, "num_examples": 3, "metrics": {}}) \
        == []
    assert undeclared(uploads, "train", {"adapter": lora, "num_layers": 2}) == [
        "'train' field 'num_layers' is not declared"]
    got = undeclared(uploads, "train", {"adapter": {"model.norm.weight": torch.ones(2)}})
    assert got and "outside the declaration" in got[0]
    assert "finite number" in undeclared(uploads, "train", {"num_examples": True})[0]
    assert undeclared(uploads, "evaluate", {}) == ["handler 'evaluate' has no declaration"]
