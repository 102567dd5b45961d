"""Errors a user's input causes; each message names the key, file or client at fault."""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value is missing or not allowed; the message names the key."""


class CheckpointError(ValueError):
    """A run folder cannot be resumed as it is; the message names the file at fault.

    Raised before anything in the folder is changed."""
