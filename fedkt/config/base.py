"""The base of every config model: strict (unknown keys, NaN and inf are refused), and
a field a subclass declares again without a description keeps its parent's."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fedkt.config.runtime_settings import STRICT


class _Strict(BaseModel):
    model_config = STRICT  # unknown keys, NaN and inf are refused

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A field a subclass declares again (another default) without a description keeps
        its parent's (``FedPromptConfig.distill``, every method's ``name``)."""
        super().__pydantic_init_subclass__(**kwargs)
        for name, info in cls.model_fields.items():
            if info.description:
                continue
            for base in cls.__mro__[1:]:
                parent = getattr(base, "__pydantic_fields__", {}).get(name)
                if parent is not None and parent.description:
                    info.description = parent.description
                    break
