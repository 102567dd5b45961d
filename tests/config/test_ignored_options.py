"""An option the rest of the config leaves nothing to act on is refused, naming both the
option and the setting that makes it idle, rather than accepted and silently ignored."""

from __future__ import annotations

import pytest

from fedkt.config import ConfigError, load_config
from tests.conftest import ROOT

FEDMKT = ROOT / "configs" / "fedmkt" / "tiny.yaml"
FEDAVG = ROOT / "configs" / "fedavg" / "tiny.yaml"


@pytest.mark.parametrize("path, overrides, named", [
    # micro-batches split the choice-posterior distillation only
    (FEDMKT, ["training.kd_micro_batch=2"], ["training.kd_micro_batch", "method.knowledge"]),
    (FEDAVG, ["training.kd_micro_batch=2"], ["training.kd_micro_batch", "method"]),
    # the confidences of selective taking need take: confident
    (FEDMKT, ["method.knowledge=choices", "method.receiving.teacher_confidence=0.8"],
     ["method.receiving.teacher_confidence", "method.receiving.take"]),
    (FEDMKT, ["method.knowledge=choices", "method.receiving.learner_confidence=0.3"],
     ["method.receiving.learner_confidence", "method.receiving.take"]),
    # the top-K logits' options under knowledge: choices
    (FEDMKT, ["method.knowledge=choices", "method.kd_positions=target"],
     ["method.kd_positions", "method.knowledge"]),
    (FEDMKT, ["method.knowledge=choices", "method.unaligned=skip"],
     ["method.unaligned", "method.knowledge"]),
    (FEDMKT, ["method.knowledge=choices", "method.fallback_to_own=true"],
     ["method.fallback_to_own", "method.knowledge"]),
    (FEDMKT, ["method.knowledge=choices", "method.selection_loss=sum"],
     ["method.selection_loss", "method.knowledge"]),
])
def test_an_idle_option_is_refused_naming_both_fields(path, overrides, named):
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    text = str(err.value)
    assert text.splitlines()[1].strip().startswith(named[0] + ":"), text
    assert all(n in text for n in named[1:]), text


@pytest.mark.parametrize("overrides", [
    ["method.knowledge=choices", "training.kd_micro_batch=2"],
    ["method.knowledge=choices", "method.receiving.take=confident",
     "method.receiving.teacher_confidence=0.8"],
    ["method.kd_positions=target", "method.unaligned=skip"],
])
def test_the_same_options_where_they_act_still_load(overrides):
    load_config(FEDMKT, overrides)


def test_the_no_exchange_control_keeps_the_suites_micro_batches():
    """teacher: none is a control arm: it shares the treatment's settings, kd_micro_batch too."""
    cfg = load_config(FEDMKT, ["method.knowledge=choices", "method.teacher=none",
                               "training.kd_micro_batch=2"])
    assert cfg.training.kd_micro_batch == 2
