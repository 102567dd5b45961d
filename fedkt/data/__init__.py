"""Data: built-in and user datasets, federated splits, prompts and LM batches."""

from fedkt.data.catalogue import list_builtin
from fedkt.data.dataset import DataError, Dataset
from fedkt.data.formatting import (
    DEFAULT_TEMPLATES,
    choice_view,
    format_prompt,
    lm_pair,
    mc_view,
)
from fedkt.data.lm_batches import (
    IGNORE_INDEX,
    make_batches,
    pad_token_id,
    special_prefix,
    tokenize_pairs,
)
from fedkt.data.readers import register_reader, registered_suffixes
from fedkt.data.records import TASKS, clear_cache, load_dataset_records
from fedkt.data.splits import FederatedData, client_splits, make_splits, partition

__all__ = [
    "DEFAULT_TEMPLATES",
    "IGNORE_INDEX",
    "TASKS",
    "DataError",
    "Dataset",
    "FederatedData",
    "choice_view",
    "clear_cache",
    "client_splits",
    "format_prompt",
    "list_builtin",
    "lm_pair",
    "load_dataset_records",
    "make_batches",
    "make_splits",
    "mc_view",
    "pad_token_id",
    "partition",
    "register_reader",
    "registered_suffixes",
    "special_prefix",
    "tokenize_pairs",
]
