"""Certificates and keys for a secure Flower deployment (``fedkt deploy certs``).

:func:`generate_certs` writes, into one folder, with fixed names:

* ``ca.crt`` / ``ca.key``: a private certificate authority (EC P-384);
* ``server.pem`` / ``server.key``: the SuperLink's TLS certificate, signed by the CA,
  valid for the given host names and IP addresses (``subjectAltName``) plus
  ``127.0.0.1`` and ``localhost`` (the SuperLink's own ServerApp process connects to it
  through them);
* ``supernode-<k>.key`` / ``supernode-<k>.pub``: one EC P-384 key pair per SuperNode
  (``k`` = fedkt client id), OpenSSH format: what ``flower-supernode
  --auth-supernode-private-key`` and ``flwr supernode register`` read.

Files that already exist are kept (so ``--nodes`` can grow without a new CA) unless
``overwrite`` is set; a new server certificate is signed by the CA on disk.  Private
keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedkt.tracking.folder import atomic_write

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


def node_key_names(k: int) -> tuple[str, str]:
    """File names of SuperNode ``k``'s private and public key."""
    return f"supernode-{k}.key", f"supernode-{k}.pub"


@dataclass
class CertFiles:
    """Paths written (or kept) by :func:`generate_certs`."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    node_keys: list[tuple[Path, Path]] = field(default_factory=list)  # (private, public)
    written: list[Path] = field(default_factory=list)


def _write(path: Path, data: bytes, *, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data, mode=0o600 if private else 0o644)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"cannot load the private key {path}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: expected an EC private key")
    return key


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the certificate {path}: {exc}") from None


def san_entries(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """``subjectAltName`` entries: IP addresses as such, other names as DNS names."""
    out: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip().strip("[]") for h in hosts if h.strip()):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    if not out:
        raise ValueError("at least one host name or IP address is needed for the server "
                         "certificate")
    return out


def _make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedkt deployment CA")])
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA384()))
    return key, cert


def _make_server(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                 hosts: Sequence[str], days: int
                 ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    sans = san_entries(hosts)
    now = dt.datetime.now(dt.UTC)
    cn = str(sans[0].value)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=True, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA384()))
    return key, cert


def node_key_pair() -> tuple[bytes, bytes]:
    """A SuperNode key pair (EC P-384) as OpenSSH private and public key bytes."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    return private, public + b"\n"


def generate_certs(out: Path | str, hosts: Sequence[str] = DEFAULT_HOSTS, nodes: int = 0, *,
                   days: int = 365, overwrite: bool = False) -> CertFiles:
    """Write the CA, the SuperLink's server certificate and ``nodes`` SuperNode key pairs
    into ``out`` (see the module docstring); existing files are kept unless ``overwrite``."""
    if nodes < 0:
        raise ValueError(f"nodes must be >= 0, got {nodes}")
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    out = Path(out).expanduser()
    hosts = [*hosts, *DEFAULT_HOSTS]
    files = CertFiles(out / CA_CERT, out / CA_KEY, out / SERVER_CERT, out / SERVER_KEY)

    def missing(*paths: Path) -> bool:
        return overwrite or not all(p.exists() for p in paths)

    if missing(files.ca_cert, files.ca_key):
        ca_key, ca_cert = _make_ca(days)
        _write(files.ca_key, _pem_key(ca_key), private=True)
        _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
        files.written += [files.ca_cert, files.ca_key]
        new_ca = True
    else:
        ca_key, ca_cert, new_ca = _load_key(files.ca_key), _load_cert(files.ca_cert), False
    if new_ca or missing(files.server_cert, files.server_key):
        key, cert = _make_server(ca_key, ca_cert, hosts, days)
        _write(files.server_key, _pem_key(key), private=True)
        _write(files.server_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        files.written += [files.server_cert, files.server_key]
    for k in range(nodes):
        priv, pub = (out / name for name in node_key_names(k))
        files.node_keys.append((priv, pub))
        if missing(priv, pub):
            private, public = node_key_pair()
            _write(priv, private, private=True)
            _write(pub, public, private=False)
            files.written += [priv, pub]
    return files


def server_cert_hosts(path: Path | str) -> list[str]:
    """The host names and IP addresses a certificate is valid for (its SANs)."""
    cert = _load_cert(Path(path))
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in sans.get_values_for_type(x509.IPAddress)] + list(
        sans.get_values_for_type(x509.DNSName))
