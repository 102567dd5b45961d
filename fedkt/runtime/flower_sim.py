"""The ``flower-sim`` runtime: the same job in Flower's simulation engine (Ray).

The ServerApp and ClientApp are built in this process around the job's config
(no FAB, no SuperLink): ``num_clients`` virtual SuperNodes whose
``partition-id`` is the fedkt client id, each client running in a Ray actor
with ``runtime.flower_sim.client_cpus`` CPUs and ``runtime.flower_sim.client_gpus`` GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only annotations here: `fedkt --help` and `fedkt list` skip the schema
    from fedkt.config import RunConfig

log = logging.getLogger("fedkt.runtime.flower")

# Flower settings fedkt applies unless the user set them.
FLOWER_ENV_DEFAULTS = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


@contextlib.contextmanager
def flower_env(prefix: str = "fedkt-flwr-") -> Iterator[Path]:
    """Set Flower's environment defaults, with a temporary ``FLWR_HOME`` if none is set.

    Yields the ``FLWR_HOME`` in use; restores the environment afterwards.
    """
    saved = {k: os.environ.get(k) for k in (*FLOWER_ENV_DEFAULTS, "FLWR_HOME")}
    with contextlib.ExitStack() as stack:
        for key, value in FLOWER_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        if not os.environ.get("FLWR_HOME"):
            os.environ["FLWR_HOME"] = stack.enter_context(
                tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True))
        try:
            yield Path(os.environ["FLWR_HOME"])
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# Under an address-space limit (``ulimit -v``): the least a Ray worker that imports torch
# and a model needs beside the object store, and the share of the limit the store may take
# (every worker maps the whole store; Ray's default, 30% of the RAM, left a worker of a
# 24 GB machine under an 8 GB limit unable to map libtorch, and the run hung).
MIN_ADDRESS_SPACE = 3 << 30
RAY_MIN_OBJECT_STORE = 80 << 20


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes (``ulimit -v``), None if unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def backend_config(cfg: RunConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Ray backend settings: per-client resources and a small Ray instance.

    ``quiet``: the workers' output is not relayed (client errors still reach the
    server in the replies).  Under an address-space limit the object store takes an
    eighth of it (workers inherit the limit and each maps the whole store); a limit below
    :data:`MIN_ADDRESS_SPACE` is refused here, before Ray starts."""
    rt = cfg.runtime.flower_sim
    cpus = os.cpu_count() or 1
    want = math.ceil(rt.client_cpus * cfg.clients.num_clients)
    init_args: dict[str, Any] = {
        # No more CPUs than the clients can use, but at least one client's worth.
        "num_cpus": max(math.ceil(rt.client_cpus), min(cpus, want)),
        "include_dashboard": False,
        "logging_level": "ERROR",
        "log_to_driver": not quiet,
    }
    if rt.client_gpus == 0:
        init_args["num_gpus"] = 0
    limit = address_space_limit()
    if limit is not None:
        if limit < MIN_ADDRESS_SPACE:
            from fedkt.errors import ConfigError

            raise ConfigError(
                f"runtime.name: flower-sim needs an address-space limit (ulimit -v) of at "
                f"least {MIN_ADDRESS_SPACE >> 30} GiB for its Ray workers; this process has "
                f"{limit / 2**30:.1f} GiB. Raise the limit, or use runtime.name: local")
        init_args["object_store_memory"] = max(RAY_MIN_OBJECT_STORE, limit // 8)
    return {
        "client_resources": {"num_cpus": rt.client_cpus, "num_gpus": rt.client_gpus},
        "init_args": init_args,
    }


def read_run_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of a run folder's metrics file (none if it has none)."""
    from fedkt.tracking.folder import METRICS_FILE
    from fedkt.tracking.rows import read_rows

    path = Path(run_dir) / METRICS_FILE
    return read_rows(path) if path.exists() else []


@contextlib.contextmanager
def replacing_dead_actors() -> Iterator[None]:
    """While the block runs, a Ray actor whose process died is replaced by a fresh one.

    Flower's actor pool (flwr 1.41) puts the actor of a failed request back into the pool
    even when its process died (a client's ``os._exit``, the OOM killer), so every later
    request sent to it fails too: one dead client process excluded three clients of four.
    Here the failed request's client alone is excluded (its reply is an error naming it),
    and the next request gets a new actor."""
    import ray
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    fetch = BasicActorPool.fetch_result_and_return_actor_to_pool

    def fetch_replacing(self: BasicActorPool, future: Any) -> Any:
        try:
            return fetch(self, future)
        except ray.exceptions.RayActorError:
            if future in self._future_to_actor:  # the caller puts this actor back
                log.warning("a simulated client's process died; starting a new one")
                self._future_to_actor[future] = self.create_actor_fn()
            raise

    BasicActorPool.fetch_result_and_return_actor_to_pool = fetch_replacing
    try:
        yield
    finally:
        BasicActorPool.fetch_result_and_return_actor_to_pool = fetch


class _DropDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "run_simulation` function is deprecated" not in record.getMessage()


def run_simulation_job(cfg: RunConfig, job: Any, *, resume: bool = False,
                       quiet: bool = False) -> list[dict[str, Any]]:
    """Run (or resume) ``job`` (the runner passes :func:`fedkt.runtime.job.run_job`) in
    Flower's simulation engine; returns its metrics rows."""
    from flwr.app import Context
    from flwr.serverapp import Grid
    from flwr.simulation import run_simulation

    from fedkt.runtime.base import default_state_root
    from fedkt.runtime.flower_app import (
        GridTransport,
        make_client_app,
        make_server_app,
        method_plugins,
    )

    num = cfg.clients.num_clients
    rows: list[list[dict[str, Any]]] = []

    def server_main(grid: Grid, context: Context) -> None:
        transport = GridTransport(grid, num, connect_timeout=max(300.0, cfg.runtime.timeout),
                                  ids=cfg.client_ids())
        try:
            rows.append(job(cfg, transport, resume=resume, quiet=quiet))
        finally:
            transport.close()

    server_app = make_server_app(server_main)
    # Absolute, in case a Ray worker runs in another working directory.
    # The simulated clients run the config of the one who starts the simulation: they run
    # the model code it asks for, as the local runtime's clients do.
    client_app = make_client_app(state_root=default_state_root(cfg).absolute(),
                                 plugins=method_plugins(cfg.method.name), allow_remote_code=True)
    # Flower logs through its own handler; keep its DEBUG records out of the root logger's.
    flwr_logger = logging.getLogger("flwr")
    quiet_filter, propagate = _DropDeprecation(), flwr_logger.propagate
    flwr_logger.addFilter(quiet_filter)
    flwr_logger.propagate = False
    try:
        with flower_env(), replacing_dead_actors(), warnings.catch_warnings():
            # Ray's notice about a future default; fedkt relies on today's (no GPU when 0).
            warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO",
                                    category=FutureWarning)
            run_simulation(server_app=server_app, client_app=client_app, num_supernodes=num,
                           backend_config=backend_config(cfg, quiet=quiet))
    finally:
        flwr_logger.removeFilter(quiet_filter)
        flwr_logger.propagate = propagate
    return rows[0] if rows else read_run_rows(cfg.run_dir)
