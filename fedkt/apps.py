"""The deployed Flower App's components: ``server_app`` and ``client_app``.

A FAB (``flower_app/pyproject.toml``, or the one ``fedkt run`` writes for
``runtime.name: flower``) names ``fedkt.apps:server_app`` and ``fedkt.apps:client_app``.
The ServerApp reads the fedkt config from Flower's run config and runs
:func:`fedkt.runtime.job.run_job` on the SuperLink's grid; the ClientApp answers as a fedkt
client (:func:`fedkt.runtime.flower_app.make_client_app`).  They are entry points (a FAB
names them), at the top of the package beside ``fedkt.cli``.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid

from fedkt.config import load_config, parse_config
from fedkt.infra.plugins import import_plugins
from fedkt.runtime.flower_app import (
    CFG_CONNECT_TIMEOUT,
    CFG_PATH,
    CFG_PLUGINS,
    CFG_QUIET,
    CFG_RESUME,
    CFG_YAML,
    DEFAULT_CONNECT_TIMEOUT,
    GridTransport,
    make_client_app,
    make_server_app,
)
from fedkt.runtime.job import run_job

__all__ = ["client_app", "server_app", "server_job"]


def server_job(grid: Grid, context: Context) -> list[dict[str, Any]]:
    """The deployed ServerApp's main: read the fedkt config from the run config and run it."""
    rc = context.run_config
    import_plugins(str(rc.get(CFG_PLUGINS, "")))
    text = str(rc.get(CFG_YAML, "") or "")
    if text:
        from fedkt.config.load import read_yaml

        cfg = parse_config(read_yaml(text, "<flwr run config>"), "<flwr run config>")
    elif rc.get(CFG_PATH):
        cfg = load_config(str(rc[CFG_PATH]))
    else:
        raise ValueError(f"the Flower run config has neither {CFG_YAML!r} nor {CFG_PATH!r}")
    transport = GridTransport(grid, cfg.clients.num_clients, ids=cfg.client_ids(),
                              connect_timeout=float(rc.get(CFG_CONNECT_TIMEOUT,
                                                           DEFAULT_CONNECT_TIMEOUT)))
    try:
        return run_job(cfg, transport, resume=bool(rc.get(CFG_RESUME, False)),
                       quiet=bool(rc.get(CFG_QUIET, False)))
    finally:
        transport.close()


#: The FAB's ``serverapp`` component (reads the job from the Flower run config).
server_app = make_server_app(server_job)
#: The FAB's ``clientapp`` component.
client_app = make_client_app()
