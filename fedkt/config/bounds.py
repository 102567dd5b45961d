"""The config's shared numeric types: each bounds a kind of option on both sides, so a
value that is absurd, or that would make a run hang or overflow (``temperature: 1e30``,
``rehearsal_ratio: 1e9``), is refused by name while the config loads, before any model.

The upper bounds are far above any setting that makes sense and low enough that the
arithmetic the option takes part in stays finite (a temperature's ``T**2`` in fp32) and
the work it asks for stays bounded. ``tests/config/test_bounds.py`` checks that every
numeric key of the schema has an upper bound.
"""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Gt, Le, Lt

__all__ = [
    "MAX_BATCH", "MAX_CLIENTS", "MAX_COUNT", "MAX_EPOCHS", "MAX_LAYERS", "MAX_LR",
    "MAX_REHEARSAL", "MAX_ROUNDS", "MAX_SEED", "MAX_STEPS", "MAX_TEMPERATURE", "MAX_TOKENS",
    "MAX_TOP_K", "MAX_WEIGHT", "Beta", "BatchSize", "Clients", "Count", "Epochs", "Layers",
    "LearningRate", "Rounds", "Seed", "StepCount", "Steps", "Temperature", "Tokens", "TopK",
    "Weight",
]

MAX_TEMPERATURE = 100.0  # T**2 = 1e4: softmax and the T**2 factor stay finite in fp16
MAX_LR = 10.0
MAX_EPOCHS = 1000.0
MAX_STEPS = 1_000_000
MAX_BATCH = 65_536
MAX_TOP_K = 1 << 20  # above every vocabulary (Gemma's 256k)
MAX_COUNT = 1_000_000_000  # records, samples, documents
MAX_WEIGHT = 1000.0  # a loss term's weight
MAX_ROUNDS = 100_000
MAX_CLIENTS = 100_000
MAX_LAYERS = 1024
MAX_TOKENS = 1 << 20
MAX_REHEARSAL = 16.0  # rehearsal steps per distillation step
MAX_SEED = 2**32 - 1  # numpy's seeds are 32-bit words

Temperature = Annotated[float, Gt(0), Le(MAX_TEMPERATURE)]
LearningRate = Annotated[float, Gt(0), Le(MAX_LR)]
Epochs = Annotated[float, Gt(0), Le(MAX_EPOCHS)]
Steps = Annotated[int, Ge(1), Le(MAX_STEPS)]
StepCount = Annotated[int, Ge(0), Le(MAX_STEPS)]  # steps, where 0 skips the stage
BatchSize = Annotated[int, Ge(1), Le(MAX_BATCH)]
TopK = Annotated[int, Ge(1), Le(MAX_TOP_K)]
Count = Annotated[int, Ge(1), Le(MAX_COUNT)]
Weight = Annotated[float, Ge(0), Le(MAX_WEIGHT)]
Rounds = Annotated[int, Ge(1), Le(MAX_ROUNDS)]
Clients = Annotated[int, Ge(1), Le(MAX_CLIENTS)]
Layers = Annotated[int, Ge(1), Le(MAX_LAYERS)]
Tokens = Annotated[int, Ge(1), Le(MAX_TOKENS)]
Seed = Annotated[int, Ge(0), Le(MAX_SEED)]
Beta = Annotated[float, Ge(0), Lt(1)]  # an Adam moment's decay
