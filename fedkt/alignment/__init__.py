"""Cross-tokenizer alignment (FedMKT, Fan et al., Sec. 3.2 and Appendix B; FedCoLLM).

* :mod:`~fedkt.alignment.vocab`: MinED vocabulary mapping (source id -> target id), from
  :mod:`~fedkt.alignment.introspect` (how a tokenizer writes its vocabulary: scheme,
  normalised strings, bytes, hash, special tokens) and :mod:`~fedkt.alignment.mined`
  (the MinED engine: nearest string by edit distance).
* :mod:`~fedkt.alignment.sequence`: token-position alignment of two tokenizations.
* :mod:`~fedkt.alignment.bridge`: :class:`TokenBridge`, one model's ids and positions in
  another's (both maps, cached), and the KL between their distributions.
* :mod:`~fedkt.alignment.topk`: top-K logit transport, projection, sparse KD / KL losses.
* :mod:`~fedkt.alignment.knowledge`: knowledge sets on a public set and their wire format.
* :mod:`~fedkt.alignment.targets`: KD targets built from received knowledge sets.
"""

from fedkt.alignment.bridge import TokenBridge
from fedkt.alignment.introspect import (
    VocabScheme,
    detect_scheme,
    normalize_vocab,
    role_ids,
    space_marker,
    special_ids,
    token_bytes,
    vocab_hash,
)
from fedkt.alignment.mined import brute_force_mapping, mined_mapping
from fedkt.alignment.sequence import (
    Alignment,
    align_corpus,
    align_sequences,
    clear_alignment_cache,
    reference_dp_alignment,
)
from fedkt.alignment.topk import PAD_VALUE, TopKLogits, project_topk, sparse_kd_loss, sparse_kl
from fedkt.alignment.vocab import special_token_mapping, vocab_mapping
from fedkt.infra.cache import cache_dir

__all__ = [
    "PAD_VALUE",
    "Alignment",
    "TokenBridge",
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
    "sparse_kl",
    "token_bytes",
    "vocab_hash",
    "vocab_mapping",
]
