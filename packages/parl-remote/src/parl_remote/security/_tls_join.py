"""Joining a TLS cluster with nothing but its token: the cluster CA, and a worker's certificate.

Before it trusts any certificate, a client may ask the master for one of two things, in a small
exchange on a TLS connection of its own, whose ClientHello asks for it by ALPN (`JOIN_ALPN`):
the certificate is not verified there (the CA is what is being fetched), and the master answers
one request, then closes the connection. Nothing of it is plaintext on the wire: a TLS cluster
never speaks plaintext, and a client's first bytes are always its ClientHello.

- the cluster CA: the master answers with the CA's certificate (PEM) and a tag, HMAC-SHA256
  under a key derived from the cluster token. The client checks the tag before it trusts the
  certificate, so someone in between without the token cannot hand it another CA, and a
  mismatch (a wrong token, a forged CA) is an error that trusts nothing. The certificate is
  public; the tag, a MAC of it, reveals nothing of the token, and the request carries no input
  of the asker's, so the master is no oracle for it.
- a certificate for a worker on another machine: the worker makes a key (which never leaves it)
  and sends a signing request tagged under the token; the master checks the tag and answers
  with a certificate signed by the cluster CA, tagged (with the request's digest) the same way.
  Its actors then present a certificate that clients verify against the CA they fetched. The
  CA's key never leaves the master's machine.

Every size is bounded (a request at most `MAX_REQUEST` bytes, an answer `MAX_ANSWER`). A client
then verifies the chain of every server of the cluster against the CA it was given (in memory;
a worker also writes it beside its own certificate and names both in its environment, for its
actor processes). `PARL_TLS_CA=path` overrides all this: then nothing is fetched. A cluster
that uses certificates of its own (`--tls-cert`) gives the CA named by its `PARL_TLS_CA`, if any.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import socket
import ssl
import struct
from pathlib import Path

from parl_remote._exceptions import AuthenticationError, ClusterError
from parl_remote.security import _tls_context

__all__ = [
    "MAGIC",
    "MAX_ANSWER",
    "MAX_REQUEST",
    "answer",
    "fetch_ca",
    "join_as_worker",
    "request_certificate",
    "trust",
]

logger = logging.getLogger(__name__)
MAGIC = b"PRLJ"
"""The first bytes of a join request and of its answer."""
MAX_REQUEST = 8 << 10
MAX_ANSWER = 64 << 10
_HEAD = struct.Struct("<4scI")  # magic, kind (request) or status (answer), body length
_TAG = 32
_CA, _SIGN, _OK, _ERROR = b"C", b"S", b"+", b"-"


def _tag(token: bytes, label: bytes, body: bytes) -> bytes:
    key = hmac.new(token, b"parl-tls-join", hashlib.sha256).digest()
    return hmac.new(key, label + b"|" + body, hashlib.sha256).digest()


# -- the master's side ---------------------------------------------------------------------------
def _error(reason: str) -> bytes:
    body = reason.encode()[:1024]
    return _HEAD.pack(MAGIC, _ERROR, len(body)) + body


def _served_ca() -> tuple[bytes | None, Path | None]:
    """The CA this master gives, and the directory of its key when it signs."""
    from parl_remote.security._tls_certs import ensure_cluster_files, tls_dir

    if os.environ.get("PARL_TLS_CERT"):  # certificates of the user's own
        ca = os.environ.get("PARL_TLS_CA")
        return (Path(ca).read_bytes() if ca else None), None
    ensure_cluster_files()
    return (tls_dir() / "ca.pem").read_bytes(), tls_dir()


def answer(request: bytes | bytearray, token: bytes, peer: str) -> bytes | None:
    """The master's answer to a join request; None while the request is incomplete."""
    if len(request) < _HEAD.size:
        head = bytes(request[: len(MAGIC)])
        return None if MAGIC.startswith(head) else _error("not a join request")
    magic, kind, length = _HEAD.unpack_from(request)
    if magic != MAGIC or kind not in (_CA, _SIGN) or length > MAX_REQUEST:
        return _error(f"a bad join request (at most {MAX_REQUEST} bytes)")
    size = _HEAD.size + length + (_TAG if kind == _SIGN else 0)
    if len(request) < size:
        return None
    if len(request) > size:
        return _error("bytes after the join request")
    try:
        ca, signer = _served_ca()
    except (OSError, ClusterError) as exc:
        return _error(f"the master cannot read its CA: {exc}")
    if kind == _CA:
        if ca is None:
            return _error(
                "this cluster's certificates are its own and it names no CA: set "
                "PARL_TLS_CA to the CA that signed them"
            )
        return _HEAD.pack(MAGIC, _OK, len(ca)) + ca + _tag(token, b"ca", ca)
    body = bytes(request[_HEAD.size : _HEAD.size + length])
    if not hmac.compare_digest(bytes(request[-_TAG:]), _tag(token, b"sign", body)):
        logger.warning("refused a certificate request from %s: not tagged by the token", peer)
        return _error("the certificate request is not tagged with this cluster's token")
    from parl_remote.security._tls_certs import sign_request

    try:
        if signer is None:
            raise ClusterError("this cluster signs no certificates: give the worker --tls-cert")
        cert = sign_request(signer, body)
    except ClusterError as exc:
        return _error(str(exc))
    logger.info("signed a certificate for a worker at %s", peer)
    digest = hashlib.sha256(body).digest()
    return _HEAD.pack(MAGIC, _OK, len(cert)) + cert + _tag(token, b"certificate", digest + cert)


