"""The SuperNode registry of an authenticating SuperLink (``flwr supernode register``
/ ``list`` through the Control API)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedkt.runtime.flower_deploy.processes import (
    CONNECTION,
    DeploymentError,
    _existing_file,
    _tls_hint,
    flower_child_env,
)
from fedkt.runtime.flower_deploy.submit import _cli_home, write_cli_config


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
