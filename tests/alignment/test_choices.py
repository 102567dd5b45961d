"""Choice knowledge (label-free posteriors over a task's choices): scoring, selection,
shuffling, the wire format and distillation, on real tiny models and SNIPS intents."""

from __future__ import annotations

import pytest
import torch

from fedkt.alignment import choices
from fedkt.data.splits import run_data
from fedkt.eval.scorer import score_choices
from fedkt.federated.payload import PayloadError, dumps
from fedkt.train.lm import client_lm
from tests.conftest import run_data_of

torch.set_num_threads(1)


@pytest.fixture
def setting(make_config):
    cfg = make_config("data.split={scheme: fedmkt, test_size: 16}", "data.max_public=10",
                      "clients.models=[{name: tiny-gpt2}]", "training.batch_size=4",
                      "training.lr=5e-3", "training.precision=fp32", method="fedavg")
    public = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).public
    return cfg, client_lm(cfg, 0), public


def test_training_posteriors_are_the_scorers(setting):
    """The differentiable log-posteriors a student trains on are the scorer's: the choice
    the student is trained towards is the one its accuracy counts."""
    cfg, lm, public = setting
    p = choices.choice_knowledge(cfg, lm, public, data=run_data_of(cfg))
    assert p.shape == (len(public), 7) and torch.allclose(p.sum(-1), torch.ones(len(public)))
    with torch.no_grad():
        encoded = choices.encode(cfg, lm.tokenizer, public, data=run_data_of(cfg))
        logq = choices.choice_logprobs(lm.model, encoded, lm.tokenizer.pad_token_id or 0)
    assert torch.allclose(logq.exp(), p, atol=1e-5)
    views = choices._views(cfg, public, lm.tokenizer, run_data_of(cfg))
    scores = torch.tensor(score_choices(lm.model, lm.tokenizer, [v[0] for v in views],
                                        [v[1] for v in views], max_length=cfg.data.max_length))
    assert torch.equal(scores.argmax(-1), p.argmax(-1))
    # a temperature flattens the posterior without changing its order
    hot = choices.choice_knowledge(cfg, lm, public, data=run_data_of(cfg), temperature=4.0)
    assert torch.equal(hot.argmax(-1), p.argmax(-1))
    assert bool((choices.entropy(hot) >= choices.entropy(p) - 1e-6).all())


def test_records_without_labels_are_scored(setting):
    cfg, lm, public = setting
    stripped = [{k: v for k, v in r.items() if k != "label"} for r in public]
    data = run_data_of(cfg)
    assert torch.equal(choices.choice_knowledge(cfg, lm, stripped, data=data),
                       choices.choice_knowledge(cfg, lm, public, data=data))


def test_select_rules_on_a_hand_made_case():
    own = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.6, 0.4]])
    a = torch.tensor([[0.99, 0.01], [0.5, 0.5], [0.7, 0.3]])
    b = torch.tensor([[0.8, 0.2], [0.95, 0.05], [0.2, 0.8]])
    targets, taken = choices.select(own, [a, b], "entropy")
    # sample 0: a has the lowest entropy, below own's; sample 1: b (0.95) beats own (0.9);
    # sample 2: b (0.2/0.8) has entropy 0.50 < a's 0.61 < own's 0.67
    assert taken.tolist() == [True, True, True]
    assert torch.allclose(targets, torch.stack([a[0], b[1], b[2]]))
    sharp_own = torch.tensor([[1.0, 0.0], [0.999, 0.001], [0.6, 0.4]])
    _, taken = choices.select(sharp_own, [a, b], "entropy")
    assert taken.tolist() == [False, False, True]
    targets, taken = choices.select(own, [a, b], "always")
    assert taken.all() and torch.allclose(targets, (a + b) / 2)
    gold = torch.tensor([1, 0, 0])
    targets, taken = choices.select(own, [a, b], "min_ce", gold)
    # CE on the gold class: sample 0 own 0.69 < a 4.6, b 1.6; sample 1 b (0.95) wins;
    # sample 2 a (0.7) beats own (0.6)
    assert taken.tolist() == [False, True, True]
    assert torch.allclose(targets[1:], torch.stack([b[1], a[2]]))
    with pytest.raises(ValueError, match="gold"):
        choices.select(own, [a], "min_ce")
    targets, taken = choices.select(own, [], "entropy")
    assert not taken.any()


