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


def test_the_train_loss_check_catches_a_server_objective():
    """The server row's train ``loss`` must be the clients' mean: the old FedMKT/KOALA row
    (the server's own objective under ``loss``) fails, an excluded client is left out, a
    method without client handlers (centralized) keeps its model's own loss."""
    from tests.conformance import check_train_loss

    def rows(server_loss: float) -> list[dict]:
        return [{"round": 0, "participant": "server", "split": "test", "loss": 9.0},
                {"round": 1, "participant": "server", "split": "train", "loss": server_loss},
                {"round": 1, "participant": "client_0", "split": "train", "loss": 1.0},
                {"round": 1, "participant": "client_1", "split": "train", "loss": 3.0},
                {"round": 1, "participant": "client_2", "split": "train", "loss": 7.0,
                 "excluded": "TimeoutError: no reply within 1 s"}]

    check_train_loss("ok", rows(2.0))
    with pytest.raises(AssertionError, match="not the clients' mean"):
        check_train_loss("own objective", rows(0.5))
    alone = [{"round": 1, "participant": "server", "split": "train", "loss": 0.5}]
    check_train_loss("centralized", alone, trains_clients=False)
    with pytest.raises(AssertionError, match="no client row has one"):
        check_train_loss("no clients", alone)
