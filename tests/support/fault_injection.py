"""Client failures for tests: client CID's handlers raise in round ROUND.

:func:`client_faults` installs :func:`fedkt.runtime.faults.fail_handlers` for a ``with`` block:
in this process (the ``local`` runtime, SecAgg+ on it, the CLI run in-process) and, with
``workers=True``, in the worker processes of Flower's simulation engine too, which
import :func:`install` as a plugin (``FEDKT_PLUGINS``) and read the faults from
:data:`ENV`.  Deployed SuperNodes are separate programs: tests make their clients fail
through the method's config instead (the probe method's ``fail_client``,
``tests/runtime/test_flower_sim.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from fedkt.runtime.faults import fail_handlers, failing_handlers

ENV = "FEDKT_TEST_HANDLER_FAULTS"  # read by this module only, in simulation workers
PLUGINS_ENV = "FEDKT_PLUGINS"  # fedkt.runtime.flower_app.PLUGINS_ENV (not imported: no flwr)
PLUGIN = f"{__name__}:install"


@contextmanager
def client_faults(method: str, spec: str, *, workers: bool = False) -> Iterator[None]:
    """Client CID's handlers of ``method`` raise ``InjectedFault`` ("injected fault: ...")
    in round ROUND, for each ``CID:ROUND`` of ``spec`` (comma-separated), until the block
    ends; ``workers``: also in Flower simulation workers started within the block."""
    env = {}
    if workers:
        env = {ENV: json.dumps({"method": method, "faults": spec}),
               PLUGINS_ENV: ",".join(filter(None, [os.environ.get(PLUGINS_ENV), PLUGIN]))}
    with mock.patch.dict(os.environ, env), failing_handlers(method, spec):
        yield


def install() -> None:
    """The plugin a simulation worker runs before each request: the faults :data:`ENV`
    names (installing them again replaces them)."""
    given = os.environ.get(ENV)
    if given:
        spec = json.loads(given)
        fail_handlers(spec["method"], spec["faults"])
