"""Receiving-side options and the marginal teacher (fedkt.alignment.receiving, choices):
exact hand-made cases, and the distillation steps they drive on a real tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from fedkt.alignment import choices, receiving
from fedkt.config.method_settings import ReceivingOptions
from fedkt.data.splits import run_data
from fedkt.train.lm import client_lm
from tests.conftest import run_data_of

torch.set_num_threads(1)


def test_marginal_gives_every_sample_the_senders_mean_posterior():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.25, 0.5, 0.25], [0.3, 0.3, 0.4]])
    mean = p.double().mean(0).float()
    for got in (choices.marginal(p), choices.sent(p, "marginal", seed=3)):
        assert got.shape == p.shape and got.dtype == p.dtype
        assert all(torch.equal(row, mean) for row in got)  # exactly, every row
    # it is the average of the shuffled teacher over permutations: the same column sums
    torch.testing.assert_close(choices.marginal(p).sum(0), p.sum(0))
    assert torch.equal(choices.sent(p, "real", 3), p) and torch.equal(choices.sent(p, "self", 3), p)
    assert torch.equal(choices.sent(p, "shuffled", 3), choices.shuffled(p, 3))


def test_anchoring_term_is_zero_at_the_receivers_own_posteriors():
    own = torch.tensor([[0.6, 0.3, 0.1], [0.05, 0.9, 0.05], [1 / 3, 1 / 3, 1 / 3]])
    assert torch.equal(receiving.kl_rows(own, own.double().log()), torch.zeros(3))
    # and its gradient there: a learner whose logits give exactly its own posteriors
    logits = own.double().log().requires_grad_()
    receiving.kl_rows(own, logits.log_softmax(-1)).sum().backward()
    torch.testing.assert_close(logits.grad, torch.zeros_like(logits), rtol=0, atol=1e-12)
    # away from them it is the KL, positive
    other = torch.tensor([[0.2, 0.3, 0.5], [0.05, 0.9, 0.05], [0.5, 0.25, 0.25]]).double()
    got = receiving.kl_rows(own, other.log())
    want = (own.double() * (own.double().log() - other.log())).sum(-1).float()
    assert torch.equal(got, want) and got[0] > 0 and got[1] == 0 and got[2] > 0


@pytest.mark.parametrize("t", [1.0, 2.0, 4.0])
def test_temperature_scales_as_stated_with_t_squared(t):
    """T**2 KL(p_T || q_T) has gradient T (q_T - p_T) in the student's logits (Hinton et al.
    2015); without the factor it is (q_T - p_T) / T, the papers' loss at T."""
    assert receiving.kd_scale(t, True) == t * t and receiving.kd_scale(t, False) == 1.0
    torch.manual_seed(0)
    z_teacher, z_student = torch.randn(5, 4).double() * 3, torch.randn(5, 4).double() * 3
    p_t = (z_teacher / t).softmax(-1)
    for t_squared, factor in ((True, t), (False, 1 / t)):
        z = z_student.clone().requires_grad_()
        loss = receiving.kd_scale(t, t_squared) * receiving.kl_rows(
            p_t, (z / t).log_softmax(-1)).double().sum()
        loss.backward()
        want = factor * ((z_student / t).softmax(-1) - p_t)
        torch.testing.assert_close(z.grad, want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="temperature"):
        receiving.kd_scale(0.0, True)


def test_confident_selection_takes_exactly_the_samples_its_rule_names():
    teacher = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.6, 0.4], [0.9, 0.1], [0.1, 0.9]])
    own = torch.tensor([[0.5, 0.5], [0.8, 0.2], [0.5, 0.5], [0.49, 0.51], [0.6, 0.4]])
    # teacher's max >= 0.9 and own's max < 0.55: samples 0 (0.95 / 0.5), 3 (0.9 / 0.51)
    got = receiving.take_confident(teacher, own, teacher_min=0.9, learner_max=0.55)
    assert got.tolist() == [True, False, False, True, False]
    # sample 4 (0.9 / 0.6) joins when the receiver may be up to 0.65 sure; 1 (0.8) does not
    assert receiving.take_confident(teacher, own, 0.9, 0.65).tolist() == [
        True, False, False, True, True]
    chosen = torch.tensor([True, True, True, False, True])  # the method's own selection
    opts = ReceivingOptions(take="confident", teacher_confidence=0.9, learner_confidence=0.55)
    assert receiving.taken(opts, teacher, own, chosen).tolist() == [True, False, False, False,
                                                                     False]
    assert torch.equal(receiving.taken(ReceivingOptions(), teacher, own, chosen), chosen)
    with pytest.raises(ValueError, match="shape"):
        receiving.take_confident(teacher, own[:3], 0.9, 0.5)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 1.0, 2.0, 2.5])
