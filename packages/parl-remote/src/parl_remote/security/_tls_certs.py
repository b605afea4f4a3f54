"""Making a cluster's own CA and server certificate (needs the `cryptography` package).

`xparl start --tls` without `--tls-cert` writes, into `$PARL_HOME/tls/`, a CA (`ca.pem`,
`ca-key.pem`) and a certificate signed by it (`cert.pem`, `key.pem`) for `localhost`, the loopback
address and the hosts the cluster is reached at; keys are readable by their owner only. Give
`ca.pem` to what checks certificate chains (`PARL_TLS_CA`, a browser for the dashboard).
A worker on another machine makes a key of its own and has the master sign a request for it
(`make_request`, `sign_request`; see `_tls_join.py`): the CA's key never leaves its machine.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from parl_remote._exceptions import ClusterError

__all__ = [
    "ensure_cluster_files",
    "make_ca",
    "make_cluster_files",
    "make_request",
    "sign_request",
    "tls_dir",
]

_DAYS = 3650
_MAX_NAMES = 16  # host names a signing request may ask for


def tls_dir() -> Path:
    """Where the cluster's own CA, certificate and key live."""
    from parl_remote._config import parl_home

    return parl_home() / "tls"


def ensure_cluster_files(hosts: Iterable[str] = ()) -> tuple[str, str]:
    """Return (certificate, key) paths, making the cluster CA and a certificate if missing."""
    d = tls_dir()
    cert, key = d / "cert.pem", d / "key.pem"
    if cert.exists() and key.exists() and (d / "ca.pem").exists() and not hosts:
        return str(cert), str(key)  # made already: no lock needed to read them
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, stat.S_IRWXU)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cert.exists() and key.exists() and (d / "ca.pem").exists()):
            make_cluster_files(d, ["localhost", "127.0.0.1", *hosts])
    return str(cert), str(key)


def _require() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ClusterError(
            "making the cluster's TLS certificate needs the cryptography package "
            "(pip install 'parl-remote[tls]'), or give your own with --tls-cert/--tls-key "
            "(PARL_TLS_CERT/PARL_TLS_KEY)"
        ) from None


def _write(path: Path, data: bytes, private: bool) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _issue(subject: str, issuer: Any, issuer_key: Any, key: Any, extensions: list[Any]) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_DAYS))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key if issuer_key is not None else key, hashes.SHA256())


def _save(directory: Path, cert_name: str, key_name: str, cert: Any, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(directory / key_name, key_pem, True)
    _write(directory / cert_name, cert.public_bytes(pem), False)


def make_ca(directory: Path, name: str = "PARL cluster CA") -> tuple[Any, Any]:
    """Write a new CA (`ca.pem`, `ca-key.pem`) into `directory`; return (certificate, key)."""
    _require()
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(name, None, None, key, [(x509.BasicConstraints(ca=True, path_length=0), True)])
    directory.mkdir(parents=True, exist_ok=True)
    _save(directory, "ca.pem", "ca-key.pem", cert, key)
    return cert, key


def make_cluster_files(directory: Path, hosts: Iterable[str]) -> None:
    """Write a CA (if there is none) and a server certificate for `hosts` into `directory`."""
    _require()
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if (directory / "ca.pem").exists() and (directory / "ca-key.pem").exists():
        ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        ca_key: Any = serialization.load_pem_private_key(
            (directory / "ca-key.pem").read_bytes(), password=None
        )
    else:
        ca_cert, ca_key = make_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue("PARL cluster", ca_cert.subject, ca_key, key, [(_names(hosts), False)])
    _save(directory, "cert.pem", "key.pem", cert, key)


def _names(hosts: Iterable[str]) -> Any:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_request(directory: Path, hosts: Iterable[str]) -> bytes:
    """Write a new key (`key.pem`) into `directory`; return a signing request for it (DER)."""
    _require()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "PARL cluster worker")])
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(name)
        .add_extension(_names(["localhost", "127.0.0.1", *hosts]), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, stat.S_IRWXU)
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(directory / "key.pem", key_pem, True)
    return bytes(request.public_bytes(serialization.Encoding.DER))


def sign_request(directory: Path, request_der: bytes) -> bytes:
    """A certificate (PEM) for a worker's signing request, signed by the CA in `directory`.

    Raises:
        ClusterError: no CA key here, or a malformed request.
    """
    _require()
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if not (directory / "ca-key.pem").exists():
        raise ClusterError(
            "this cluster signs no certificates (it has no CA key of its own): give the "
            "worker a certificate with --tls-cert/--tls-key"
        )
    try:
        request = x509.load_der_x509_csr(request_der)
        names = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound) as exc:
        raise ClusterError(f"a malformed certificate signing request: {exc}") from None
    if not request.is_signature_valid or len(list(names)) > _MAX_NAMES:
        raise ClusterError(
            f"a certificate signing request with a bad signature or over {_MAX_NAMES} names"
        )
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key: Any = serialization.load_pem_private_key(
        (directory / "ca-key.pem").read_bytes(), password=None
    )
    cert = _issue("PARL cluster worker", ca_cert.subject, ca_key, request, [(names, False)])
    return bytes(cert.public_bytes(serialization.Encoding.PEM))
