"""Secure deployment: TLS and SuperNode authentication on real Flower processes.

One SuperLink (HTTPS, ``--enable-supernode-auth``) and two SuperNodes whose public
keys are registered serve the whole module (127.0.0.1, free ports).  Other SuperNodes
(unregistered key, no key, no CA certificate, plain HTTP) are started against it and
must be refused.  Uses the probe method of test_flower_sim.
"""

from __future__ import annotations

import importlib
import os
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedkt.runtime import certs
from fedkt.runtime.flower_deploy import (
    TLS,
    DeploymentError,
    FlowerProcess,
    flower_child_env,
    free_port,
    list_supernodes,
    register_supernodes,
    start_superlink,
    start_supernode,
    submit_job,
    superlink_command,
    supernode_command,
    write_cli_config,
)
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport

_sim = importlib.import_module(__name__.rpartition(".")[0] + ".test_flower_sim"
                               if "." in __name__ else "test_flower_sim")
probe = _sim.probe  # fixture: registers the probe method here and for Flower's processes

REFUSED_WAIT = 30.0  # seconds a refused SuperNode gets to give up


def _module_root(module) -> str:
    return str(Path(module.__file__).resolve().parents[len(module.__name__.split(".")) - 1])


class SecureFederation:
    """Handles on the module's secure SuperLink and its two authorised SuperNodes."""

    def __init__(self, root: Path, certs_dir: Path, superlink: str, link: FlowerProcess,
                 nodes: list[FlowerProcess], node_ids: list[int], env: dict[str, str]) -> None:
        self.root, self.certs, self.superlink, self.link = root, certs_dir, superlink, link
        self.nodes, self.node_ids, self.env = nodes, node_ids, env
        self.ca = str(certs_dir / certs.CA_CERT)
        self.extra: list[FlowerProcess] = []

    def supernode(self, name: str, cid: int, **kwargs) -> FlowerProcess:
        """Start another SuperNode (stopped with the module)."""
        proc = start_supernode(cid, 3, self.superlink, state_dir=self.root / "state" / name,
                               flwr_home=self.root / "home" / name,
                               log_file=self.root / "logs" / f"{name}.log", env=self.env,
                               wait=None, **kwargs)
        self.extra.append(proc)
        return proc

    def nodes_by_id(self) -> dict[int, str]:
        return {int(n["node-id"]): n["status"]
                for n in list_supernodes(self.superlink, root_certificates=self.ca)}


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """SuperLink with TLS + SuperNode auth; SuperNodes 0 and 1 registered and online."""
    root = tmp_path_factory.mktemp("secure")
    files = certs.generate_certs(root / "certs", nodes=5)
    port = free_port()
    superlink = f"127.0.0.1:{port}"
    # The probe's folder, and this fedkt (the one a Flower process gets without PYTHONPATH).
    env = {"PYTHONPATH": os.pathsep.join([_module_root(_sim), flower_child_env()["PYTHONPATH"]])}
    procs: list[FlowerProcess] = []
    fed = None
    try:
        t0 = time.perf_counter()
        link = start_superlink("127.0.0.1", port, insecure=False,
                               tls=TLS.from_dir(root / "certs"), enable_supernode_auth=True,
                               flwr_home=root / "home" / "link",
                               log_file=root / "logs" / "superlink.log", env=env)
        procs.append(link)
        ids = register_supernodes(superlink, [pub for _, pub in files.node_keys[:2]],
                                  root_certificates=str(files.ca_cert))
        for cid in range(2):
            procs.append(start_supernode(
                cid, 2, superlink, state_dir=root / "state" / f"node{cid}",
                insecure=False, root_certificates=str(files.ca_cert),
                auth_private_key=str(files.node_keys[cid][0]),
                flwr_home=root / "home" / f"node{cid}",
                log_file=root / "logs" / f"supernode{cid}.log", env=env, wait=None))
        for proc in procs[1:]:  # started together: their start-ups overlap
            proc.wait_ready(60)
        fed = SecureFederation(root, root / "certs", superlink, link, procs[1:], ids, env)
        _wait_for(lambda: all(f"Activated node_id={i}" in link.log_tail(400) for i in ids), 60,
                  "the SuperLink to activate the two authorised SuperNodes")
        print(f"secure SuperLink + 2 SuperNodes up in {time.perf_counter() - t0:.1f} s")
        yield fed
    finally:
        for proc in reversed([*procs, *(fed.extra if fed else [])]):
            proc.stop()
        for proc in procs:
            assert not proc.alive()