def test_rehearsal_interleaves_own_batches_at_the_ratio(ratio):
    kd = [[i, i + 100] for i in range(10)]  # public indices: 10 KD steps
    plan = receiving.interleave(kd, n_own=7, ratio=ratio, batch_size=3, seed=5)
    assert [b for k, b in plan if k == receiving.KD] == kd  # KD steps kept, in order
    own = [b for k, b in plan if k == receiving.OWN]
    assert len(own) == math.floor(10 * ratio)
    seen = [i for b in own for i in b]
    assert all(0 <= i < 7 for i in seen)  # indices into the receiver's own records only
    for start in range(0, len(seen) - 7 + 1, 7):  # every record once before any repeats
        assert sorted(seen[start : start + 7]) == list(range(7))
    # own steps spread between the KD steps: after KD step i, floor((i+1)r) - floor(ir)
    kinds = [k for k, _ in plan]
    kd_at = [i for i, k in enumerate(kinds) if k == receiving.KD]
    between = [b - a - 1 for a, b in zip(kd_at, [*kd_at[1:], len(kinds)], strict=True)]
    assert between == [math.floor((i + 1) * ratio + 1e-9) - math.floor(i * ratio + 1e-9)
                       for i in range(10)]
    assert receiving.interleave(kd, 7, ratio, 3, 5) == plan  # seeded
    with pytest.raises(ValueError, match="own records"):
        receiving.interleave(kd, 0, ratio, 3, 5)


def _setting(make_config, model: str):
    """A receiver's config, its model (client 0's ``model``), public and own records."""
    cfg = make_config("data.split={scheme: fedmkt, test_size: 16}", "data.max_public=8",
                      "data.max_private_per_client=6", f"clients.models=[{{name: {model}}}]",
                      "training.batch_size=4", "training.lr=5e-3", "training.precision=fp32",
                      "training.lora.dropout=0", method="fedavg")
    fd = run_data(cfg.data, cfg.clients.num_clients, cfg.seed)
    return cfg, client_lm(cfg, 0), fd.public, fd.private[0]


@pytest.fixture
def setting(make_config):
    return _setting(make_config, "tiny-gpt2")


def test_rehearsal_steps_use_the_receivers_own_records_and_no_public_label(setting,
                                                                          monkeypatch):
    cfg, lm, public, own = setting
    withheld = [{k: v for k, v in r.items() if k != "label"} for r in public]  # as withheld
    seen: list[list[dict]] = []
    real_encode = choices.encode
    monkeypatch.setattr(choices, "encode",
                        lambda c, tok, records, data: seen.append(list(records)) or real_encode(
                            c, tok, records, data=data))
    teacher = torch.zeros(len(public), 7)
    teacher[:, 2] = 1.0
    got = choices.distill_choices(cfg, lm, withheld, teacher, torch.ones(len(public), dtype=bool),
                                  data=run_data_of(cfg), epochs=2, lr=None, seed=1,
                                  kd_weight=1.0, rehearse=own, rehearsal_ratio=1.5)
    assert seen == [withheld, own]  # the KD steps' public samples, then the own records
    assert got["kd_steps"] == 4 and got["rehearsal_steps"] == 6 and got["steps"] == 10
    assert math.isfinite(got["rehearsal_loss"]) and got["rehearsal_loss"] > 0


def test_anchoring_starts_at_zero_and_holds_the_student_near_its_posteriors(setting):
    """Before any step the student is the receiver before the exchange: the anchoring term
    of its training posteriors (the scorer's, without dropout) is zero to rounding; against
    a teacher sure of one class it keeps the student closer to its own posteriors than KD
    alone does."""
    cfg, lm, public, _ = setting
    own = choices.choice_knowledge(cfg, lm, public, data=run_data_of(cfg))
    taken = torch.ones(len(public), dtype=bool)
    with torch.no_grad():
        encoded = choices.encode(cfg, lm.tokenizer, public, data=run_data_of(cfg))
        logq = choices.choice_logprobs(lm.model, encoded, lm.tokenizer.pad_token_id or 0)
    assert float(receiving.kl_rows(own, logq).abs().max()) < 1e-5
    teacher = torch.zeros_like(own)
    teacher[:, 5] = 1.0
    drift = {}
    for weight in (0.0, 5.0):
        lm.reset(None)
        choices.distill_choices(cfg, lm, public, teacher, taken, data=run_data_of(cfg),
                                epochs=3, lr=None, seed=1, kd_weight=1.0, anchor=own,
                                anchor_weight=weight)
        after = choices.choice_knowledge(cfg, lm, public, data=run_data_of(cfg))
        drift[weight] = float(receiving.kl_rows(own, after.double().clamp_min(1e-30).log()).mean())
    assert drift[5.0] < drift[0.0]


