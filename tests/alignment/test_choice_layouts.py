"""The shared-context layout of the trained choice log-posteriors: each sample's context
runs once and its choices after the context's key/value cache; the log-posteriors, their
gradients and a distillation's trained adapter equal those of whole sequences."""

from __future__ import annotations

import functools

import pytest
import torch

from fedkt.alignment import choices
from fedkt.data.splits import run_data
from fedkt.eval.inputs import encode_scored
from fedkt.train.lm import client_lm
from tests.conftest import run_data_of

torch.set_num_threads(1)

# Contexts of different lengths; choices of different lengths, one of 0 tokens.
CONTEXTS = ["Intent: play some jazz\nAnswer:",
            "Which intent is this request: book a table for two at the Italian place "
            "tonight at eight?\nAnswer:",
            "Intent of 'rate this book 4 stars'\nAnswer:"]
CHOICES = [" PlayMusic", " AddToPlaylist", " BookRestaurant please now", "",
           " RateBook", " SearchCreativeWork", " GetWeather"]


# GPT-2's dropout off, so that its training forwards are deterministic (Llama has none).
NO_DROPOUT = {"tiny-gpt2": "{resid_pdrop: 0, embd_pdrop: 0, attn_pdrop: 0}"}


def _lm(make_config, model: str):
    tiny = NO_DROPOUT.get(model, "{}")
    cfg = make_config("data.split={scheme: fedmkt, test_size: 16}", "data.max_public=8",
                      f"clients.models=[{{name: {model}, tiny: {tiny}}}]",
                      "training.batch_size=4",
                      "training.lr=5e-3", "training.precision=fp32", "training.lora.dropout=0")
    lm = client_lm(cfg, 0)
    # A non-zero adapter (peft starts LoRA's B at 0): its A gets gradients, the
    # posteriors depend on it.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return cfg, lm


def _hand_made(tokenizer, max_length: int) -> choices.Encoded:
    return [[encode_scored(tokenizer, ctx, cont, max_length) for cont in CHOICES]
            for ctx in CONTEXTS]


def _forward_rows(model: torch.nn.Module) -> tuple[list[int], object]:
    """The batch rows of every forward of ``model`` (a hook; remove with the handle)."""
    rows: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(int(kwargs["input_ids"].shape[0])),
        with_kwargs=True)
    return rows, handle


