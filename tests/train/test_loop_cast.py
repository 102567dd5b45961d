"""Every training loop holds its frozen linear weights in the autocast type (run_steps'
``cast`` is required): the image loop, under bf16, feeds its frozen layers bf16 weights
and ends with the same losses and weights as when autocast casts in every forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedkt.infra import precision
from fedkt.train.vision import train_vision


def _trained(monkeypatch, frozen_cast: str) -> tuple[dict, list[torch.dtype], dict]:
    monkeypatch.setenv(precision.FROZEN_CAST_ENV, frozen_cast)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    model[0].requires_grad_(False)  # a frozen feature layer; the head trains
    seen: list[torch.dtype] = []
    model[0].register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
    gen = torch.Generator().manual_seed(1)
    inputs, labels = torch.randn(40, 12, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    stats = train_vision(model, [inputs, labels], lr=1e-2, epochs=2, batch_size=8, seed=0,
                         precision="bf16")
    assert model[0].weight.dtype == torch.float32  # put back after the loop
    return stats, seen, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.filterwarnings("ignore::UserWarning")  # bf16 emulated on a CPU without it
def test_the_image_loop_holds_frozen_weights_in_bf16_with_the_same_numbers(monkeypatch):
    stats, seen, state = _trained(monkeypatch, "1")
    assert seen and set(seen) == {torch.bfloat16}
    recast_stats, recast_seen, recast_state = _trained(monkeypatch, "0")
    assert set(recast_seen) == {torch.float32}
    assert stats == recast_stats
    assert all(torch.equal(state[k], recast_state[k]) for k in state)


def test_a_loop_must_say_what_it_casts_to():
    from fedkt.train.loop import run_steps

    with pytest.raises(TypeError, match="cast"):
        run_steps([], lambda i, b: torch.zeros(()), lambda v: 0.0, modules=[], seed=0)
