"""The ``flower`` runtime: real deployment on a Flower SuperLink and SuperNodes.

* :func:`start_superlink` / :func:`start_supernode` start Flower's processes with
  the flags fedkt needs (``fedkt deploy superlink`` / ``fedkt deploy supernode``);
  a SuperNode's ``partition-id`` is its fedkt client id.
* :func:`submit_job` submits a job with ``flwr run``: the Flower App (FAB) is a
  ``pyproject.toml`` whose components are :mod:`fedkt.apps`'s
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


from fedkt.runtime.flower_deploy.cli import add_deploy_commands
from fedkt.runtime.flower_deploy.processes import (
    DEFAULT_PORT,
    TLS,
    DeploymentError,
    FlowerProcess,
    flower_child_env,
    free_port,
    node_config,
    split_address,
    start_superlink,
    start_supernode,
    superlink_command,
    supernode_command,
)
from fedkt.runtime.flower_deploy.submit import (
    APP_PYPROJECT,
    deployable_config,
    flwr_run_command,
    run_status,
    submit_job,
    write_app,
    write_cli_config,
)
from fedkt.runtime.flower_deploy.supernodes import list_supernodes, register_supernodes

__all__ = [
    "APP_PYPROJECT", "DEFAULT_PORT", "TLS", "DeploymentError", "FlowerProcess",
    "add_deploy_commands", "deployable_config", "flower_child_env", "flwr_run_command",
    "free_port", "list_supernodes", "node_config", "register_supernodes", "run_status",
    "split_address", "start_superlink", "start_supernode", "submit_job", "superlink_command",
    "supernode_command", "write_app", "write_cli_config",
]
