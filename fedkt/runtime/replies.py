"""What a client sends back, checked before the server uses any of it.

A reply (after :func:`fedkt.federated.payload.loads`) holds the method's fields and the runtime's
own: the envelope (``_fedkt``: seconds, compute, cpu and the handler's ``*_seconds``
timings), ``metrics`` and, in evaluation calls, ``_predictions``.  Clients are not
trusted: :func:`check_reply` checks the type, shape and size of every runtime field (and
the bound on ``num_examples``) and raises :class:`~fedkt.federated.payload.PayloadError` naming the
client and the field, which excludes that client from the round.  Nothing of a reply is
used before the whole of it passed.

Metric names are checked too: a client cannot name a metric after a key the server
writes in its rows (:data:`SERVER_ROW_KEYS`).  Numbers must be plausible, not only finite:
accuracies and F1 in [0, 1], Rouge in [0, 100], losses (metrics such as ``train/loss``, and
any method field named ``*loss``) in [0, :data:`MAX_LOSS`], any other metric within
``±``:data:`MAX_METRIC`.  The checked metrics go on to the method (its payload's
``metrics``), so a reported number travels once: the rows and the server read the same.
A client's error text is escaped (:func:`error_text`) before anyone logs it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from fedkt.config import ReplyLimits
from fedkt.federated.payload import Payload, PayloadError
from fedkt.runtime.envelope import ENVELOPE, ERROR, PREDICTIONS

__all__ = ["MAX_LOSS", "MAX_METRIC", "MAX_SECONDS", "SERVER_ROW_KEYS", "CheckedReply",
           "check_reply", "error_text", "printable"]

# Keys of a metrics row that the server writes; no client metric may carry these names.
SERVER_ROW_KEYS = frozenset({
    "round", "participant", "split", "excluded", "bytes_sent", "bytes_received",
    "eval_bytes", "clients_replied", "wall_time", "compute_time", "compute_cpu",
})
# A reported duration above this (about 116 days) is not a duration.
MAX_SECONDS = 1e7
# The envelope keys a reply may carry, and their kinds.
_ENVELOPE_SECONDS = ("seconds", "compute", "cpu")
_ENVELOPE_KEYS = frozenset({*_ENVELOPE_SECONDS, "timings"})
# ``split/name`` or ``name``: short, printable, one slash at most.
_SPLIT = re.compile(r"[A-Za-z0-9_-]{1,32}")
_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,100}")
_ERROR_CHARS = 2000  # the longest client error text kept
# Plausible ranges of reported numbers, by the metric's (or method field's) name.
MAX_LOSS = 1e9  # a loss above this is no training loss
MAX_METRIC = 1e15  # any other metric (counts, ratios, bytes) beyond this is no measurement
_LOSS_SLACK = 1e-6  # a loss this far below 0 is rounding (a KL divergence), kept as is
_RANGES = (
    (re.compile(r"(^|_)(accuracy|accuracy_norm|acc|acc_norm|f1)$"), 0.0, 1.0),
    (re.compile(r"(^|_)rouge\w*$"), 0.0, 100.0),
    (re.compile(r"loss$"), 0.0, MAX_LOSS),
)


@dataclass
class CheckedReply:
    """A reply's runtime fields, checked: numbers only, finite and in range."""

    payload: Payload  # the method's fields and its checked ``metrics`` (no envelope, no predictions)
    seconds: float = 0.0
    compute: float = 0.0
    cpu: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    predictions: torch.Tensor | None = None


def printable(text: str) -> str:
    """``text`` with every character that is not printable (ESC, CR, LF, other control and
    format characters such as U+202E) written as its Python escape (``\\x1b``): text from a
    client cannot move the cursor, forge a log line or reorder what a terminal shows."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def error_text(value: Any) -> str:
    """A client's ``_error`` (or a reason quoting it) as bounded, escaped text."""
    text = value if isinstance(value, str) else f"(not text) {type(value).__name__}"
    return printable(text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + "...")


def _plausible(name: str, value: Any, what: str) -> float:
    """A reported number named ``name`` (a metric's name, or a method field such as
    ``train_loss``) as a finite float within its plausible range (:data:`_RANGES`)."""
    for pattern, low, high in _RANGES:
        if pattern.search(name):
            number = _number(value, what)
            if high == MAX_LOSS and -_LOSS_SLACK <= number < 0:
                return number
            return _number(number, what, low=low, high=high)
    return _number(value, what, low=-MAX_METRIC, high=MAX_METRIC)


