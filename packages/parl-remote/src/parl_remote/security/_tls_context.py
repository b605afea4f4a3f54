"""TLS settings of this process: its contexts, and the blocking client socket (`_tls.py`).

`server_context` is what servers present (`PARL_TLS_CERT`/`PARL_TLS_KEY`, else the cluster's
own files); `client_context` verifies the chain against `PARL_TLS_CA` or the CA fetched from the
master (`_tls_join`), and `bind` ties the token handshake to the server's certificate. A
blocking client (`client_socket`) leaves TLS to the ssl module, in C: no record passes through
Python. `join_context` is for the one exchange that precedes trust, the join request: its
ClientHello asks for `JOIN_ALPN`, which servers accept and only a master answers. Contexts are
made once per setting.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from parl_remote._config import env_flag
from parl_remote._exceptions import ClusterError
from parl_remote.security._tls_certs import ensure_cluster_files

__all__ = [
    "JOIN_ALPN",
    "NativeTLSSocket",
    "bind",
    "client_context",
    "client_socket",
    "enabled",
    "forget",
    "handshake_error",
    "join_context",
    "server_context",
    "trust_fetched",
    "trusted",
]


def enabled() -> bool:
    """Whether this process speaks TLS (`PARL_TLS`: 1, true, yes or on; unset, 0, false, ...).

    Raises:
        SettingError: `PARL_TLS` is neither on nor off (`maybe`).
    """
    return env_flag("PARL_TLS")


JOIN_ALPN = "parl-join"
"""The ALPN protocol of a join request (`_tls_join`): the master answers it, then closes."""

_contexts: dict[tuple[Any, ...], tuple[ssl.SSLContext, bytes]] = {}
_trusted: bytes | None = None  # the cluster CA fetched by this process (PEM; `_tls_join`)


def trust_fetched(ca: bytes) -> None:
    """Verify servers against `ca` (PEM), the cluster CA fetched and checked by `_tls_join`."""
    global _trusted
    _trusted = ca


def trusted() -> bytes | None:
    """The cluster CA (PEM) this process fetched and verified, if any."""
    return _trusted


def forget() -> None:
    """Trust the fetched CA no more (this process left its cluster)."""
    global _trusted
    _trusted = None


def server_context() -> tuple[ssl.SSLContext, bytes]:
    """The servers' TLS 1.3 context and the DER of the certificate they present."""
    cert, key = os.environ.get("PARL_TLS_CERT"), os.environ.get("PARL_TLS_KEY")
    if not cert or not key:
        cert, key = ensure_cluster_files()
    cache = ("server", cert, key, os.stat(cert).st_mtime_ns)
    if cache not in _contexts:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ClusterError(f"cannot load the TLS certificate {cert}, key {key}: {exc}") from exc
        ctx.set_alpn_protocols([JOIN_ALPN])  # a client that offers no ALPN (or others) is served
        end = "-----END CERTIFICATE-----"  # the first of a chain is the server's own
        der = ssl.PEM_cert_to_DER_cert(Path(cert).read_text().split(end)[0] + end + "\n")
        _contexts[cache] = (ctx, der)
    return _contexts[cache]


def client_context() -> ssl.SSLContext:
    """The clients' TLS 1.3 context: chain verification with `PARL_TLS_CA` or the fetched CA."""
    ca = os.environ.get("PARL_TLS_CA") or None
    fetched = None if ca else _trusted  # the cluster CA, fetched from the master
    cache = ("client", ca, fetched)
    if cache not in _contexts:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False  # addresses are often bare IPs; the token binds the peer
        if ca:
            try:
                ctx.load_verify_locations(ca)
            except (OSError, ssl.SSLError) as exc:
                raise ClusterError(f"cannot load PARL_TLS_CA={ca}: {exc}") from exc
        elif fetched:
            ctx.load_verify_locations(cadata=fetched.decode())
        else:
            ctx.verify_mode = ssl.CERT_NONE  # verified by the token binding (`bind`)
        ctx.sslsocket_class = NativeTLSSocket
        _contexts[cache] = (ctx, b"")
    return _contexts[cache][0]


def join_context() -> ssl.SSLContext:
    """The context of a join request: TLS 1.3 before any CA is trusted, asking for `JOIN_ALPN`.

    It verifies no certificate: what the master answers is checked with the token instead.
    """
    cache = ("join",)
    if cache not in _contexts:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the answer carries the token's tag (`_tls_join`)
        ctx.set_alpn_protocols([JOIN_ALPN])
        _contexts[cache] = (ctx, b"")
    return _contexts[cache][0]


def bind(proto: Any, cert_der: bytes | None) -> None:
    """Make the token handshake of `proto` prove the server's certificate too."""
    token = proto._token  # the sans-I/O handshake reads its key from here
    if token is not None and cert_der:
        binding = b"parl-tls-server-end-point" + hashlib.sha256(cert_der).digest()
        proto._token = hmac.new(token, binding, hashlib.sha256).hexdigest().encode()


def handshake_error(exc: Exception, where: str) -> ClusterError:
    text = str(exc)
    if "WRONG_VERSION_NUMBER" in text or "RECORD_LAYER" in text or "packet length" in text:
        return ClusterError(f"{where} does not speak TLS (a plaintext cluster?): {text}")
    return ClusterError(f"the TLS handshake with {where} failed: {text}")


class NativeTLSSocket(ssl.SSLSocket):
    """A blocking client socket whose TLS the ssl module does in C (`client_socket`)."""

    def handshake(self, where: str) -> bytes:
        """Run the TLS handshake; return the DER of the server's certificate."""
        try:
            self.do_handshake()
        except ssl.SSLError as exc:
            raise handshake_error(exc, where) from None
        der = self.getpeercert(binary_form=True)
        if not der:  # pragma: no cover - TLS 1.3 servers always present one
            raise ClusterError(f"{where} presented no certificate")
        return der

    def sendmsg(self, views: Iterable[Any], *_: Any) -> int:  # type: ignore[override]
        """Encrypt and send every buffer, all of it (`SyncConnection` writes frames so)."""
        total = 0
        for view in views:
            self.sendall(view)
            total += memoryview(view).nbytes
        return total


def client_socket(sock: socket.socket) -> NativeTLSSocket:
    """`sock` (connected, blocking) with TLS on top; call `handshake` next."""
    tls = client_context().wrap_socket(sock, do_handshake_on_connect=False)
    return cast(NativeTLSSocket, tls)