def test_micro_batches_accumulate_the_same_update_as_the_whole_batch(make_config):
    """training.kd_micro_batch: a batch of 4 as micro-batches of 1 or of 3 and 1 (every
    term on: partial KD weights, anchoring, the gold choice, rehearsal) trains the adapter
    the whole batch trains, to float rounding (the losses to 1e-5); a micro-batch of the batch's size is the
    whole batch, bit for bit. (tiny-llama: no dropout anywhere, so the draws cannot differ.)"""
    cfg, lm, public, own = _setting(make_config, "tiny-llama")
    start = {k: v.clone() for k, v in lm.trainable().items()}
    gen = torch.Generator().manual_seed(3)
    teacher = torch.softmax(3 * torch.randn(len(public), 7, generator=gen), -1)
    anchor = torch.softmax(torch.randn(len(public), 7, generator=gen), -1)
    taken = torch.arange(len(public)) % 3 != 1
    trained = {}
    for micro in (None, 1, 3, 4):
        lm.reset(start)
        run = cfg.model_copy(update={"training": cfg.training.model_copy(
            update={"kd_micro_batch": micro})})
        stats = choices.distill_choices(run, lm, public, teacher, taken, data=run_data_of(run),
                                        epochs=2, lr=None, seed=1, kd_weight=1.0,
                                        ft_weight=0.5, anchor=anchor, anchor_weight=0.7,
                                        rehearse=own, rehearsal_ratio=0.5)
        trained[micro] = (stats, lm.trainable())
    whole_stats, whole = trained[None]
    moved = max(float((whole[k] - start[k]).abs().max()) for k in whole)
    assert moved > 1e-3 and whole_stats["rehearsal_steps"] > 0
    for micro in (1, 3):
        stats, got = trained[micro]
        for key in ("loss", "kd_loss", "anchor_loss", "rehearsal_loss", "steps"):
            assert stats[key] == pytest.approx(whole_stats[key], rel=1e-5), (micro, key)
        for k, v in whole.items():
            # AdamW's early steps are about lr * sign(g): a component whose gradient is
            # near zero moves by rounding, 0.3% of the largest move at most here
            assert torch.allclose(got[k], v, atol=1e-2 * moved, rtol=0), (micro, k)
    assert trained[4][0] == whole_stats
    assert all(torch.equal(trained[4][1][k], v) for k, v in whole.items())


def test_the_clients_anchoring_weight_applies_to_clients_only():
    """receiving.client_anchor_weight: a client's SLM anchors with it, the LLM with
    anchor_weight; unset, both take anchor_weight; 0 for one side drops its term."""
    own = torch.full((3, 7), 1 / 7)
    options = ReceivingOptions(anchor_weight=1.0, client_anchor_weight=10.0)
    llm = receiving.distill_options(options, 1.0, own, (), client=False)
    slm = receiving.distill_options(options, 1.0, own, (), client=True)
    assert (llm["anchor_weight"], slm["anchor_weight"]) == (1.0, 10.0)
    assert llm["anchor"] is own and slm["anchor"] is own
    same = ReceivingOptions(anchor_weight=2.0)
    assert receiving.distill_options(same, 1.0, own, (), client=True)["anchor_weight"] == 2.0
    only_slm = ReceivingOptions(client_anchor_weight=3.0)
    assert receiving.distill_options(only_slm, 1.0, own, (), client=False)["anchor"] is None
    assert receiving.distill_options(only_slm, 1.0, own, (), client=True)["anchor_weight"] == 3.0
    assert only_slm.active() == ["method.receiving.client_anchor_weight"]
    with pytest.raises(ValueError, match="client_anchor_weight: teacher: none"):
        only_slm.check("choices", "none")
