"""Errors a user's input causes; each message names the key, file or client at fault."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value is missing or not allowed; the message names the key."""
