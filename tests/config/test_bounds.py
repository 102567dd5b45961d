"""Every numeric key of the config has an upper bound: a value that is absurd, or that
would make a run hang or overflow, is a named error while the config loads, in seconds
and before any model; and a config error names each field once and whole."""

from __future__ import annotations

import time
import typing

import annotated_types
import pytest
from pydantic import BaseModel

from fedkt.config import ConfigError, RunConfig, load_config
from fedkt.config.method_catalog import available, method_config_class
from fedkt.config.runtime_schema import runtime_config_class
from tests.conftest import ROOT

FEDMKT = ROOT / "configs" / "fedmkt" / "tiny.yaml"

# Numeric fields without an upper bound of their own, and why that is sound.
UNBOUNDED = {
    # class indices: checked against the task's classes when the data loads
    "ClassFilterConfig.server", "ClassFilterConfig.private", "ClassFilterConfig.public",
    "ClassFilterConfig.test", "EvalConfig.class_groups", "DatasetConfig.classes",
    # client ids: the validator keeps them in 0..num_clients-1
    "ClientsConfig.participants",
    # teacher layer indices: checked against the teacher's depth (fedkd.models.layer_pairs)
    "FedKDConfig.layer_map",
}


def _models(annotation: typing.Any, found: set[type[BaseModel]]) -> None:
    """Every pydantic model ``annotation`` reaches (through unions, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in found:
            found.add(annotation)
            for info in annotation.model_fields.values():
                _models(info.annotation, found)
        return
    for arg in typing.get_args(annotation):
        _models(arg, found)


def _numeric(annotation: typing.Any) -> bool:
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return False
    return any(_numeric(a) for a in typing.get_args(annotation))


def _has_upper(info: typing.Any) -> bool:
    def upper(metadata: typing.Iterable[object]) -> bool:
        return any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in metadata)

    def walk(annotation: typing.Any) -> bool:
        if typing.get_origin(annotation) is typing.Annotated:
            return upper(annotation.__metadata__)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        numeric = [a for a in args if _numeric(a)]
        return bool(numeric) and all(walk(a) for a in numeric)

    return upper(info.metadata) or walk(info.annotation)


def _schema_models() -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    for root in [RunConfig, runtime_config_class(), *map(method_config_class, available())]:
        _models(root, found)
    return found


def test_every_numeric_field_has_an_upper_bound():
    models = _schema_models()
    assert len(models) > 30 and {m.__name__ for m in models} >= {
        "ReceivingOptions", "FedMKTConfig", "TrainingConfig", "ReplyLimits", "KoalaConfig"}
    missing = sorted(f"{m.__name__}.{name}" for m in models
                     for name, info in m.model_fields.items()
                     if _numeric(info.annotation) and not _has_upper(info)
                     and f"{m.__name__}.{name}" not in UNBOUNDED)
    assert not missing, f"numeric fields without an upper bound: {missing}"
    names = {f"{m.__name__}.{n}" for m in models for n in m.model_fields}
    assert names >= UNBOUNDED, f"stale allow-list entries: {sorted(UNBOUNDED - names)}"


@pytest.mark.parametrize("override, key", [
    ("method.receiving.rehearsal_ratio=1e9", "method.receiving.rehearsal_ratio"),
    ("method.temperature=1e30", "method.temperature"),
    ("training.lr=1e6", "training.lr"),
    ("training.local_epochs=1e12", "training.local_epochs"),
    ("rounds=1000000000", "rounds"),
    ("method.top_k=99999999999", "method.top_k"),
    ("clients.num_clients=10000000", "clients.num_clients"),
    ("data.max_public=1000000000000", "data.max_public"),
    ("training.betas=[0.9,1.5]", "training.betas.1"),
    ("seed=-1", "seed"),
])
def test_an_absurd_value_is_a_named_error_within_seconds(override, key):
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:  # server_size: the LLM has records to rehearse on
        load_config(FEDMKT, ["method.knowledge=choices", "data.split.server_size=8", override])
    assert time.monotonic() - start < 5
    lines = str(err.value).splitlines()[1:]
    assert [ln.split(": ")[0].strip() for ln in lines] == [key], str(err.value)


@pytest.mark.parametrize("overrides, key", [
    (["method.receiving.take=confident"], "method.receiving.take"),
    (["method.receiving.anchor_weight=1"], "method.receiving.anchor_weight"),
    (["method.knowledge=choices", "method.teacher=none", "method.receiving.take=confident"],
     "method.receiving.take"),
    (["method.knowledge=choices", "method.receiving.rehearsal_ratio=1"],
     "method.receiving.rehearsal_ratio"),
    (["method.selection=entropy"], "method.selection"),
    (["method.receiving.teacher_confidence=2"], "method.receiving.teacher_confidence"),
    (["clients.models.0.lr=-1"], "clients.models.0.lr"),
])
def test_a_nested_field_is_named_once_and_whole(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(FEDMKT, overrides)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 1, str(err.value)
    named, _, message = lines[0].strip().partition(": ")
    assert named == key, lines[0]
    assert not message.startswith(("method.", key)), lines[0]
