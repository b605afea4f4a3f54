"""Making a cluster's own CA and server certificate (needs the `cryptography` package).

`xparl start --tls` without `--tls-cert` writes, into `$PARL_HOME/tls/`, a CA (`ca.pem`,
`ca-key.pem`) and a certificate signed by it (`cert.pem`, `key.pem`) for `localhost`, the loopback
address and the hosts the cluster is reached at; keys are readable by their owner only. Give
`ca.pem` to what checks certificate chains (`PARL_TLS_CA`, a browser for the dashboard).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from parl_remote._exceptions import ClusterError

__all__ = ["make_ca", "make_cluster_files"]

_DAYS = 3650


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
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(
        "PARL cluster", ca_cert.subject, ca_key, key, [(x509.SubjectAlternativeName(names), False)]
    )
    _save(directory, "cert.pem", "key.pem", cert, key)
