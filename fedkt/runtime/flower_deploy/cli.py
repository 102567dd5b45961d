"""``fedkt deploy``: the commands that start a SuperLink or SuperNode, register node
keys and write certificates."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedkt.runtime.flower_deploy.processes import (
    DEFAULT_PORT,
    TLS,
    DeploymentError,
    FlowerProcess,
    start_superlink,
    start_supernode,
)
from fedkt.runtime.flower_deploy.supernodes import register_supernodes


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
        " --set runtime.flower.insecure=false"
        f" --set runtime.flower.root_certificates={tls.ca_certfile}"
        if tls else "")
    mode = "plain HTTP" if insecure else "TLS" + (
        " + SuperNode authentication" if args.enable_supernode_auth else "")
    print(f"fedkt: SuperLink ({mode}) listening on {args.host}:{args.port} (pid {proc.pid}); "
          f"start one SuperNode per client with\n  fedkt deploy supernode --client-id N "
          f"--num-clients M --superlink {shown}:{args.port}{sec}{auth}\nand submit jobs with\n"
          f"  fedkt run CONFIG --set runtime.name=flower --set runtime.flower.superlink={shown}:"
          f"{args.port}{run_sec}\nCtrl-C stops it.", flush=True)
    return _wait_forever([proc])


def cmd_supernode(args: argparse.Namespace) -> int:
    try:
        insecure, root = _node_tls(args)
        proc = start_supernode(args.client_id, args.num_clients, args.superlink,
                               state_dir=args.state_dir, port=args.port, insecure=insecure,
                               root_certificates=root, auth_private_key=args.auth_key,
                               allow_remote_code=args.allow_remote_code,
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
                    "runtime.flower.superlink=HOST:PORT`. `fedkt deploy certs` makes TLS "
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
    p.add_argument("--allow-remote-code", action="store_true",
                   help="run the model code a job's config asks for (trust_remote_code: "
                        "true); without it this client refuses such jobs")
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
