"""Smoke version of the shipped heterogeneous FedMKT suite on the real checkpoints.

Server Qwen2.5-0.5B, clients SmolLM2-135M and Gemma-3-270M (three tokenizers), the
label-free, class-disjoint FedMKT arm and the labelled one (top-K logits projected across
the three vocabularies), one round, a few records: the full suite
(fedkt/configs/suites/fedmkt_hetero.yaml) is documented in docs/records/fedmkt.md.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from fedkt.config import load_config
from fedkt.eval.predictions import prediction_files, read_predictions
from tests.conftest import needs_models, run_data_of
from tests.suites.smoke import run_suite, shipped_suite

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600),
              needs_models("qwen2.5-0.5b", "smollm2-135m", "gemma3-270m")]

PARTICIPANTS = ("server", "client_0", "client_1")


def _smoke_suite() -> dict[str, Any]:
    """The shipped suite's label-free FedMKT arm (with round 0) and its labelled arm, one
    seed, one round, a few records."""
    suite = shipped_suite("fedmkt_hetero", ("fedmkt", "fedmkt_labelled"))
    suite["baseline"] = "fedmkt"
    base = suite["base"]
    base["data"]["split"].update(test_size=14, server_size=16)
    base["data"]["max_private_per_client"] = 6
    base["data"]["max_public"] = 6
    base["training"]["local_epochs"] = 1
    for arm in ("fedmkt", "fedmkt_labelled"):
        suite["arms"][arm]["method"].update(server_kd_epochs=1, client_kd_epochs=1)
    return suite


def test_fedmkt_hetero_suite_smoke(tmp_path):
    suite = _smoke_suite()
    folder, result = run_suite(suite, tmp_path)
    run = folder / "fedmkt" / "seed_0"
    cfg = load_config(run / "config.yaml")
    # three model families, each with its own tokenizer
    assert [cfg.server.name, *(m.name for m in cfg.clients.models)] == [
        "qwen2.5-0.5b", "smollm2-135m", "gemma3-270m"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Per-group accuracy (srv: intents 0-2, cli: 3-6) for every participant, zero-shot
    # and after the round, and in the suite's table.
    for rnd in (0, 1):
        for who in PARTICIPANTS:
            (row,) = [r for r in rows if (r["round"], r["participant"], r["split"])
                      == (rnd, who, "test")]
            for key in ("accuracy", "accuracy_srv", "accuracy_cli"):
                assert 0.0 <= row[key] <= 1.0, (rnd, who, key, row)
    arms = {row["arm"] for row in result["table"]}
    assert arms == {"round 0 (fedmkt@0)", "fedmkt", "fedmkt_labelled"}
    # Both clients' posteriors passed the server's validation (shape [N, 7], rows
    # summing to 1): none rejected, and the LLM's selection saw both.
    (server,) = [r for r in rows if (r["round"], r["participant"], r["split"])
                 == (1, "server", "train")]
    assert server["rejected_clients"] == 0, server
    assert 0.0 <= server["kd_from_clients"] <= 1.0
    for cid in (0, 1):
        (client,) = [r for r in rows if (r["round"], r["participant"], r["split"])
                     == (1, f"client_{cid}", "train")]
        assert 0.0 <= client["kd_from_server"] <= 1.0, client
    # The labelled arm projects top-K logits across the real vocabularies, both ways: the
    # server received both clients' sets (each id inside the sender's vocabulary, each
    # sample as long as the public sample in the sender's tokens) and mapped them into
    # Qwen's tokens; each client mapped S_0 into its own.
    lab = [json.loads(line) for line in
           (folder / "fedmkt_labelled" / "seed_0" / "metrics.jsonl").read_text().splitlines()]
    train = {r["participant"]: r for r in lab if r["split"] == "train" and r["round"] == 1}
    assert train["server"]["rejected_clients"] == 0, train["server"]
    assert train["server"]["topk_entries"] > 0
    for who in PARTICIPANTS:
        row = train[who]
        assert 0.0 <= row.get("kd_from_clients", row.get("kd_from_server")) <= 1.0, row
        assert 0.0 <= row["kd_teacher_top1"] <= 1.0, row
        # with other tokenizers some positions have no teacher position (one-hot there)
        assert 0.0 <= row["kd_one_hot"] < 1.0, row
    # The knowledge each family sends is the posterior its evaluation scores: the
    # round-0 models' choice posteriors on the test records equal the softmax of the
    # per-choice log-likelihoods the zero-shot evaluation wrote, and they are
    # distributions (non-negative rows summing to 1) over the 7 intents.
    from fedkt.alignment.choices import choice_knowledge
    from fedkt.data.splits import run_data
    from fedkt.train.lm import client_lm, server_lm

    test = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).test
    files = prediction_files(run)
    for who, lm in (("server", lambda: server_lm(cfg)), ("client_0", lambda: client_lm(cfg, 0)),
                    ("client_1", lambda: client_lm(cfg, 1))):
        post = choice_knowledge(cfg, lm(), test, data=run_data_of(cfg))
        assert post.shape == (len(test), 7), (who, post.shape)
        assert bool((post >= 0).all()) and math.isclose(float(post.sum(-1).min()), 1.0,
                                                         abs_tol=1e-4), who
        assert float(post.sum(-1).max()) <= 1.0 + 1e-4, who
        table = read_predictions(files[(0, who, "")])
        scores = torch.tensor(table.columns["scores"], dtype=torch.float64)
        written = scores.softmax(-1)
        assert table.ids == [str(r.get("id", i)) for i, r in enumerate(test)], who
        # the scores were written with 4 decimals: posteriors agree to that rounding
        assert float((post.double() - written).abs().max()) < 2e-3, who
        assert post.argmax(-1).tolist() == table.columns["pred"], who
