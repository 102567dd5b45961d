"""Flower's processes: the SuperLink and SuperNodes fedkt starts, their TLS files, and
how they are stopped (``fedkt deploy superlink`` / ``supernode``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedkt.runtime.envelope import TransportError
from fedkt.runtime.flower_sim import FLOWER_ENV_DEFAULTS

DEFAULT_PORT = 9093  # the SuperLink's HTTP port (Fleet, Control and Runtime APIs)
CONNECTION = "fedkt"  # name of the SuperLink connection in the CLI's Flower config

# The FAB's pyproject.toml (flower_app/pyproject.toml in the repository is a copy).


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
    return _ready(proc, wait)


def _ready(proc: FlowerProcess, wait: float | None) -> FlowerProcess:
    """``proc`` once it listens (after at most ``wait`` seconds); stopped if it does not."""
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
                      auth_private_key: str | None = None,
                      allow_remote_code: bool = False) -> list[str]:
    """``flower-supernode`` arguments; ``port`` is the node's own local API port.

    ``insecure=False``: TLS to the SuperLink, verified with ``root_certificates`` (a CA
    file; None: the system's CAs).  ``auth_private_key``: the node's OpenSSH EC private
    key, for a SuperLink with SuperNode authentication.  ``allow_remote_code``: this node
    runs model code a job's config asks for (``trust_remote_code``); refused otherwise.
    """
    from fedkt.runtime.base import ALLOW_REMOTE_CODE_KEY

    extra = {ALLOW_REMOTE_CODE_KEY: True} if allow_remote_code else {}
    cmd = ["flower-supernode", "--superlink", superlink,
           "--node-config", node_config(partition_id, num_partitions, state_dir, **extra),
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
                    auth_private_key: str | None = None, allow_remote_code: bool = False,
                    flwr_home: Path | str | None = None, log_file: Path | str | None = None,
                    env: dict[str, str] | None = None, cwd: Path | str | None = None,
                    wait: float | None = 60.0) -> FlowerProcess:
    """Start ``flower-supernode`` for fedkt client ``partition_id``.

    ``state_dir``: the client's state folder on this machine (default:
    ``fedkt-client-state`` in the SuperNode's working directory).  ``port``: the node's
    local API port (a free one by default).  ``insecure``, ``root_certificates`` and
    ``auth_private_key``, ``allow_remote_code``: see :func:`supernode_command`.  Waiting
    only covers the node's
    local API: a node the SuperLink refuses exits soon after (see its log).
    """
    port = port or free_port()
    extra = dict(env or {})
    if flwr_home:
        extra["FLWR_HOME"] = str(flwr_home)
    cmd = supernode_command(partition_id, num_partitions, superlink, state_dir=state_dir,
                            port=port, insecure=insecure, root_certificates=root_certificates,
                            auth_private_key=auth_private_key,
                            allow_remote_code=allow_remote_code)
    proc = _popen(f"SuperNode {partition_id}", cmd, f"127.0.0.1:{port}", log_file=log_file,
                  env=flower_child_env(extra), cwd=cwd)
    return _ready(proc, wait)


def _tls_hint(insecure: bool, root_certificates: str | None) -> str:
    """What to check when ``flwr`` cannot reach a SuperLink (it hides TLS errors)."""
    if insecure:
        return " (plain HTTP: does the SuperLink use TLS? then set runtime.flower.insecure=false)"
    return (" (TLS: is the SuperLink's certificate signed by runtime.flower.root_certificates="
            f"{root_certificates or 'the system CAs'} and valid for this host name?)")
