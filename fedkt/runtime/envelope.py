"""Reserved keys of the payloads the runtime wraps around a method's, and the error a
client's failed handler becomes on the server (shared by every transport)."""

from __future__ import annotations

__all__ = ["ENVELOPE", "ERROR", "PREDICTIONS", "ClientFailure", "TransportError"]

ENVELOPE = "_fedkt"  # reserved payload key carrying the call's metadata
ERROR = "_error"  # reserved reply key: the client's handler raised
PREDICTIONS = "_predictions"  # reserved reply key: per-example predictions (evaluation calls)


class TransportError(RuntimeError):
    """A transport could not start or reach its peers (e.g. no SuperLink)."""


class ClientFailure(RuntimeError):
    """The client's handler raised; the message carries its error."""
