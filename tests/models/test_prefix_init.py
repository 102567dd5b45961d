"""``training.prefix_init: text``: prefix tuning that starts from the model's own keys/values
of the public split's text, for every method that uses ``training.peft: prefix``."""

from __future__ import annotations

import pytest
import torch

from fedkt.config import ConfigError, TrainingConfig
from fedkt.methods import get_method
from fedkt.models.adapters import PREFIX_KEY, apply_peft
from fedkt.models.causal_lm import load_causal_lm
from fedkt.train.lm import client_lm, lm_pairs, prefix_init_text, server_lm
from tests.conftest import run_data_of, small_config

torch.set_num_threads(1)
TEXT_PREFIX = ("training.peft=prefix", "training.prefix_tokens=4", "training.prefix_init=text",
               "data.split.public_fraction=0.25")


def test_centralized_prefix_starts_as_if_the_public_text_were_in_front(tmp_path):
    cfg = small_config(tmp_path, *TEXT_PREFIX, "server={name: tiny-llama}", method="centralized")
    server = get_method("centralized").server(cfg, cfg.run_dir)
    server.setup()
    lm = server_lm(cfg, run_data_of(cfg))
    # The text: the public split's first records, formatted as training pairs.
    public = server.data().public
    first = "".join(lm_pairs(cfg, public[:1], data=run_data_of(cfg))[0])
    text = prefix_init_text(cfg, data=run_data_of(cfg))
    assert text.startswith(first) and len(text) >= 32 * 4
    prefix = list(lm.tokenizer(text)["input_ids"])[:4]
    assert len(prefix) == 4
    # What the method starts from is the text prefix (also after a reset of the cached model).
    torch.testing.assert_close(server.state[PREFIX_KEY], lm.initial[PREFIX_KEY])
    x = torch.tensor([[7, 8, 9, 10]])
    with torch.no_grad():
        with_prefix = lm.model(input_ids=x, attention_mask=torch.ones_like(x)).logits
        in_front = lm.model.get_base_model()(input_ids=torch.tensor([prefix + x[0].tolist()]))
    torch.testing.assert_close(with_prefix, in_front.logits[:, 4:], rtol=1e-4, atol=1e-5)
    # peft's random prefix computes something else.
    random = small_config(tmp_path / "r", *TEXT_PREFIX[:2], "data.split.public_fraction=0.25",
                          "server={name: tiny-llama}", method="centralized")
    with torch.no_grad():
        other = server_lm(random).model(input_ids=x, attention_mask=torch.ones_like(x)).logits
    assert not torch.allclose(other, with_prefix, atol=1e-3)


@pytest.mark.parametrize("method", ["fedavg", "standalone"])
def test_server_and_every_client_build_the_same_text_prefix(tmp_path, method):
    cfg = small_config(tmp_path, *TEXT_PREFIX, "clients.num_clients=3", method=method)
    data = run_data_of(cfg)
    initial = [client_lm(cfg, cid, data).initial[PREFIX_KEY] for cid in range(3)]
    model, tok = load_causal_lm(cfg.clients.models[0], seed=cfg.seed)
    expected = apply_peft(model, cfg.training, seed=cfg.seed,
                          prefix_text=prefix_init_text(cfg, data=data), tokenizer=tok)
    for prefix in initial:
        torch.testing.assert_close(prefix, initial[0], rtol=0, atol=0)
    torch.testing.assert_close(
        initial[0], expected.prompt_encoder["default"].embedding.weight.detach())
    if method == "fedavg":
        server = get_method("fedavg").server(cfg, cfg.run_dir)
        server.setup()
        torch.testing.assert_close(server.adapter[PREFIX_KEY], initial[0], rtol=0, atol=0)


def test_text_init_without_text_is_a_config_error(tmp_path):
    cfg = small_config(tmp_path, *TEXT_PREFIX[:3], "server={name: tiny-llama}",
                       method="centralized")  # no public split
    with pytest.raises(ConfigError, match=r"training\.prefix_init.*public_fraction"):
        get_method("centralized").server(cfg, cfg.run_dir).setup()
    model, _ = load_causal_lm(cfg.server, seed=0)
    training = TrainingConfig(peft="prefix", prefix_tokens=4, prefix_init="text")
    with pytest.raises(ConfigError, match=r"training\.prefix_init"):
        apply_peft(model, training, seed=0)


def test_a_text_prefix_without_the_runs_data_is_refused_by_name(tmp_path):
    """The text comes from the run's public split, which the caller passes: without it,
    the error names the setting and what to pass, before any model is built."""
    cfg = small_config(tmp_path, *TEXT_PREFIX, "server={name: tiny-llama}", method="centralized")
    with pytest.raises(ValueError, match=r"client_lm\(client 1\): training\.prefix_init is "
                                         r"'text'.*pass data="):
        client_lm(cfg, 1)
    with pytest.raises(ValueError, match=r"server_lm: training\.prefix_init is 'text'"):
        server_lm(cfg)