def _logq_and_grads(lm, encoded: choices.Encoded, target: torch.Tensor, layout: str,
                    trie: bool = True
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
    """The log-posteriors, and the gradients of KL(target || them) w.r.t. the adapter."""
    model = lm.model
    model.train()
    model.zero_grad(set_to_none=True)
    rows, handle = _forward_rows(model)
    try:
        logq = choices.choice_logprobs(model, encoded, lm.tokenizer.pad_token_id or 0,
                                       temperature=2.0, layout=layout, trie=trie)
    finally:
        handle.remove()
    (target * (target.log() - logq)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logq.detach(), grads, rows


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_shared_layout_equals_whole_sequences(make_config, model):
    """Contexts of different lengths (right-padded together), choices of different lengths
    and one of 0 tokens: the same log-posteriors and the same gradients of a KL loss
    w.r.t. every LoRA parameter, from one context forward and one choice forward.  And
    the public records' intents (one token each in the tiny tokenizers, several in
    others)."""
    cfg, lm = _lm(make_config, model)
    public = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).public
    for encoded in (_hand_made(lm.tokenizer, 64), choices.encode(cfg, lm.tokenizer, public,
                                                                            data=run_data_of(cfg))):
        b, c = len(encoded), len(encoded[0])
        target = torch.softmax(torch.randn(b, c, generator=torch.Generator().manual_seed(1)),
                               -1)
        flat_q, flat_g, flat_rows = _logq_and_grads(lm, encoded, target, "pairs")
        shared_q, shared_g, shared_rows = _logq_and_grads(lm, encoded, target, "shared")
        # one forward of the contexts, then one of the choices' later tokens (none when
        # every choice is one token: the context's last logits score them all; a choice
        # of one token or none takes no row there)
        single = all(n == 1 for row in encoded for _, n in row)
        assert flat_rows == [b * c] and shared_rows[0] == b
        assert len(shared_rows) == 1 if single else (len(shared_rows) == 2
                                                     and b < shared_rows[1] <= b * c)
        assert torch.allclose(shared_q, flat_q, atol=1e-5, rtol=0)
        assert not torch.allclose(flat_q, flat_q.mean(-1, keepdim=True))  # not uniform
        assert set(shared_g) == set(flat_g)
        scale = max(float(g.abs().max()) for g in flat_g.values())
        assert scale > 0
        for name, g in flat_g.items():
            assert torch.allclose(shared_g[name], g, atol=1e-5 * scale, rtol=1e-4), name
        # auto picks the shared layout here: fewer positions through the model
        _, _, auto_rows = _logq_and_grads(lm, encoded, target, "auto")
        assert auto_rows == shared_rows


def test_contexts_that_differ_in_their_tail_or_share_nothing(make_config):
    """Choices whose contexts share a prefix but differ after it: the shared context is
    the common prefix and the rest of each context runs with its choice.  A context cut
    from the left to fit ``max_length`` loses more tokens before a longer choice, so its
    choices share no prefix: that sample runs as whole sequences beside the shared ones.
    Both equal whole sequences."""
    cfg, lm = _lm(make_config, "tiny-llama")
    full = [[row[0], row[2]] for row in _hand_made(lm.tokenizer, 64)]
    cut = [[row[0], row[2]] for row in _hand_made(lm.tokenizer, 14)]
    assert choices._split(cut[1]) is None  # cut differently: no common prefix
    ctx = full[2][0][0][:-3]
    tail = [(ctx + [5, 6, 9], 2), (ctx + [7, 8], 1)]  # contexts ctx + [5] and ctx + [7]
    encoded = [full[0], full[1], cut[1], tail]
    target = torch.tensor([[0.3, 0.7]] * len(encoded))
    flat_q, flat_g, _ = _logq_and_grads(lm, encoded, target, "pairs")
    shared_q, shared_g, rows = _logq_and_grads(lm, encoded, target, "shared")
    assert rows == [3, 6, 2]  # three contexts, their choices, then the cut sample whole
    assert torch.allclose(shared_q, flat_q, atol=1e-5, rtol=0)
    scale = max(float(g.abs().max()) for g in flat_g.values())
    for name, g in flat_g.items():
        assert torch.allclose(shared_g[name], g, atol=1e-5 * scale, rtol=1e-4), name


def test_gradient_checkpointing_falls_back_to_whole_sequences(make_config):
    """transformers drops the cache of a model that trains with gradient checkpointing:
    the shared layout is not taken there, and the numbers are the whole sequences'."""
    cfg, lm = _lm(make_config, "tiny-llama")
    encoded = _hand_made(lm.tokenizer, 64)
    target = torch.full((len(encoded), len(CHOICES)), 1 / len(CHOICES))
    flat_q, _, _ = _logq_and_grads(lm, encoded, target, "pairs")
    from fedkt.models.adapters import enable_gradient_checkpointing

    enable_gradient_checkpointing(lm.model)
    try:
        q, _, rows = _logq_and_grads(lm, encoded, target, "shared")
    finally:  # the base model is cached: leave it as the other tests expect it
        lm.model.get_base_model().gradient_checkpointing_disable()
    assert rows == [len(encoded) * len(CHOICES)]
    assert torch.allclose(q, flat_q, atol=1e-5, rtol=0)


def test_unknown_layout_is_refused(make_config):
    _, lm = _lm(make_config, "tiny-gpt2")
    with pytest.raises(ValueError, match="layout 'flat'"):
        choices.choice_logprobs(lm.model, _hand_made(lm.tokenizer, 64), 0, layout="flat")


def test_distillation_trains_the_same_adapter_in_either_layout(make_config, monkeypatch):
    """distill_choices' steps with every batch's log-posteriors in the shared layout give
    the adapter they give with whole sequences (within float rounding)."""
    cfg, lm = _lm(make_config, "tiny-llama")
    lm.model.get_base_model().gradient_checkpointing_disable()  # else no cache: no sharing
    public = run_data(cfg.data, cfg.clients.num_clients, cfg.seed).public
    start = {k: v.clone() for k, v in lm.trainable().items()}
    target = torch.softmax(torch.randn(len(public), 7,
                                       generator=torch.Generator().manual_seed(2)), -1)
    taken = torch.ones(len(public), dtype=torch.bool)
    taken[1] = False
    plain = choices.choice_logprobs
    trained = {}
    for layout in ("pairs", "shared"):
        lm.reset(start)
        monkeypatch.setattr(choices, "choice_logprobs",
                            functools.partial(plain, layout=layout))
        rows, handle = _forward_rows(lm.model)
        try:
            stats = choices.distill_choices(cfg, lm, public, target, taken,
                                            data=run_data_of(cfg), epochs=2, lr=5e-3,
                                            seed=0, kd_weight=1.0)
        finally:
            handle.remove()
        assert stats["steps"] == 4
        # pairs: every forward holds a batch's 7 choices a sample; shared: the contexts'
        # forwards hold one row a sample (the layout really was taken)
        assert (min(rows) < 7) == (layout == "shared"), (layout, rows)
        trained[layout] = (stats, lm.trainable())
    (flat_stats, flat), (shared_stats, shared) = trained["pairs"], trained["shared"]
    assert abs(flat_stats["kd_loss"] - shared_stats["kd_loss"]) < 1e-5
    moved = max(float((flat[k] - start[k]).abs().max()) for k in flat)
    assert moved > 1e-3  # the steps changed the adapter
    for k, v in flat.items():
        # Adam's first steps divide by the gradients' own size, so float rounding in a
        # near-zero gradient moves a few entries by about 1e-5 of the step
        assert torch.allclose(shared[k], v, atol=1e-4 * moved, rtol=0), k


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_many_labels_of_uneven_length_run_in_groups_with_the_same_gradients(make_config,
                                                                           model):
    """30 labels of 1 to 40 tokens (Banking77-like, stretched): the shared layout cuts the
    choices into forwards of similar lengths, each after its own forward of the contexts,
    and the log-posteriors and the KL loss's gradients are whole sequences'; with the
    label trie, the labels that begin another ("card top" and "card top up") run in its
    row, and still are."""
    cfg, lm = _lm(make_config, model)
    # An earlier test may have left checkpointing on in the (cached) base model.
    lm.model.get_base_model().gradient_checkpointing_disable()
    labels = [" " + " ".join(["card", "top", "up", "pin", "fee"][: 1 + k % 5] * (1 + k % 8))
              for k in range(30)]
    encoded = [[encode_scored(lm.tokenizer, ctx, label, 128) for label in labels]
               for ctx in CONTEXTS[:2]]
    target = torch.softmax(torch.randn(2, 30, generator=torch.Generator().manual_seed(3)), -1)
    flat_q, flat_g, _ = _logq_and_grads(lm, encoded, target, "pairs")
    shared_q, shared_g, rows = _logq_and_grads(lm, encoded, target, "shared", trie=False)
    # [contexts, a group's rows, contexts again, the next group's rows, ...]
    assert len(rows) >= 4 and rows[0::2] == [2] * (len(rows) // 2)
    assert 30 < sum(rows[1::2]) <= 60
    trie_q, trie_g, trie_rows = _logq_and_grads(lm, encoded, target, "shared")
    assert trie_rows[0] == 2 and sum(trie_rows[1::2]) < sum(rows[1::2]) / 2
    scale = max(float(g.abs().max()) for g in flat_g.values())
    assert scale > 0
    for q, grads in ((shared_q, shared_g), (trie_q, trie_g)):
        # log-posteriors down to -200 here: float32 rounding is relative
        assert torch.allclose(q, flat_q, atol=1e-5, rtol=1e-6), (q - flat_q).abs().max()
        for name, g in flat_g.items():
            assert torch.allclose(grads[name], g, atol=1e-5 * scale, rtol=1e-4), name
