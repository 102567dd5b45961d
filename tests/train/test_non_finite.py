"""A training step never leaves non-finite weights behind: a non-finite loss, or an update
that makes a weight NaN or infinite, stops that training with an error naming the loop
(its participant and phase), the step and the loss; the server's state is checked before
a checkpoint is written. (A client's reply with non-finite tensors excludes that client
by name: tests/runtime/test_malformed_replies.py.)"""

from __future__ import annotations

import importlib

import pytest
import torch

from fedkt.errors import NonFiniteError
from fedkt.train.loop import run_steps
from fedkt.train.optim import step
from tests.conftest import ROOT


def _model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def test_a_non_finite_loss_stops_the_loop_naming_the_step_and_the_loss():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss(i, batch):
        out = model(batch).mean()
        kd = out * (float("inf") if i == 2 else 1.0)
        return out + kd, {"kd_loss": kd}

    with pytest.raises(NonFiniteError) as err:
        run_steps([torch.ones(2, 3)] * 5, loss, lambda value: step(value, [opt]),
                  modules=[model], seed=0, total=5, desc="client_1 distill", cast=None)
    text = str(err.value)
    assert "client_1 distill" in text and "step 3 of 5" in text and "kd_loss" in text, text
    after = model.state_dict()
    # steps 1 and 2 ran; step 3 never reached the weights
    assert all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_an_update_that_overflows_a_weight_is_refused():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e38)

    def loss(i, batch):
        return (model(batch) * 1e38).sum()

    with pytest.raises(NonFiniteError) as err:
        run_steps([torch.ones(2, 3)], loss, lambda value: step(value, [opt]),
                  modules=[model], seed=0, total=1, desc="server train", cast=None)
    text = str(err.value)
    assert "server train" in text and "step 1 of 1" in text and "non-finite" in text, text


def test_a_server_whose_model_went_non_finite_writes_no_checkpoint(tmp_path, monkeypatch):
    """The attack: FedMKT with a distillation term that overflows (what temperature 1e30
    with t_squared did before the bound) fails the run by name; no checkpoint holds NaN."""
    from safetensors.torch import load_file

    from fedkt.config import load_config
    from fedkt.runtime.base import default_state_root
    from fedkt.runtime.job import run_job
    from fedkt.runtime.local import LocalTransport

    distill = importlib.import_module("fedkt.methods.fedmkt.distill")  # the module
    monkeypatch.setattr(distill, "kd_scale", lambda temperature, t_squared: float("inf"))
    cfg = load_config(ROOT / "configs" / "fedmkt" / "tiny.yaml",
                      ["rounds=1", f"output_dir={tmp_path / 'run'}", "eval.plots=false",
                       "eval.predictions=false", "training.reuse=false", "eval.reuse=false"])
    with pytest.raises(NonFiniteError, match=r"server .*step 1 of \d+.*loss"):
        run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    states = list((tmp_path / "run").rglob("*.safetensors"))
    assert not list((tmp_path / "run").rglob("checkpoint*/*.safetensors")), states
    assert all(torch.isfinite(t).all() for p in states for t in load_file(str(p)).values())


def test_a_non_finite_server_state_is_not_checkpointed(tmp_path):
    from fedkt.tracking.checkpoint import write_checkpoint
    from fedkt.tracking.folder import SERVER_STATE, RunRecorder

    recorder = RunRecorder(tmp_path / "run")
    state = {"a.weight": torch.ones(3), "b.weight": torch.tensor([1.0, float("nan")])}
    with pytest.raises(NonFiniteError, match=r"round 2: .*'b.weight'.*no checkpoint"):
        write_checkpoint(recorder, state, {}, 2)
    assert not (recorder.checkpoint_dir(2) / SERVER_STATE).exists()
    write_checkpoint(recorder, {"a.weight": torch.ones(3)}, {}, 2)  # a finite one is written
    assert (recorder.checkpoint_dir(2) / SERVER_STATE).is_file()