# -- the joining side ----------------------------------------------------------------------------
def _exchange(host: str, port: int, request: bytes, timeout: float) -> bytes:
    """Send a join request inside TLS; return the answer's body and tag (checked for size only)."""
    where = f"{host}:{port}"
    with socket.create_connection((host, port), timeout=timeout) as raw:
        try:
            sock = _tls_context.join_context().wrap_socket(raw)
        except ssl.SSLError as exc:
            raise _tls_context.handshake_error(exc, where) from None
        if sock.selected_alpn_protocol() != _tls_context.JOIN_ALPN:
            sock.close()
            raise ClusterError(
                f"{where} speaks TLS but takes no join request: not the master of a TLS PARL "
                "cluster (check the address)"
            )
    with sock:
        sock.sendall(request)
        head = _read(sock, _HEAD.size, where)
        magic, status, length = _HEAD.unpack(head)
        if magic != MAGIC or status not in (_OK, _ERROR) or length > MAX_ANSWER:
            raise ClusterError(f"{where} does not answer as the master of a TLS PARL cluster")
        if status == _ERROR:
            reason = _read(sock, length, where).decode(errors="replace")
            raise ClusterError(f"the master at {where} refused: {reason}")
        return _read(sock, length + _TAG, where)


def _read(sock: ssl.SSLSocket, n: int, where: str) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ClusterError(
                f"{where} closed the connection instead of answering as the master of a TLS "
                "PARL cluster"
            )
        data += chunk
    return bytes(data)


def _timeout() -> float:
    from parl_remote._config import settings

    return settings.connect_timeout_s


def fetch_ca(host: str, port: int, token: bytes) -> bytes:
    """Ask the master for the cluster CA; return its certificate (PEM) once the tag checks.

    Raises:
        AuthenticationError: the tag does not match this token (nothing is trusted).
        ClusterError: no master answers there, or it has no CA to give.
    """
    reply = _exchange(host, port, _HEAD.pack(MAGIC, _CA, 0), _timeout())
    ca, tag = reply[:-_TAG], reply[-_TAG:]
    if not hmac.compare_digest(tag, _tag(token, b"ca", ca)):
        raise AuthenticationError(
            f"the cluster CA from {host}:{port} does not carry this cluster token's tag: the "
            "token is wrong (PARL_CLUSTER_TOKEN) or someone in between forged it; nothing was "
            "trusted"
        )
    return ca


def request_certificate(host: str, port: int, token: bytes, request_der: bytes) -> bytes:
    """Have the master sign a certificate request (DER); return the certificate (PEM)."""
    if len(request_der) > MAX_REQUEST:
        raise ValueError(f"a certificate request of {len(request_der)} bytes: over {MAX_REQUEST}")
    request = (
        _HEAD.pack(MAGIC, _SIGN, len(request_der)) + request_der + _tag(token, b"sign", request_der)
    )
    reply = _exchange(host, port, request, _timeout())
    cert, tag = reply[:-_TAG], reply[-_TAG:]
    digest = hashlib.sha256(request_der).digest()
    if not hmac.compare_digest(tag, _tag(token, b"certificate", digest + cert)):
        raise AuthenticationError(
            f"the certificate from {host}:{port} does not carry this cluster token's tag"
        )
    return cert


def trust(host: str, port: int, token: bytes) -> bytes | None:
    """Fetch and trust the cluster CA of the master at host:port, in this process.

    Nothing happens without TLS or with `PARL_TLS_CA` set (that CA is trusted instead). Returns
    the CA trusted (PEM), or None.
    """
    if not _tls_context.enabled() or os.environ.get("PARL_TLS_CA"):
        return None
    ca = fetch_ca(host, port, token)
    _tls_context.trust_fetched(ca)
    return ca


def join_as_worker(host: str, port: int, token: bytes | None, hosts: list[str]) -> None:
    """Trust the cluster CA and, on another machine, get a certificate it signed.

    On the master's machine (its CA is in `PARL_HOME/tls`) the cluster's files serve as they
    are. Elsewhere the certificate, its key and the CA go to `PARL_HOME/tls/joined/<CA digest>/`
    (made once per CA), and `PARL_TLS_CERT/KEY/CA` name them for this process and its children.
    """
    from parl_remote.security._tls_certs import make_request, tls_dir

    if token is None:  # no cluster token here: the connection fails later, saying so
        return
    ca = trust(host, port, token)
    if ca is None or os.environ.get("PARL_TLS_CERT"):
        return
    local = tls_dir()
    if (local / "ca.pem").exists() and (local / "ca.pem").read_bytes() == ca:
        os.environ["PARL_TLS_CA"] = str(local / "ca.pem")
        return
    mine = local / "joined" / hashlib.sha256(ca).hexdigest()[:16]
    mine.mkdir(parents=True, exist_ok=True)
    with open(mine / ".lock", "w") as lock:  # workers of one machine joining at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ((mine / "cert.pem").exists() and (mine / "key.pem").exists()):
            cert = request_certificate(host, port, token, make_request(mine, hosts))
            (mine / "ca.pem").write_bytes(ca)
            (mine / "cert.pem").write_bytes(cert)
    os.environ.update(
        PARL_TLS_CERT=str(mine / "cert.pem"),
        PARL_TLS_KEY=str(mine / "key.pem"),
        PARL_TLS_CA=str(mine / "ca.pem"),
    )