def test_shuffled_teacher_is_a_permutation_with_the_same_bytes():
    p = torch.softmax(torch.randn(40, 7, generator=torch.Generator().manual_seed(0)), -1)
    s1, s2, again = (choices.shuffled(p, 1), choices.shuffled(p, 2), choices.shuffled(p, 1))
    assert torch.equal(s1, again)  # deterministic for a seed
    assert not torch.equal(s1, p) and not torch.equal(s1, s2)  # a fresh order per seed
    # every row is another sample's row, each used once: marginals and entropies kept
    assert sorted(map(tuple, s1.tolist())) == sorted(map(tuple, p.tolist()))
    moved = (s1 != p).any(-1).float().mean()
    assert moved > 0.8
    assert len(dumps({"choices": choices.pack(s1)})) == len(dumps({"choices": choices.pack(p)}))


def test_unpack_names_the_sender_and_the_field():
    good = torch.full((3, 4), 0.25)
    assert torch.equal(choices.unpack(choices.pack(good), 3, 4, "client 1"), good)
    bad = {
        "shape": {"posteriors": torch.full((2, 4), 0.25)},
        "dtype": {"posteriors": torch.full((3, 4), 0.25, dtype=torch.float64)},
        "non-finite": {"posteriors": torch.tensor([[float("nan"), 0.5, 0.25, 0.25]] * 3)},
        "allowed": {"posteriors": torch.tensor([[1.5, -0.5, 0.0, 0.0]] * 3)},
        "sum to 1": {"posteriors": torch.full((3, 4), 0.2)},
        "only 'posteriors'": {"posteriors": good, "extra": good},
    }
    for words, packed in bad.items():
        with pytest.raises(PayloadError, match=words) as err:
            choices.unpack(packed, 3, 4, "client 1")
        assert "client 1" in str(err.value) and "choices" in str(err.value)
    with pytest.raises(PayloadError, match="client 2"):
        choices.unpack([1, 2, 3], 3, 4, "client 2")


def test_distillation_moves_the_student_towards_the_teacher(setting):
    cfg, lm, public = setting
    before = choices.choice_knowledge(cfg, lm, public, data=run_data_of(cfg))
    target = torch.zeros_like(before)
    target[:, 3] = 1.0  # a teacher sure of class 3 everywhere
    taken = torch.ones(len(public), dtype=torch.bool)
    stats = choices.distill_choices(cfg, lm, public, target, taken, data=run_data_of(cfg),
                                    epochs=3, lr=5e-3, seed=0, kd_weight=1.0)
    after = choices.choice_knowledge(cfg, lm, public, data=run_data_of(cfg))
    assert stats["steps"] == 9 and stats["kd_taken"] == 1.0
    assert after[:, 3].mean() > before[:, 3].mean() + 0.1
    # nothing taken and no label loss: no step, the adapter unchanged
    lm.reset()
    initial = {k: v.clone() for k, v in lm.trainable().items()}
    stats = choices.distill_choices(cfg, lm, public, target, ~taken, data=run_data_of(cfg),
                                    epochs=1, lr=5e-3, seed=0, kd_weight=1.0)
    assert stats["steps"] == 0
    assert all(torch.equal(v, initial[k]) for k, v in lm.trainable().items())


def test_evaluation_and_knowledge_run_on_frozen_weights_cast_once(make_config, monkeypatch):
    """Under bf16 an evaluation's and a knowledge pass's forwards see every frozen linear
    weight already in bf16 (cast once, not in every forward), give the numbers of the
    per-forward cast, and leave the fp32 weights, so the reuse store's key, as they were."""
    from fedkt.infra import precision
    from fedkt.train.lm import evaluate_lm

    cfg = make_config("data.split={scheme: fedmkt, test_size: 16}", "data.max_public=10",
                      "clients.models=[{name: tiny-llama}]", "training.peft=lora",
                      "training.precision=bf16", "eval.reuse=false", method="fedavg")
    data = run_data_of(cfg)
    lm = client_lm(cfg, 0)
    with torch.no_grad():  # adapters that change the output, as after training
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    frozen = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)
              and not m.weight.requires_grad and m.weight.dtype == torch.float32]
    assert frozen
    seen: list[torch.dtype] = []
    handles = [m.register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
               for m in frozen]
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}

    def both() -> tuple[dict[str, float], torch.Tensor]:
        return (evaluate_lm(cfg, lm, data.test, data=data),
                choices.choice_knowledge(cfg, lm, data.public, data=data))

    metrics, knowledge = both()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(torch.equal(p, before[n]) and p.dtype == torch.float32
               for n, p in lm.model.named_parameters())
    seen.clear()
    monkeypatch.setenv(precision.FROZEN_CAST_ENV, "0")  # autocast casts in every forward
    metrics_uncast, knowledge_uncast = both()
    assert set(seen) == {torch.float32}
    for h in handles:
        h.remove()
    assert metrics == metrics_uncast
    assert torch.equal(knowledge, knowledge_uncast)