def _wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def _wait_exit(proc: FlowerProcess, timeout: float = REFUSED_WAIT) -> str:
    """Wait until a refused SuperNode gives up; its log."""
    _wait_for(lambda: not proc.alive(), timeout, f"{proc.name} to exit\n{proc.log_tail()}")
    return proc.log_path.read_text(errors="replace") if proc.log_path else ""


def config(run_dir, fed: SecureFederation, **method):
    cfg = _sim.probe_config(run_dir, **method)
    cfg.runtime.name = "flower"
    cfg.runtime.flower.superlink = fed.superlink
    cfg.runtime.flower.insecure = False
    cfg.runtime.flower.root_certificates = fed.ca
    cfg.clients.min_replies = 1
    return cfg


# --------------------------------------------------------------------------- (a) TLS + auth


@pytest.mark.slow  # 53 s; the default run keeps TLS's refusals and the plain deployed job
def test_secure_job_matches_local_run(secure, probe, tmp_path):
    """One round (each Flower message costs a ClientApp process start); the insecure
    2-round comparison with a failing client is test_flower_deploy's."""
    local_cfg, cfg = config(tmp_path / "a" / "job", secure), config(tmp_path / "b" / "job", secure)
    local_cfg.rounds = cfg.rounds = 1
    local = run_job(local_cfg, LocalTransport(), quiet=True)
    t0 = time.perf_counter()
    rows = submit_job(cfg, quiet=True)
    print(f"secure flower deployment run: {time.perf_counter() - t0:.1f} s")
    _sim.assert_same_rows(rows, local)
    assert {r["participant"] for r in rows} >= {"server", "client_0", "client_1"}
    for cid in range(2):
        assert list((secure.root / "state" / f"node{cid}" / f"client_{cid}").glob("calls.*"))
    # Really HTTPS with authentication: the SuperLink says so and activated our two keys.
    link_log = secure.link.log_path.read_text(errors="replace")
    assert f"Uvicorn running on https://{secure.superlink}" in link_log
    assert all(f"Activated node_id={i}" in link_log for i in secure.node_ids)
    assert all(p.alive() for p in [secure.link, *secure.nodes])


# --------------------------------------------------------------------------- (b) node auth


@pytest.mark.slow  # 16 s idle, 2-core AVX2 (2026-12-03); kept: the control API's refusal
def test_unregistered_or_keyless_supernodes_are_refused(secure):
    t0 = time.perf_counter()
    stranger = secure.supernode("stranger", 2, insecure=False, root_certificates=secure.ca,
                                auth_private_key=str(secure.certs / "supernode-2.key"))
    keyless = secure.supernode("keyless", 2, insecure=False, root_certificates=secure.ca)
    log = _wait_exit(stranger)
    assert stranger.popen.returncode != 0
    assert "Failed to activate SuperNode" in log
    log = _wait_exit(keyless)
    assert keyless.popen.returncode != 0
    assert "SuperNodes must be registered via the CLI" in log
    print(f"refused in {time.perf_counter() - t0:.1f} s")
    # The SuperLink saw them and refused them; it lists only the registered nodes.
    link_log = secure.link.log_path.read_text(errors="replace")
    assert "No SuperNode found with the given public key" in link_log
    assert "POST /v1/fleet/register-node HTTP/1.1\" 412" in link_log
    assert set(secure.nodes_by_id()) == set(secure.node_ids)


