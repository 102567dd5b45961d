"""Cross-tokenizer alignment for FedMKT (Fan et al., Sec. 3.2 and Appendix B).

* :mod:`~fedkt.alignment.vocab`: MinED vocabulary mapping (source id -> target id).
* :mod:`~fedkt.alignment.sequence`: token-position alignment of two tokenizations.
* :mod:`~fedkt.alignment.topk`: top-K logit transport, projection and sparse KD loss.
"""

from fedkt.alignment.sequence import (
    Alignment,
    align_corpus,
    align_sequences,
    clear_alignment_cache,
    reference_dp_alignment,
)
from fedkt.alignment.topk import PAD_VALUE, TopKLogits, project_topk, sparse_kd_loss
from fedkt.alignment.vocab import (
    VocabScheme,
    brute_force_mapping,
    cache_dir,
    detect_scheme,
    mined_mapping,
    normalize_vocab,
    role_ids,
    space_marker,
    special_ids,
    special_token_mapping,
    token_bytes,
    vocab_hash,
    vocab_mapping,
)

__all__ = [
    "PAD_VALUE",
    "Alignment",
    "TopKLogits",
    "VocabScheme",
    "align_corpus",
    "align_sequences",
    "brute_force_mapping",
    "cache_dir",
    "clear_alignment_cache",
    "detect_scheme",
    "mined_mapping",
    "normalize_vocab",
    "project_topk",
    "reference_dp_alignment",
    "role_ids",
    "space_marker",
    "special_ids",
    "special_token_mapping",
    "sparse_kd_loss",
    "token_bytes",
    "vocab_hash",
    "vocab_mapping",
]
