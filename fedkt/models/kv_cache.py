"""A model's key/value cache across transformers 5 releases.

transformers 5.x renamed the forward's ``past_key_values`` argument and output field to
``cache`` (the old name warns, and goes in 5.40).  fedkt passes and reads the cache
under the name of the installed release.
"""

from __future__ import annotations

from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["CACHE_KWARG", "returned_cache"]

#: The forward's keyword for a cache to continue from: ``cache`` where the installed
#: transformers names it so, else ``past_key_values``.
CACHE_KWARG = ("cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__
               else "past_key_values")


def returned_cache(output: Any) -> Any:
    """The key/value cache a forward with ``use_cache=True`` returned."""
    return getattr(output, CACHE_KWARG)