@pytest.mark.slow
def test_job_needing_a_refused_node_names_its_client_id(secure, probe, tmp_path):
    """A 3-client job: client 2 only has an unregistered SuperNode, so it never comes.
    (The connect timeout must cover the other nodes' first ClientApp start.)"""
    node = secure.supernode("stranger3", 2, insecure=False, root_certificates=secure.ca,
                            auth_private_key=str(secure.certs / "supernode-3.key"))
    cfg = config(tmp_path / "job", secure)
    cfg.clients.num_clients = 3
    t0 = time.perf_counter()
    with pytest.raises(DeploymentError, match=r"no SuperNode for client id\(s\) \[2\] after 40 s"):
        submit_job(cfg, quiet=True, connect_timeout=40)
    print(f"failing job: {time.perf_counter() - t0:.1f} s")
    _wait_exit(node)
    assert "Failed to activate SuperNode" in node.log_tail()


# --------------------------------------------------------------------------- (c) TLS


@pytest.mark.slow  # 15 s idle, 2-core AVX2 (2026-12-03); kept: the control API's refusal
def test_supernode_without_the_ca_certificate_cannot_connect(secure):
    # A registered key, so only TLS stands in the way.
    [node_id] = register_supernodes(secure.superlink, [secure.certs / "supernode-4.pub"],
                                    root_certificates=secure.ca)
    key = str(secure.certs / "supernode-4.key")
    no_ca = secure.supernode("no-ca", 2, insecure=False, auth_private_key=key)
    plain = secure.supernode("plain", 2, insecure=True)  # Flower allows no key without TLS
    log = _wait_exit(no_ca)
    assert no_ca.popen.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in log
    # Plain HTTP to the HTTPS port: Flower retries forever; it never gets through.
    _wait_for(lambda: plain.log_tail(200).count("Connection attempt failed") >= 2, REFUSED_WAIT,
              "the plain-HTTP SuperNode to fail twice")
    assert plain.alive() and "SuperNode ID:" not in plain.log_tail(400)
    nodes = secure.nodes_by_id()
    assert nodes[node_id] == "registered"  # never online
    assert set(nodes) == {*secure.node_ids, node_id}
    plain.stop()


def test_control_api_needs_the_ca_certificate(secure, probe, tmp_path):
    # flwr hides the TLS error ("unavailable"); fedkt's message points at the certificate.
    with pytest.raises(DeploymentError, match=r"(?s)TLS: is the SuperLink's certificate signed "
                       r"by runtime.flower.root_certificates=the system CAs.*unavailable"):
        list_supernodes(secure.superlink)  # TLS with the system's CAs only
    cfg = config(tmp_path / "job", secure)
    cfg.runtime.flower.insecure = True  # plain HTTP to the HTTPS port
    with pytest.raises(DeploymentError, match=r"could not start the job .*plain HTTP"):
        submit_job(cfg, quiet=True)


# --------------------------------------------------------------------------- commands, errors


