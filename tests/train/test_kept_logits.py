"""The output layer run only at the positions a loss reads (fedkt.train.logits): the same
task loss and logits as the model's own forward over every position, the same training,
and the model's own forward wherever positions do not line up (prefix adapters)."""

from __future__ import annotations

import pytest
import torch

from fedkt.config import ModelConfig, TrainingConfig
from fedkt.data.lm_batches import IGNORE_INDEX
from fedkt.train.lm import get_lm, train_lm
from fedkt.train.logits import forward_kept, keeps_positions, kept_positions, target_mask
from tests.conftest import run_data_of


def _batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows whose targets sit at different positions (prompts of other
    lengths), as lm_batches makes them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    labels = torch.full_like(ids, IGNORE_INDEX)
    for row, (start, end) in enumerate([(4, 6), (7, 10), (5, 6)]):
        labels[row, start:end] = ids[row, start:end]
        attn[row, end:] = 0
        ids[row, end:] = 0
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_kept_logits_give_the_models_own_loss_and_logits(name):
    lm = get_lm(ModelConfig(name=name), TrainingConfig(peft="lora"), seed=0)
    assert keeps_positions(lm.model)
    batch = _batch(lm.model.get_input_embeddings().weight.shape[0])
    keep = kept_positions(target_mask(batch["labels"]))
    # the positions whose logits predict a target, in any row: 3-4, 6-8, 4
    assert keep.tolist() == [3, 4, 6, 7, 8]
    full = lm.model(**batch)
    out, logits = forward_kept(lm.model, batch, keep)
    assert logits.shape[:2] == (3, 5)
    torch.testing.assert_close(logits, full.logits[:, keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, full.loss, rtol=1e-6, atol=1e-6)
    # a target outside the kept positions would change the loss: the mask matters
    wrong, _ = forward_kept(lm.model, batch, keep[:-1])
    assert not torch.isclose(wrong.loss, full.loss)


def test_training_through_kept_logits_matches_full_logits(make_config, monkeypatch):
    """train_lm without an extra loss runs the output layer at the target positions; its
    adapter and loss are those of the full forward to float rounding."""
    import fedkt.train.lm as lm_module
    from fedkt.data.splits import run_data
    from fedkt.train.lm import client_lm

    cfg = make_config()
    records = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).private[0][:16]
    results = {}
    for kept in (True, False):
        monkeypatch.setattr(lm_module, "keeps_positions", lambda model, kept=kept: kept)
        lm = client_lm(cfg, 0)
        lm.reset(None)
        stats = train_lm(cfg, lm, records, seed=0, data=run_data_of(cfg))
        results[kept] = (stats, lm.trainable())
    (s_kept, w_kept), (s_full, w_full) = results[True], results[False]
    assert s_kept["steps"] == s_full["steps"] > 0
    assert abs(s_kept["loss"] - s_full["loss"]) < 1e-5 * abs(s_full["loss"])
    for key in w_full:
        torch.testing.assert_close(w_kept[key], w_full[key], rtol=1e-4, atol=1e-6)
    assert any(not torch.equal(w_full[k], client_lm(cfg, 0).initial[k]) for k in w_full)


def test_prefix_adapters_keep_the_models_own_forward():
    lm = get_lm(ModelConfig(name="tiny-llama"), TrainingConfig(peft="prefix"), seed=0)
    assert not keeps_positions(lm.model)


@pytest.mark.parametrize("positions", ["target", "all"])
def test_cotune_losses_through_kept_logits_match_full_logits(positions, monkeypatch):
    """FedCoLLM's co-tuning losses (CE of both models and both KL terms) are the same
    with the output layers at the kept positions as over every position."""
    import importlib

    from fedkt.methods.fedcollm.config import FedCoLLMConfig

    cotune = importlib.import_module("fedkt.methods.fedcollm.cotune")
    llm = get_lm(ModelConfig(name="tiny-llama", tiny={"hidden_size": 96, "num_layers": 3}),
                 TrainingConfig(peft="lora"), seed=0)
    slm = get_lm(ModelConfig(name="tiny-llama"), TrainingConfig(peft="lora"), seed=1)
    batch = _batch(slm.model.get_input_embeddings().weight.shape[0])
    method = FedCoLLMConfig(name="fedcollm", kd_positions=positions)
    got = {}
    for kept in (True, False):
        monkeypatch.setattr(cotune, "keeps_positions", lambda model, kept=kept: kept)
        parts = cotune.cotune_losses(llm.model, slm.model, batch, batch, method)
        got[kept] = torch.stack([parts.ft_llm, parts.ft_slm, parts.kd_llm, parts.kd_slm]).detach()
    torch.testing.assert_close(got[True], got[False], rtol=1e-5, atol=1e-6)
    assert bool((got[False][2:] > 0).all())
