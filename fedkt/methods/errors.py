"""Errors of a round, importable without torch (the CLI catches them on every command)."""

from __future__ import annotations


class RoundError(RuntimeError):
    """A call could not complete: fewer clients replied than ``clients.min_replies``."""
