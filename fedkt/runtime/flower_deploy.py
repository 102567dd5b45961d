"""The ``flower`` runtime: real deployment on a Flower SuperLink and SuperNodes.

* :func:`start_superlink` / :func:`start_supernode` start Flower's processes with
  the flags fedkt needs (``fedkt deploy superlink`` / ``fedkt deploy supernode``);
  a SuperNode's ``partition-id`` is its fedkt client id.
* :func:`submit_job` submits a job with ``flwr run``: the Flower App (FAB) is a
  ``pyproject.toml`` whose components are :mod:`fedkt.runtime.flower_app`'s
  ``server_app`` and ``client_app`` (fedkt itself is installed on every machine),
  and the job's YAML travels in the Flower run config.  It streams the
  ServerApp's log, waits for the run to end and returns the rows the ServerApp
  wrote to the (absolute) run folder.

Security (docs/deployment.md, "Secure deployment"): by default every connection is
plain HTTP (``--insecure``).  With ``insecure=False`` the SuperLink serves HTTPS with a
:class:`TLS` certificate (all its APIs: Fleet for SuperNodes, Control for ``flwr run``,
Runtime for the ServerApp); SuperNodes and ``flwr`` verify it against
``root_certificates`` (a CA file).  With ``enable_supernode_auth`` the SuperLink only
accepts SuperNodes whose public key was registered through the Control API
(:func:`register_supernodes`, i.e. ``flwr supernode register``); a SuperNode signs its
requests with its private key (``auth_private_key``).  :mod:`fedkt.runtime.certs`
(``fedkt deploy certs``) writes the CA, the server certificate and the node keys.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedkt.config import RunConfig
from fedkt.runtime.base import TransportError
from fedkt.runtime.flower_sim import FLOWER_ENV_DEFAULTS, read_run_rows

DEFAULT_PORT = 9093  # the SuperLink's HTTP port (Fleet, Control and Runtime APIs)
CONNECTION = "fedkt"  # name of the SuperLink connection in the CLI's Flower config

# The FAB's pyproject.toml (flower_app/pyproject.toml in the repository is a copy).
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
serverapp = "fedkt.runtime.flower_app:server_app"
clientapp = "fedkt.runtime.flower_app:client_app"

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


class DeploymentError(TransportError):
    """A Flower process or run failed; the message carries the cause and log tail."""


@dataclass
class TLS:
    """The SuperLink's TLS files (PEM): its certificate, its private key and the CA
    certificate that signed it (``flower-superlink --ssl-certfile/--ssl-keyfile/
    --ssl-ca-certfile``)."""

    certfile: str | None = None
    keyfile: str | None = None
    ca_certfile: str | None = None

    @classmethod
    def from_dir(cls, folder: Path | str) -> TLS:
        """The files of ``fedkt deploy certs --out FOLDER``."""
        from fedkt.runtime.certs import CA_CERT, SERVER_CERT, SERVER_KEY

        folder = Path(folder).expanduser().absolute()
        return cls(str(folder / SERVER_CERT), str(folder / SERVER_KEY), str(folder / CA_CERT))

    def checked(self) -> TLS:
        """These files with absolute paths; :class:`DeploymentError` names a missing one."""
        files = {}
        for flag, value in (("--ssl-certfile", self.certfile), ("--ssl-keyfile", self.keyfile),
                            ("--ssl-ca-certfile", self.ca_certfile)):
            if not value:
                raise DeploymentError(f"TLS needs a SuperLink {flag} file (or run --insecure)")
            files[flag] = _existing_file(value, f"SuperLink TLS {flag}")
        return TLS(*files.values())


def _existing_file(path: Path | str, what: str) -> str:
    """``path`` made absolute; :class:`DeploymentError` naming ``what`` if it is no file."""
    full = Path(path).expanduser().absolute()
    if not full.is_file():
        raise DeploymentError(f"{what}: no such file {str(full)!r}")
    return str(full)


# --------------------------------------------------------------------------- processes


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def flower_child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: fedkt's defaults, this Python's scripts on
    PATH, and this fedkt importable (Flower starts app processes by command name)."""
    import fedkt

    env = dict(os.environ)
    for key, value in FLOWER_ENV_DEFAULTS.items():
        env.setdefault(key, value)
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts, env.get("PATH", "")])
    root = str(Path(fedkt.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    env.update(extra or {})
    return env


@dataclass
class FlowerProcess:
    """A started Flower process; :meth:`stop` ends it and everything it started."""

    name: str
    popen: subprocess.Popen
    address: str
    log_path: Path | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the process listens on its address."""
        host, port = split_address(self.address)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise DeploymentError(f"{self.name} exited with code {self.popen.returncode}:\n"
                                      f"{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
                return
            time.sleep(0.2)
        raise DeploymentError(f"{self.name} not listening on {self.address} after {timeout:.0f} s:"
                              f"\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process and its descendants (by pid); kill them if they linger."""
        pids = [*_descendants(self.pid), self.pid] if self.alive() else _descendants(self.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(_running(p) for p in pids):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.1)
                time.sleep(0.05)
            if not any(_running(p) for p in pids):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> FlowerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # zombies are done


def _descendants(pid: int) -> list[int]:
    """Child processes (recursively) of ``pid``, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int(entry.joinpath("stat").read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _popen(name: str, cmd: list[str], address: str, *, log_file: Path | str | None,
           env: dict[str, str], cwd: Path | str | None) -> FlowerProcess:
    log_path = Path(log_file) if log_file else None
    out: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = log_path.open("ab")
    popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None, env=env,
                             cwd=cwd, start_new_session=True)
    return FlowerProcess(name=name, popen=popen, address=address, log_path=log_path, _log=out)


def superlink_command(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, insecure: bool = True,
                      tls: TLS | None = None, database: str | None = None,
                      enable_supernode_auth: bool = False) -> list[str]:
    """``flower-superlink`` arguments: one HTTP(S) port for SuperNodes, ``flwr`` and
    ServerApps.  ``insecure=False`` needs ``tls`` (all three files, which must exist);
    ``enable_supernode_auth`` (only registered SuperNodes) needs TLS."""
    cmd = ["flower-superlink", "--host", host, "--port", str(port),
           "--disable-runtime-dependency-installation"]
    if insecure:
        if enable_supernode_auth:
            raise DeploymentError("SuperNode authentication (--enable-supernode-auth) needs "
                                  "TLS: give the SuperLink's certificates instead of --insecure")
        cmd.append("--insecure")
    else:
        if tls is None:
            raise DeploymentError("a SuperLink without --insecure needs TLS certificates "
                                  "(--ssl-certfile, --ssl-keyfile, --ssl-ca-certfile)")
        tls = tls.checked()
        cmd += ["--ssl-certfile", str(tls.certfile), "--ssl-keyfile", str(tls.keyfile),
                "--ssl-ca-certfile", str(tls.ca_certfile)]
        if enable_supernode_auth:
            cmd.append("--enable-supernode-auth")
    if database:
        cmd += ["--database", database]
    return cmd


def start_superlink(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, insecure: bool = True,
                    tls: TLS | None = None, enable_supernode_auth: bool = False,
                    database: str | None = None,
                    flwr_home: Path | str | None = None, log_file: Path | str | None = None,
                    env: dict[str, str] | None = None, cwd: Path | str | None = None,
                    wait: float | None = 60.0) -> FlowerProcess:
    """Start ``flower-superlink`` listening on ``host:port``; waits until it listens.

    ``insecure=False``: HTTPS with ``tls``; ``enable_supernode_auth``: only SuperNodes
    registered with :func:`register_supernodes` may connect.
    """
    extra = dict(env or {})
    if flwr_home:
        extra["FLWR_HOME"] = str(flwr_home)
    cmd = superlink_command(host, port, insecure=insecure, tls=tls, database=database,
                            enable_supernode_auth=enable_supernode_auth)
    proc = _popen("SuperLink", cmd,
                  f"{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}",
                  log_file=log_file, env=flower_child_env(extra), cwd=cwd)
    if wait:
        try:
            proc.wait_ready(wait)
        except BaseException:
            proc.stop()
            raise
    return proc


def node_config(partition_id: int, num_partitions: int, state_dir: Path | str | None = None,
                **extra: Any) -> str:
    """The ``--node-config`` text: TOML values, space separated."""
    from fedkt.runtime.flower_app import NUM_PARTITIONS, PARTITION_ID, STATE_DIR

    items: dict[str, Any] = {PARTITION_ID: int(partition_id), NUM_PARTITIONS: int(num_partitions)}
    if state_dir is not None:
        items[STATE_DIR] = str(Path(state_dir).expanduser().absolute())
    items.update(extra)
    return " ".join(f"{k}={json.dumps(v)}" for k, v in items.items())


def supernode_command(partition_id: int, num_partitions: int,
                      superlink: str = f"127.0.0.1:{DEFAULT_PORT}", *,
                      state_dir: Path | str | None = None, port: int = 9094,
                      insecure: bool = True, root_certificates: str | None = None,
                      auth_private_key: str | None = None) -> list[str]:
    """``flower-supernode`` arguments; ``port`` is the node's own local API port.

    ``insecure=False``: TLS to the SuperLink, verified with ``root_certificates`` (a CA
    file; None: the system's CAs).  ``auth_private_key``: the node's OpenSSH EC private
    key, for a SuperLink with SuperNode authentication.
    """
    cmd = ["flower-supernode", "--superlink", superlink,
           "--node-config", node_config(partition_id, num_partitions, state_dir),
           "--host", "127.0.0.1", "--port", str(port)]
    if insecure:
        if root_certificates:
            raise DeploymentError("--root-certificates given with --insecure: drop one of them")
        if auth_private_key:
            raise DeploymentError("SuperNode authentication (--auth-supernode-private-key) "
                                  "needs TLS: drop --insecure")
        cmd.append("--insecure")
    elif root_certificates:
        cmd += ["--root-certificates",
                _existing_file(root_certificates, "SuperNode --root-certificates")]
    if auth_private_key:
        cmd += ["--auth-supernode-private-key",
                _existing_file(auth_private_key, "SuperNode --auth-supernode-private-key")]
    return cmd


def start_supernode(partition_id: int, num_partitions: int,
                    superlink: str = f"127.0.0.1:{DEFAULT_PORT}",
                    state_dir: Path | str | None = None, *, port: int | None = None,
                    insecure: bool = True, root_certificates: str | None = None,
                    auth_private_key: str | None = None,
                    flwr_home: Path | str | None = None, log_file: Path | str | None = None,
                    env: dict[str, str] | None = None, cwd: Path | str | None = None,
                    wait: float | None = 60.0) -> FlowerProcess:
    """Start ``flower-supernode`` for fedkt client ``partition_id``.

    ``state_dir``: the client's state folder on this machine (default:
    ``fedkt-client-state`` in the SuperNode's working directory).  ``port``: the node's
    local API port (a free one by default).  ``insecure``, ``root_certificates`` and
    ``auth_private_key``: see :func:`supernode_command`.  Waiting only covers the node's
    local API: a node the SuperLink refuses exits soon after (see its log).
    """
    port = port or free_port()
    extra = dict(env or {})
    if flwr_home:
        extra["FLWR_HOME"] = str(flwr_home)
    cmd = supernode_command(partition_id, num_partitions, superlink, state_dir=state_dir,
                            port=port, insecure=insecure, root_certificates=root_certificates,
                            auth_private_key=auth_private_key)
    proc = _popen(f"SuperNode {partition_id}", cmd, f"127.0.0.1:{port}", log_file=log_file,
                  env=flower_child_env(extra), cwd=cwd)
    if wait:
        try:
            proc.wait_ready(wait)
        except BaseException:
            proc.stop()
            raise
    return proc


# --------------------------------------------------------------------------- submitting


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
        conn["root-certificates"] = _existing_file(root_certificates, "runtime.root_certificates")
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
    """Run (or resume) a job on the SuperLink at ``runtime.superlink``; returns its rows.

    ``job`` is not called here: the SuperLink's ServerApp process runs
    :func:`fedkt.runner.run_job` itself (``fedkt.runtime.flower_app:server_app``).

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
    rt = job.runtime
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


# --------------------------------------------------------------------------- SuperNode registry


def _flwr_json(args: list[str], superlink: str, *, insecure: bool,
               root_certificates: str | None, what: str) -> dict[str, Any]:
    """Run ``flwr ARGS fedkt --format json`` against ``superlink``; its JSON answer."""
    with _cli_home() as home:
        write_cli_config(home, superlink, insecure=insecure, root_certificates=root_certificates)
        res = subprocess.run(["flwr", *args, CONNECTION, "--format", "json"],
                             env=flower_child_env({"FLWR_HOME": str(home)}), capture_output=True,
                             text=True, timeout=120, check=False)
    try:
        out = json.loads(res.stdout)
    except ValueError:
        out = {}
    if res.returncode != 0 or not out.get("success"):
        raise DeploymentError(f"{what} on SuperLink {superlink} failed (`flwr {' '.join(args)}`, "
                              f"exit code {res.returncode}){_tls_hint(insecure, root_certificates)}"
                              f":\n{res.stdout}{res.stderr}".rstrip())
    return out


def _tls_hint(insecure: bool, root_certificates: str | None) -> str:
    """What to check when ``flwr`` cannot reach a SuperLink (it hides TLS errors)."""
    if insecure:
        return " (plain HTTP: does the SuperLink use TLS? then set runtime.insecure=false)"
    return (" (TLS: is the SuperLink's certificate signed by runtime.root_certificates="
            f"{root_certificates or 'the system CAs'} and valid for this host name?)")


def register_supernodes(superlink: str, public_keys: Sequence[Path | str], *,
                        insecure: bool = False, root_certificates: str | None = None
                        ) -> list[int]:
    """Register SuperNodes' public keys (OpenSSH EC keys, e.g. ``supernode-0.pub``) with a
    SuperLink started with SuperNode authentication (``flwr supernode register``); returns
    their Flower node ids.  Registrations live in the SuperLink's database (lost on a
    restart with the default in-memory database)."""
    ids = []
    for key in public_keys:
        path = _existing_file(key, "SuperNode public key")
        out = _flwr_json(["supernode", "register", path], superlink, insecure=insecure,
                         root_certificates=root_certificates,
                         what=f"registering the SuperNode key {path}")
        ids.append(int(out["node-id"]))
    return ids


def list_supernodes(superlink: str, *, insecure: bool = False,
                    root_certificates: str | None = None) -> list[dict[str, Any]]:
    """The SuperLink's SuperNodes (``flwr supernode ls``): dicts with ``node-id`` and
    ``status`` (``registered``, ``online``, ``offline``, ...)."""
    out = _flwr_json(["supernode", "ls"], superlink, insecure=insecure,
                     root_certificates=root_certificates, what="listing SuperNodes")
    return list(out.get("nodes", []))


# --------------------------------------------------------------------------- CLI


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_forever(procs: Sequence[FlowerProcess]) -> int:
    """Block until a process exits, Ctrl-C or SIGTERM; then stop them all."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while all(p.alive() for p in procs):
            time.sleep(0.5)
        dead = next(p for p in procs if not p.alive())
        tail = dead.log_tail(15)  # e.g. why the SuperLink refused a SuperNode
        print(f"fedkt: {dead.name} exited with code {dead.popen.returncode}"
              + (f"; the end of its log {dead.log_path}:\n{tail}" if tail else ""),
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            p.stop()


def _superlink_tls(args: argparse.Namespace) -> tuple[bool, TLS | None]:
    """``(insecure, tls)`` from ``--insecure/--certs-dir/--ssl-*``: certificates imply TLS."""
    tls = TLS.from_dir(args.certs_dir) if args.certs_dir else TLS()
    tls = TLS(args.ssl_certfile or tls.certfile, args.ssl_keyfile or tls.keyfile,
              args.ssl_ca_certfile or tls.ca_certfile)
    given = any((tls.certfile, tls.keyfile, tls.ca_certfile))
    if args.insecure and given:
        raise DeploymentError("--insecure given with TLS certificates: drop one of them")
    insecure = args.insecure if args.insecure is not None else not given
    return insecure, (None if insecure else tls)


def _node_tls(args: argparse.Namespace) -> tuple[bool, str | None]:
    """``(insecure, root_certificates)`` for a SuperNode or ``flwr`` from the CLI flags."""
    from fedkt.runtime.certs import CA_CERT

    root = args.root_certificates or (
        str(Path(args.certs_dir) / CA_CERT) if getattr(args, "certs_dir", None) else None)
    if args.insecure and root:
        raise DeploymentError("--insecure given with --root-certificates: drop one of them")
    insecure = args.insecure if args.insecure is not None else not (
        root or getattr(args, "auth_key", None))
    return insecure, root


def cmd_superlink(args: argparse.Namespace) -> int:
    proc = None
    try:
        insecure, tls = _superlink_tls(args)
        proc = start_superlink(args.host, args.port, insecure=insecure, tls=tls,
                               enable_supernode_auth=args.enable_supernode_auth,
                               database=args.database, log_file=args.log_file, wait=60)
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        ids = []
        if args.register:
            ids = register_supernodes(f"{shown}:{args.port}", args.register, insecure=insecure,
                                      root_certificates=tls.ca_certfile if tls else None)
    except DeploymentError as exc:
        if proc is not None:
            proc.stop()
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 1
    for key, node_id in zip(args.register or [], ids, strict=True):
        print(f"fedkt: registered SuperNode key {key} as node {node_id}", flush=True)
    sec = "" if insecure else (
        f" --root-certificates {tls.ca_certfile}" if tls else "")
    auth = " --auth-key supernode-N.key" if args.enable_supernode_auth else ""
    run_sec = "" if insecure else (
        f" --set runtime.insecure=false --set runtime.root_certificates={tls.ca_certfile}"
        if tls else "")
    mode = "plain HTTP" if insecure else "TLS" + (
        " + SuperNode authentication" if args.enable_supernode_auth else "")
    print(f"fedkt: SuperLink ({mode}) listening on {args.host}:{args.port} (pid {proc.pid}); "
          f"start one SuperNode per client with\n  fedkt deploy supernode --client-id N "
          f"--num-clients M --superlink {shown}:{args.port}{sec}{auth}\nand submit jobs with\n"
          f"  fedkt run CONFIG --set runtime.name=flower --set runtime.superlink={shown}:"
          f"{args.port}{run_sec}\nCtrl-C stops it.", flush=True)
    return _wait_forever([proc])


def cmd_supernode(args: argparse.Namespace) -> int:
    try:
        insecure, root = _node_tls(args)
        proc = start_supernode(args.client_id, args.num_clients, args.superlink,
                               state_dir=args.state_dir, port=args.port, insecure=insecure,
                               root_certificates=root, auth_private_key=args.auth_key,
                               log_file=args.log_file, wait=60)
    except DeploymentError as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 1
    print(f"fedkt: SuperNode for client {args.client_id} of {args.num_clients} (pid {proc.pid}) "
          f"connecting to {args.superlink} ({'plain HTTP' if insecure else 'TLS'}"
          + (", authenticated" if args.auth_key else "") + ")"
          + (f", state in {args.state_dir}" if args.state_dir else "") + "; Ctrl-C stops it.",
          flush=True)
    return _wait_forever([proc])


def cmd_register(args: argparse.Namespace) -> int:
    try:
        insecure, root = _node_tls(args)
        ids = register_supernodes(args.superlink, args.public_keys, insecure=insecure,
                                  root_certificates=root)
    except DeploymentError as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 1
    for key, node_id in zip(args.public_keys, ids, strict=True):
        print(f"fedkt: registered SuperNode key {key} as node {node_id}")
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from fedkt.runtime.certs import generate_certs

    try:
        files = generate_certs(args.out, args.host or [], args.nodes,
                               days=args.days, overwrite=args.force)
    except ValueError as exc:
        print(f"fedkt: error: {exc}", file=sys.stderr)
        return 1
    for path in files.written:
        print(f"fedkt: wrote {path}")
    kept = [p for p in (files.ca_cert, files.ca_key, files.server_cert, files.server_key,
                        *(k for pair in files.node_keys for k in pair)) if p not in files.written]
    if kept:
        print(f"fedkt: kept {len(kept)} existing file(s) in {files.ca_cert.parent} "
              "(--force regenerates them)")
    return 0


def add_deploy_commands(subparsers: Any) -> None:
    """Add ``fedkt deploy superlink|supernode|register|certs`` to the CLI."""
    deploy = subparsers.add_parser(
        "deploy", help="start Flower processes for the 'flower' runtime",
        description="Start a Flower SuperLink (once) and one SuperNode per client, then run "
                    "jobs with `fedkt run CONFIG --set runtime.name=flower --set "
                    "runtime.superlink=HOST:PORT`. `fedkt deploy certs` makes TLS "
                    "certificates and SuperNode keys. See docs/deployment.md.")
    sub = deploy.add_subparsers(dest="deploy_command", required=True, metavar="COMMAND")

    def insecure(p: argparse.ArgumentParser) -> None:
        p.add_argument("--insecure", action=argparse.BooleanOptionalAction, default=None,
                       help="plain HTTP without TLS (default: TLS when certificates or "
                            "keys are given, plain HTTP otherwise)")

    def log_file(p: argparse.ArgumentParser) -> None:
        p.add_argument("--log-file", help="write the process's log here instead of the terminal")

    def root_certs(p: argparse.ArgumentParser) -> None:
        p.add_argument("--root-certificates", metavar="CA_CERT",
                       help="CA certificate (PEM) to verify the SuperLink's TLS certificate "
                            "(ca.crt of `fedkt deploy certs`); implies TLS")

    p = sub.add_parser("superlink", help="start the SuperLink (the server machine)")
    p.add_argument("--host", default="0.0.0.0",
                   help="interface to listen on (default: all; 127.0.0.1 for one machine)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"HTTP(S) port for SuperNodes and `fedkt run` (default: {DEFAULT_PORT})")
    p.add_argument("--database", help="SQLite file for the SuperLink's state, registered "
                                      "SuperNodes included (default: memory)")
    insecure(p)
    p.add_argument("--certs-dir", help="folder of `fedkt deploy certs`: use its server.pem, "
                                       "server.key and ca.crt (implies TLS)")
    p.add_argument("--ssl-certfile", help="server certificate (PEM); overrides --certs-dir")
    p.add_argument("--ssl-keyfile", help="server private key (PEM); overrides --certs-dir")
    p.add_argument("--ssl-ca-certfile", help="CA certificate (PEM); overrides --certs-dir")
    p.add_argument("--enable-supernode-auth", action="store_true",
                   help="accept only SuperNodes whose public key is registered (needs TLS)")
    p.add_argument("--register", nargs="+", metavar="PUBLIC_KEY",
                   help="register these SuperNode public keys (supernode-K.pub) once started")
    log_file(p)
    p.set_defaults(func=cmd_superlink)

    p = sub.add_parser("supernode", help="start the SuperNode of one client (its machine)")
    p.add_argument("--client-id", type=int, required=True, help="fedkt client id (0-based)")
    p.add_argument("--num-clients", type=int, required=True,
                   help="number of clients in the federation (clients.num_clients)")
    p.add_argument("--superlink", default=f"127.0.0.1:{DEFAULT_PORT}",
                   help=f"SuperLink HOST:PORT (default: 127.0.0.1:{DEFAULT_PORT})")
    p.add_argument("--state-dir", help="this client's state folder on this machine (default: "
                                       "./fedkt-client-state where the SuperNode runs)")
    p.add_argument("--port", type=int, default=None,
                   help="the node's local API port (default: a free port)")
    insecure(p)
    root_certs(p)
    p.add_argument("--auth-key", metavar="PRIVATE_KEY",
                   help="this node's private key (supernode-K.key) for a SuperLink with "
                        "--enable-supernode-auth; its public key must be registered")
    log_file(p)
    p.set_defaults(func=cmd_supernode)

    p = sub.add_parser("register", help="authorise SuperNodes: register their public keys",
                       description="Register SuperNode public keys with a SuperLink started "
                                   "with --enable-supernode-auth (`flwr supernode register`).")
    p.add_argument("public_keys", nargs="+", metavar="PUBLIC_KEY",
                   help="OpenSSH EC public key files (supernode-K.pub)")
    p.add_argument("--superlink", default=f"127.0.0.1:{DEFAULT_PORT}",
                   help=f"SuperLink HOST:PORT (default: 127.0.0.1:{DEFAULT_PORT})")
    insecure(p)
    root_certs(p)
    p.set_defaults(func=cmd_register)

    p = sub.add_parser("certs", help="write a CA, the SuperLink's TLS certificate and "
                                     "SuperNode keys",
                       description="Write ca.crt/ca.key, server.pem/server.key (valid for the "
                                   "--host names) and supernode-K.key/.pub (K = 0..N-1) into "
                                   "--out. Existing files are kept unless --force.")
    p.add_argument("--out", required=True, help="folder to write into")
    p.add_argument("--host", action="append", metavar="NAME_OR_IP",
                   help="a host name or IP address clients use to reach the SuperLink "
                        "(repeat; 127.0.0.1 and localhost are always included)")
    p.add_argument("--nodes", type=int, default=0, help="SuperNode key pairs to write")
    p.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")
    p.add_argument("--force", action="store_true", help="regenerate existing files")
    p.set_defaults(func=cmd_certs)
