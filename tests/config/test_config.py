"""Config validation: errors name the key and say what is allowed; CLI overrides."""

import pytest
import yaml

from fedkt.config import ConfigError, apply_overrides, load_config, parse_config

BASE = {"method": "fedavg", "data": {"dataset": {"name": "intent_recognition"}},
        "clients": {"num_clients": 2, "models": [{"name": "tiny-llama"}]}}


def test_defaults_follow_the_papers():
    cfg = parse_config(BASE)
    t = cfg.training
    assert (t.lora.r, t.lora.alpha, t.lora.dropout) == (8, 16, 0.05)
    assert t.betas == (0.9, 0.95) and t.weight_decay == 0.1 and t.warmup_ratio == 0.008
    assert t.max_grad_norm == 1.0 and t.batch_size == 4 and t.local_epochs == 1.0
    assert cfg.runtime.name == "local" and cfg.method.name == "fedavg"


@pytest.mark.parametrize("patch, key, hint", [
    ({"rounds": 0}, "rounds", "greater than or equal to 1"),
    ({"runtime": {"name": "ray"}}, "runtime.name",
     "unknown runtime 'ray'; registered: flower, flower-sim, local"),
    ({"training": {"lr": -1}}, "training.lr", "greater than 0"),
    ({"trainig": {}}, "trainig", "unknown key"),
    ({"method": {"name": "fedavg", "weigthed": True}}, "method.weigthed", "unknown key"),
    ({"method": "fedfoo"}, "method.name", "allowed: "),
    ({"clients": {"num_clients": 3, "models": [{"name": "a"}, {"name": "b"}]}},
     "clients", "give 1"),
    ({"data": {"dataset": {"name": "x", "path": "y"}}}, "data.dataset", "exactly one of"),
])
def test_bad_values_name_the_key(patch, key, hint):
    with pytest.raises(ConfigError) as err:
        parse_config({**BASE, **patch}, "my.yaml")
    text = str(err.value)
    assert "my.yaml" in text and f"  {key}" in text and hint in text


def test_missing_method_is_named():
    with pytest.raises(ConfigError, match="method: missing"):
        parse_config({"data": BASE["data"]})


def test_overrides_parse_yaml_values_and_create_sections():
    data = apply_overrides(BASE, ["rounds=5", "training.lora.r=4", "runtime.name=flower-sim",
                                  "clients.models.0.name=tiny-gpt2", "eval.clients=false"])
    cfg = parse_config(data)
    assert cfg.rounds == 5 and cfg.training.lora.r == 4 and cfg.runtime.name == "flower-sim"
    assert cfg.clients.models[0].name == "tiny-gpt2" and cfg.eval.clients is False
    assert BASE["clients"]["models"][0]["name"] == "tiny-llama"  # input untouched
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides(BASE, ["rounds"])


def test_yaml_file_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(path, ["seed=3"])
    again = parse_config(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg and again.seed == 3
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_shipped_configs_validate():
    from pathlib import Path

    configs = sorted(Path(__file__).parents[2].glob("configs/**/*.yaml"))
    assert configs, "no configs shipped"
    for path in configs:
        if "suites" in path.parts:
            with pytest.raises(ConfigError, match="fedkt suite run"):
                load_config(path)  # a suite is not a run config, and says how to run it
            continue
        load_config(path)


def test_configuration_reference_is_current():
    """docs/configuration.md is regenerated with `python -m fedkt.config`; keep it true."""
    from pathlib import Path

    from fedkt.config import config_reference

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    assert config_reference() in doc, "run: python -m fedkt.config --write"


# Renamed method keys (docs/architecture.md, vocabulary): (method, old key, new key, value).
RENAMED = [("fedmkt", "lam", "ft_weight", 0.5), ("fedcollm", "kd_lambda", "kd_weight", 0.0),
           ("fedcollm", "lr_llm", "llm_lr", 1e-3), ("fedcollm", "lr_slm", "slm_lr", 2e-3),
           ("fedsp", "server_lr", "server_prompt_lr", 1e-2)]


@pytest.mark.parametrize("method, old, new, value", RENAMED)
def test_a_renamed_method_key_loads_under_its_new_name_with_a_warning(method, old, new, value):
    import warnings

    from fedkt.methods import get_method

    config = get_method(method).config
    assert config.renamed.get(old) == new and new in config.model_fields
    assert old not in config.model_fields
    with pytest.warns(FutureWarning, match=rf"^method\.{old} is now method\.{new}$"):
        got = config.model_validate({"name": method, old: value})
    assert getattr(got, new) == value
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new key: no warning
        assert config.model_validate({"name": method, new: value}) == got
    with pytest.raises(ValueError, match=rf"{old}: it was renamed {new}, which is also given"):
        config.model_validate({"name": method, old: value, new: value})


def test_a_renamed_key_in_a_config_file_is_named_when_both_are_given(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump({"method": {"name": "fedmkt", "lam": 0.5, "ft_weight": 0.5},
                                    "data": {"dataset": {"name": "intent_recognition"}}}))
    with pytest.raises(ConfigError, match=r"method\.lam: it was renamed ft_weight"):
        load_config(path)


def test_every_key_of_run_config_and_of_every_method_config_has_a_description():
    """`Field(description=...)` on every field of RunConfig's tree and of every registered
    method's config: what docs/configuration.md and `fedkt configs explain` show."""
    from fedkt.config.keys import walk
    from fedkt.methods.registry import available, method_config_class

    keys = list(walk())
    assert {"training.lr", "runtime.flower.superlink", "eval.reuse"} <= {k.key for k in keys}
    missing = [k.key for k in keys if not k.description.strip()]
    for name in available():
        missing += [f"{name}: {k.key}" for k in walk(method_config_class(name), "method.")
                    if not k.description.strip()]
    assert not missing, f"fields without Field(description=...): {missing}"


def test_a_field_declared_again_keeps_its_parents_description_unless_it_gives_its_own():
    from fedkt.methods.fedavg.config import AdapterAveragingConfig
    from fedkt.methods.fedcollm.config import FedCoLLMConfig
    from fedkt.methods.fedsp.config import FedPromptConfig, PromptMessengerConfig

    parent, child = PromptMessengerConfig.model_fields, FedPromptConfig.model_fields
    assert child["distill"].default is False and parent["distill"].default is True
    assert child["distill"].description == parent["distill"].description
    assert FedCoLLMConfig.model_fields["weighted"].description.startswith("Step 3")
    assert AdapterAveragingConfig.model_fields["weighted"].description.startswith("Weight each")


def test_the_reference_shows_each_fields_description():
    from fedkt.config import RunConfig, TrainingConfig, config_reference
    from fedkt.methods.fedmkt.config import FedMKTConfig

    text = config_reference()
    fedmkt = text.split("### `method.name: fedmkt`")[1]
    for part, key, info in [(text, "seed", RunConfig.model_fields["seed"]),
                            (text, "training.lr", TrainingConfig.model_fields["lr"]),
                            (fedmkt, "method.top_k", FedMKTConfig.model_fields["top_k"])]:
        row = next(line for line in part.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.endswith(f"| {info.description.replace('|', chr(92) + '|')} |"), row