def _number(value: Any, what: str, *, text: bool = False, low: float | None = None,
            high: float | None = None, bound: str = "") -> float:
    """``value`` as a finite float in [low, high]; ``text``: fixed-width text allowed;
    ``bound``: the config key that sets ``high``, named in the error."""
    if text and isinstance(value, str) and len(value) <= 32:
        try:
            value = float(value)
        except ValueError:
            raise PayloadError(f"{what} should be a finite number, got {value[:32]!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        shown = repr(value)[:40] if isinstance(value, str) else f"a {type(value).__name__}"
        raise PayloadError(f"{what} should be a finite number, got {shown}")
    if isinstance(value, int) and abs(value) >= 2**1024:
        raise PayloadError(f"{what} should be a finite number, got an int too large to use")
    number = float(value)
    if not math.isfinite(number):
        raise PayloadError(f"{what} should be a finite number, got {number}")
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"[{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
        raise PayloadError(f"{what} = {number:g} is outside {bounds}"
                           + (f" ({bound})" if bound else ""))
    return number


def _metric_name(key: Any, what: str) -> str:
    """A metric key ``split/name`` or ``name``, whose name is no server row key."""
    if not isinstance(key, str):
        raise PayloadError(f"{what}: a metric name must be text")
    split, _, name = key.rpartition("/")
    if not _NAME.fullmatch(name) or (split and not _SPLIT.fullmatch(split)):
        raise PayloadError(f"{what}: metric name {key[:60]!r} is not 'split/name' of letters, "
                           "digits and _ . : @ + -")
    if name in SERVER_ROW_KEYS:
        raise PayloadError(f"{what}: metric {key!r} would overwrite the server's row key "
                           f"{name!r}")
    return key


def _metrics(value: Any, source: str, limits: ReplyLimits) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"{source}: field 'metrics' should be a mapping of names to numbers, "
                           f"got {type(value).__name__}")
    if len(value) > limits.metrics:
        raise PayloadError(f"{source}: field 'metrics' has {len(value)} entries, more than "
                           f"runtime.limits.metrics = {limits.metrics}")
    return {_metric_name(k, f"{source}: field 'metrics'"):
            _plausible(k.rpartition("/")[2], v, f"{source}: field 'metrics'[{k!r}]")
            for k, v in value.items()}


def _envelope(value: Any, source: str, limits: ReplyLimits) -> tuple[list[float],
                                                                        dict[str, float]]:
    """(seconds, compute, cpu) and the ``*_seconds`` timings of a reply's envelope."""
    what = f"{source}: field {ENVELOPE!r}"
    if value is None:
        return [0.0, 0.0, 0.0], {}
    if not isinstance(value, dict):
        raise PayloadError(f"{what} should be a mapping, got {type(value).__name__}")
    extra = sorted(str(k)[:40] for k in value if k not in _ENVELOPE_KEYS)
    if extra:
        raise PayloadError(f"{what} has unexpected keys {extra[:5]}")
    seconds = [_number(value.get(k, 0.0), f"{what}[{k!r}]", text=True, low=0.0, high=MAX_SECONDS)
               for k in _ENVELOPE_SECONDS]
    timings = value.get("timings") or {}
    if not isinstance(timings, dict):
        raise PayloadError(f"{what}['timings'] should be a mapping, got "
                           f"{type(timings).__name__}")
    if len(timings) > limits.metrics:
        raise PayloadError(f"{what}['timings'] has {len(timings)} entries, more than "
                           f"runtime.limits.metrics = {limits.metrics}")
    out = {}
    for k, v in timings.items():
        name = _metric_name(k, f"{what}['timings']")
        if not name.endswith("_seconds"):
            raise PayloadError(f"{what}['timings']: {name!r} is not a '*_seconds' timing")
        out[name] = _number(v, f"{what}['timings'][{name!r}]", text=True, low=0.0,
                            high=MAX_SECONDS)
    return seconds, out


def check_reply(reply: Payload, cid: int, limits: ReplyLimits) -> CheckedReply:
    """Check a parsed reply's runtime fields (and ``num_examples``) before any use.

    Returns the method's fields and the checked runtime values; raises
    :class:`PayloadError` naming client ``cid`` and the field.  A reply carrying an
    ``_error`` is not checked here (the caller turns it into the client's failure).
    """
    source = f"client {cid}"
    if ERROR in reply:
        raise PayloadError(f"{source}: an error reply goes to error_text, not check_reply")
    (seconds, compute, cpu), timings = _envelope(reply.get(ENVELOPE), source, limits)
    metrics = _metrics(reply.get("metrics"), source, limits)
    if len(metrics) + len(timings) > limits.metrics:
        raise PayloadError(f"{source}: {len(metrics) + len(timings)} metrics and timings, more "
                           f"than runtime.limits.metrics = {limits.metrics}")
    for key in reply:  # a method's reported losses (``train_loss``): numbers, plausible
        if isinstance(key, str) and key.endswith("loss"):
            _plausible(key, reply[key], f"{source}: field {key!r}")
    if "num_examples" in reply:
        _number(reply["num_examples"], f"{source}: field 'num_examples'", low=0.0,
                high=float(limits.num_examples), bound="runtime.limits.num_examples")
    blob = reply.get(PREDICTIONS)
    if blob is not None and isinstance(blob, torch.Tensor) \
            and blob.numel() > limits.predictions_bytes:
        raise PayloadError(f"{source}: field {PREDICTIONS!r} has {blob.numel()} bytes, more "
                           f"than runtime.limits.predictions_bytes = {limits.predictions_bytes}")
    payload = Payload({k: v for k, v in reply.items()
                       if k not in (ENVELOPE, PREDICTIONS, "metrics")})
    if metrics:  # the method reads its reported numbers from here (mean_metric), checked
        payload["metrics"] = dict(metrics)
    return CheckedReply(payload, seconds, compute, cpu, {**metrics, **timings}, blob)
