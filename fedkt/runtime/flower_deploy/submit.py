"""Submitting a job with ``flwr run``: the Flower App (FAB) around fedkt's ServerApp and
ClientApp, the CLI's connection config, the streamed log and the rows the run wrote."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkt.runtime.flower_deploy.processes import (
    CONNECTION,
    DeploymentError,
    _existing_file,
    _tls_hint,
    flower_child_env,
)
from fedkt.runtime.flower_sim import read_run_rows

if TYPE_CHECKING:  # only annotations here: `fedkt --help` and `fedkt list` skip the schema
    from fedkt.config import RunConfig

APP_PYPROJECT = """\
# The Flower App (FAB) that `fedkt run --set runtime.name=flower` submits to a SuperLink.
# Its code is the installed fedkt package; `fedkt.runtime.flower_deploy` writes this
# same file when it submits a job (a test checks the two agree).
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedkt-app"
version = "0.1.0"
description = "fedkt jobs on a Flower federation (server LLM <-> client SLMs)"
license = "Apache-2.0"
dependencies = ["flwr>=1.41.0", "fedkt"]

[tool.flwr.app]
publisher = "fedkt"

[tool.flwr.app.components]
serverapp = "fedkt.apps:server_app"
clientapp = "fedkt.apps:client_app"

[tool.flwr.app.config]
# The job: its YAML text (set by `fedkt run`) or a path readable by the ServerApp.
fedkt-config = ""
fedkt-config-path = ""
resume = false
quiet = false
# Modules (or module:function) registering methods defined outside fedkt.
fedkt-plugins = ""
# Seconds the ServerApp waits for a SuperNode per client id.
connect-timeout = 600.0
"""


def write_app(folder: Path | str) -> Path:
    """Write the fedkt Flower App (its pyproject.toml) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT)
    return folder


def write_cli_config(flwr_home: Path | str, superlink: str, *, insecure: bool = True,
                     federation: str | None = None, root_certificates: str | None = None) -> Path:
    """A Flower CLI config whose default connection is ``superlink``."""
    import tomli_w

    conn: dict[str, Any] = {"address": superlink, "insecure": insecure}
    if federation:
        conn["federation"] = federation
    if root_certificates and not insecure:
        # Flower wants an absolute path.
        conn["root-certificates"] = _existing_file(root_certificates,
                                                   "runtime.flower.root_certificates")
    path = Path(flwr_home) / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: conn}}))
    return path


def deployable_config(cfg: RunConfig) -> RunConfig:
    """The job with an absolute output folder, so the ServerApp writes where we read."""
    out = cfg.model_copy(deep=True)
    out.output_dir = str(Path(cfg.output_dir).expanduser().absolute())
    return out


def flwr_run_command(app_dir: Path | str, overrides_file: Path | str) -> list[str]:
    """``flwr run`` on the ``fedkt`` connection (which names the federation, if any)."""
    return ["flwr", "run", str(app_dir), CONNECTION, "--run-config", str(overrides_file),
            "--stream"]


@contextlib.contextmanager
def _cli_home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fedkt-flwr-cli-", ignore_cleanup_errors=True) as d:
        yield Path(d)


def submit_job(cfg: RunConfig, job: Any = None, *, resume: bool = False, quiet: bool = False,
               connect_timeout: float = 600.0) -> list[dict[str, Any]]:
    """Run (or resume) a job on the SuperLink at ``runtime.flower.superlink``; returns its rows.

    ``job`` is not called here: the SuperLink's ServerApp process runs
    :func:`fedkt.runtime.job.run_job` itself (``fedkt.apps:server_app``).

    Raises :class:`fedkt.runtime.base.RoundError` when a round failed (the run
    folder keeps the completed rounds) and :class:`DeploymentError` for other
    failures of the run.
    """
    import tomli_w

    from fedkt.runtime.flower_app import (
        CFG_CONNECT_TIMEOUT,
        CFG_PLUGINS,
        CFG_QUIET,
        CFG_RESUME,
        CFG_YAML,
        PLUGINS_ENV,
        method_plugins,
    )

    job = deployable_config(cfg)
    rt = job.runtime.flower
    plugins = [*method_plugins(job.method.name),
               *filter(None, os.environ.get(PLUGINS_ENV, "").split(","))]
    with _cli_home() as home:
        write_cli_config(home, rt.superlink, insecure=rt.insecure, federation=rt.federation,
                         root_certificates=rt.root_certificates)
        app = write_app(home / "app")
        overrides = home / "run-config.toml"
        overrides.write_text(tomli_w.dumps({
            CFG_YAML: job.to_yaml(), CFG_RESUME: resume, CFG_QUIET: quiet,
            CFG_PLUGINS: ",".join(plugins), CFG_CONNECT_TIMEOUT: float(connect_timeout)}))
        env = flower_child_env({"FLWR_HOME": str(home)})
        run_id, output = _stream(flwr_run_command(app, overrides), env, quiet=quiet)
        if run_id is None:
            raise DeploymentError(
                f"`flwr run` could not start the job on SuperLink {rt.superlink} (is it running? "
                f"`fedkt deploy superlink`){_tls_hint(rt.insecure, rt.root_certificates)}:\n"
                f"{_tail(output)}")
        status, details = run_status(run_id, env)
    if status != "finished:completed":
        from fedkt.runtime.base import RoundError

        reason = details.removeprefix("ServerApp failed with exception: ")
        if any("RoundError:" in line for line in output):
            raise RoundError(reason)
        raise DeploymentError(f"Flower run {run_id} ended as {status}: {reason}\n{_tail(output)}")
    rows = read_run_rows(job.run_dir)
    if not rows:
        print(f"fedkt: Flower run {run_id} completed; its run folder {job.run_dir} is on the "
              "SuperLink's machine (not visible from here)", file=sys.stderr)
    return rows


def _tail(lines: Sequence[str], n: int = 30) -> str:
    return "\n".join(list(lines)[-n:])


def _stream(cmd: list[str], env: dict[str, str], *, quiet: bool) -> tuple[int | None, list[str]]:
    """Run ``flwr run --stream``, echoing its log; returns the run id and the log's tail."""
    keep: collections.deque[str] = collections.deque(maxlen=400)
    run_id: int | None = None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True, errors="replace", bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            keep.append(line.rstrip("\n"))
            match = re.search(r"Successfully started run (\d+)", line)
            if match:
                run_id = int(match.group(1))
            if not quiet:
                sys.stdout.write(line)
                sys.stdout.flush()
        proc.wait()
    except BaseException:  # e.g. Ctrl-C: stop the run on the SuperLink too
        proc.terminate()
        if run_id is not None:
            subprocess.run(["flwr", "stop", str(run_id), CONNECTION], env=env,
                           capture_output=True, timeout=60, check=False)
        raise
    return run_id, list(keep)


def run_status(run_id: int, env: dict[str, str]) -> tuple[str, str]:
    """``(status, details)`` of a run, e.g. ``("finished:completed", "N/A")``."""
    res = subprocess.run(["flwr", "ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        run = json.loads(res.stdout)["runs"][0]
    except (ValueError, KeyError, IndexError):
        raise DeploymentError(f"cannot read the status of Flower run {run_id}:\n"
                              f"{res.stdout}{res.stderr}") from None
    return str(run.get("status", "")), str(run.get("status-details", ""))
