"""Deprecated: fault injection for drills is :mod:`fedkt.runtime.faults`; this module
re-exports its public names and warns on import."""

from __future__ import annotations

import warnings

from fedkt.runtime.faults import (
    CRASH,
    KINDS,
    MALFORMED,
    TARGETS,
    AttackReport,
    FaultyTransport,
    HandlerFaults,
    InjectedFault,
    Plan,
    corrupt,
    fail_handlers,
    failing_handlers,
    hostile_reply,
    parse_handler_faults,
    persistent_plan,
    request_round,
    run_attacks,
    transient_plan,
)

__all__ = [
    "AttackReport",
    "CRASH",
    "FaultyTransport",
    "HandlerFaults",
    "InjectedFault",
    "KINDS",
    "MALFORMED",
    "Plan",
    "TARGETS",
    "corrupt",
    "fail_handlers",
    "failing_handlers",
    "hostile_reply",
    "parse_handler_faults",
    "persistent_plan",
    "request_round",
    "run_attacks",
    "transient_plan",
]

warnings.warn("fedkt.faults is now fedkt.runtime.faults; import it from there",
              DeprecationWarning, stacklevel=2)
