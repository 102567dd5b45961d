"""The model families the baselines run on: what they build, keep, train and score.

A :class:`Family` is the small protocol the baselines (:mod:`.algorithm`) need, so that
one zero-shot, one standalone and one centralized procedure serve every kind of model:

* :data:`LM`: a causal LM with its PEFT adapter (:mod:`fedkt.train.lm`);
* :data:`ENCODER`: a text classifier, optionally cut to its first N layers
  (:mod:`fedkt.train.encoder`; FedKD's baselines).

A baseline's config names its family (``family: ClassVar[str]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor, nn

from fedkt.config import RunConfig
from fedkt.infra.placement import client_device, server_device
from fedkt.train.encoder import (
    build_encoder,
    check_text_classification,
    encoder_config,
    evaluate_encoder,
    load_trainable,
    train_encoder,
    trainable_state,
)
from fedkt.train.lm import LM, client_lm, evaluate_lm, server_lm, train_lm

if TYPE_CHECKING:
    from fedkt.data.splits import FederatedData

__all__ = ["ENCODER", "LM_FAMILY", "Classifier", "Family", "family_of", "train_metrics"]

State = dict[str, Tensor]


class Family(Protocol):
    """Build, keep, train and score one kind of model."""

    # The name a client keeps its trained state under (its disk, ``ctx.save_state``).
    kept: str

    def check(self, cfg: RunConfig) -> None:
        """Refuse a run this family cannot do (e.g. a task it has no head for)."""

    def build(self, cfg: RunConfig, cid: int | None, data: FederatedData) -> Any:
        """Client ``cid``'s model, or with ``None`` the server's own (``None``: it has none);
        ``data``: the run's data."""

    def state(self, model: Any) -> State:
        """The trainable weights (what is kept or travels)."""

    def load(self, model: Any, state: State) -> Any:
        """Write ``state`` into ``model``; return it."""

    def train(self, cfg: RunConfig, model: Any, records: list[dict], *, data: FederatedData,
              seed: int, desc: str) -> dict[str, float]:
        """Local training on ``records`` (of ``data``, the run's data): at least ``loss``,
        ``steps``, ``num_examples``."""

    def evaluate(self, cfg: RunConfig, model: Any, records: list[dict], *,
                 data: FederatedData) -> dict[str, float]:
        """Test metrics of ``model`` on ``records`` (of ``data``, the run's data)."""

    def as_lm(self, model: Any) -> LM | None:
        """The model as a causal LM for evaluators outside the round (None: not one)."""


def train_metrics(stats: dict[str, float]) -> dict[str, float]:
    """``train/*`` metrics of a family's training stats."""
    return {f"train/{k}": stats[k] for k in ("loss", "steps", "step_seconds") if k in stats}


class _LMFamily:
    kept = "adapter"

    def check(self, cfg: RunConfig) -> None:
        pass

    def build(self, cfg: RunConfig, cid: int | None, data: FederatedData) -> LM | None:
        if cid is None:
            return server_lm(cfg, data) if cfg.server else None
        return client_lm(cfg, cid, data)

    def state(self, model: LM) -> State:
        return model.trainable()

    def load(self, model: LM, state: State) -> LM:
        return model.reset(state)

    def train(self, cfg: RunConfig, model: LM, records: list[dict], *, data: FederatedData,
              seed: int, desc: str) -> dict[str, float]:
        return train_lm(cfg, model, records, data=data, seed=seed, desc=desc)

    def evaluate(self, cfg: RunConfig, model: LM, records: list[dict], *,
                 data: FederatedData) -> dict[str, float]:
        return evaluate_lm(cfg, model, records, data=data)

    def as_lm(self, model: LM) -> LM:
        return model


@dataclass
class Classifier:
    """A text classifier and its tokenizer."""

    model: nn.Module
    tokenizer: Any


class _EncoderFamily:
    kept = "model"

    @staticmethod
    def _labels(cfg: RunConfig) -> int:
        """The task's number of classes; a ConfigError when it is not text classification."""
        from fedkt.data.splits import run_data

        return check_text_classification(run_data(cfg.data, cfg.clients.num_clients, cfg.seed),
                                         cfg.method.name)

    def check(self, cfg: RunConfig) -> None:
        self._labels(cfg)

    def build(self, cfg: RunConfig, cid: int | None, data: FederatedData) -> Classifier:
        """``clients.models[0]`` with its head; ``method.layers``: its first N layers."""
        m = cfg.method
        labels = self._labels(cfg)
        return Classifier(*build_encoder(encoder_config(cfg), labels, cfg.seed, layers=m.layers,
                                         freeze_embeddings=m.freeze_embeddings,
                                         pooling=m.pooling,
                                         device=server_device(cfg) if cid is None
                                         else client_device(cfg, cid)))

    def state(self, model: Classifier) -> State:
        return trainable_state(model.model)

    def load(self, model: Classifier, state: State) -> Classifier:
        load_trainable(model.model, state)
        return model

    def train(self, cfg: RunConfig, model: Classifier, records: list[dict], *,
              data: FederatedData, seed: int, desc: str) -> dict[str, float]:
        return train_encoder(cfg, model.model, model.tokenizer, records, seed=seed)

    def evaluate(self, cfg: RunConfig, model: Classifier, records: list[dict], *,
                 data: FederatedData) -> dict[str, float]:
        return evaluate_encoder(cfg, model.model, model.tokenizer, records)

    def as_lm(self, model: Classifier) -> None:
        return None


LM_FAMILY: Family = _LMFamily()
ENCODER: Family = _EncoderFamily()
_FAMILIES: dict[str, Family] = {"lm": LM_FAMILY, "encoder": ENCODER}


def family_of(cfg: RunConfig) -> Family:
    """The family a baseline's config names (``family``)."""
    return _FAMILIES[type(cfg.method).family]
