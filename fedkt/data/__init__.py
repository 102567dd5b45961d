"""Data: built-in and user datasets, federated splits, prompts and LM batches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedkt.infra.lazy import lazy_exports

# Names are imported on first use, so that ``import fedkt.data.builtin`` (``fedkt
# list``) does not pay for the config schema, the readers and the image loaders.
_EXPORTS: dict[str, str] = {
    "list_builtin": "builtin",
    "DataError": "dataset",
    "Dataset": "dataset",
    "DEFAULT_TEMPLATES": "formatting",
    "choice_view": "formatting",
    "format_prompt": "formatting",
    "lm_pair": "formatting",
    "mc_view": "formatting",
    "IGNORE_INDEX": "lm_batches",
    "make_batches": "lm_batches",
    "pad_token_id": "lm_batches",
    "special_prefix": "lm_batches",
    "tokenize_pairs": "lm_batches",
    "register_reader": "readers",
    "registered_suffixes": "readers",
    "TASKS": "records",
    "clear_cache": "records",
    "load_dataset_records": "records",
    "FederatedData": "splits",
    "client_splits": "splits",
    "make_splits": "splits",
    "partition": "splits",
}

if TYPE_CHECKING:
    from fedkt.data.builtin import list_builtin
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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


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