def test_secure_commands_and_clear_errors(tmp_path):
    files = certs.generate_certs(tmp_path / "c", nodes=1)
    tls = TLS.from_dir(tmp_path / "c")
    cmd = superlink_command("0.0.0.0", 9093, insecure=False, tls=tls, enable_supernode_auth=True)
    assert cmd == ["flower-superlink", "--host", "0.0.0.0", "--port", "9093",
                   "--disable-runtime-dependency-installation",
                   "--ssl-certfile", str(files.server_cert), "--ssl-keyfile",
                   str(files.server_key), "--ssl-ca-certfile", str(files.ca_cert),
                   "--enable-supernode-auth"]
    cmd = supernode_command(0, 2, "10.0.0.1:9093", port=9200, insecure=False,
                            root_certificates=str(files.ca_cert),
                            auth_private_key=str(files.node_keys[0][0]))
    assert cmd[-4:] == ["--root-certificates", str(files.ca_cert),
                        "--auth-supernode-private-key", str(files.node_keys[0][0])]
    assert "--insecure" not in cmd

    with pytest.raises(DeploymentError, match="--ssl-keyfile: no such file .*nope.key"):
        superlink_command(insecure=False, tls=TLS(tls.certfile, str(tmp_path / "nope.key"),
                                                  tls.ca_certfile))
    with pytest.raises(DeploymentError, match="needs a SuperLink --ssl-ca-certfile"):
        superlink_command(insecure=False, tls=TLS(tls.certfile, tls.keyfile))
    with pytest.raises(DeploymentError, match="needs TLS"):
        superlink_command(insecure=True, enable_supernode_auth=True)
    with pytest.raises(DeploymentError, match="needs TLS: drop --insecure"):
        supernode_command(0, 2, insecure=True, auth_private_key=str(files.node_keys[0][0]))
    with pytest.raises(DeploymentError, match="--auth-supernode-private-key: no such file"):
        supernode_command(0, 2, insecure=False, auth_private_key=str(tmp_path / "k"))
    with pytest.raises(DeploymentError, match="runtime.flower.root_certificates: no such file"):
        write_cli_config(tmp_path / "home", "127.0.0.1:1", insecure=False,
                         root_certificates="missing-ca.crt")
    conf = write_cli_config(tmp_path / "home", "127.0.0.1:1", insecure=False,
                            root_certificates=str(files.ca_cert)).read_text()
    assert f'root-certificates = "{files.ca_cert}"' in conf and "insecure = false" in conf


# --------------------------------------------------------------------------- certificates


def test_generated_certificates_verify_and_keys_load(tmp_path):
    files = certs.generate_certs(tmp_path, ["10.1.2.3", "link.example.org"], nodes=2)
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert sorted(certs.server_cert_hosts(files.server_cert)) == sorted(
        ["10.1.2.3", "127.0.0.1", "link.example.org", "localhost"])
    server_key = serialization.load_pem_private_key(files.server_key.read_bytes(), None)
    assert server_key.public_key().public_numbers() == server.public_key().public_numbers()
    serialization.load_pem_private_key(files.ca_key.read_bytes(), None)
    for k, (priv, pub) in enumerate(files.node_keys):
        assert (priv.name, pub.name) == certs.node_key_names(k) == (
            f"supernode-{k}.key", f"supernode-{k}.pub")
        key = serialization.load_ssh_private_key(priv.read_bytes(), None)
        public = serialization.load_ssh_public_key(pub.read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert isinstance(key.curve, ec.SECP384R1)
        assert key.public_key().public_numbers() == public.public_numbers()
    for private in (files.ca_key, files.server_key, files.node_keys[0][0]):
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o600, private

    # Re-running keeps what exists (same CA) and only adds the new node keys.
    before = files.ca_cert.read_bytes(), files.node_keys[0][0].read_bytes()
    again = certs.generate_certs(tmp_path, nodes=3)
    assert again.written == list(again.node_keys[2])
    assert (files.ca_cert.read_bytes(), files.node_keys[0][0].read_bytes()) == before
    forced = certs.generate_certs(tmp_path, nodes=1, overwrite=True)
    assert files.ca_cert in forced.written and files.ca_cert.read_bytes() != before[0]
    with pytest.raises(ValueError, match="cannot load the private key .*ca.key"):
        files.ca_key.write_text("garbage")
        files.server_cert.unlink()
        certs.generate_certs(tmp_path)


def test_certs_cli(tmp_path, capsys):
    from fedkt.cli import main

    assert main(["deploy", "certs", "--out", str(tmp_path), "--host", "10.0.0.7",
                 "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "supernode-1.pub" in out
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"ca.crt", "ca.key", "server.pem", "server.key", "supernode-0.key",
                     "supernode-0.pub", "supernode-1.key", "supernode-1.pub"}
    assert "10.0.0.7" in certs.server_cert_hosts(tmp_path / "server.pem")
