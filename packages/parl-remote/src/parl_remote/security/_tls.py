"""TLS for every connection of a cluster started with `--tls` (or `PARL_TLS=1`).

Settings come from the environment, so that a master, its workers, their actor processes and
the clients agree without flags (`xparl ... --tls` sets them for the processes it starts):

- `PARL_TLS=1`: speak TLS 1.3 on every connection, never plaintext.
- `PARL_TLS_CERT` / `PARL_TLS_KEY`: the certificate and key servers present. Without them, the
  cluster's own ones in `$PARL_HOME/tls/` (`cert.pem`, `key.pem`, signed by the cluster CA
  `ca.pem`), made when first needed (`xparl start --tls`).
- `PARL_TLS_CA`: a client trusts only certificates signed by this CA (chain verification).
  Without it, a client trusts the cluster CA it fetched from the master and checked with the
  token (`_tls_join`: also how a worker on another machine gets a certificate it signed).

Besides, the client verifies the server's certificate with the cluster token: the token
handshake runs under a key derived from the token and the SHA-256 of the server's certificate
(RFC 5929's "tls-server-end-point" binding), so a peer that presents any other certificate -- a
relay in the middle -- cannot complete it. A blocking client leaves its TLS records to the ssl
module's socket (`_tls_context.client_socket`). Servers and asyncio clients handle them here
with `ssl.MemoryBIO` (`TLSSocket`, `TLSProtocol`), so that a connection authenticated on one
thread can move to an event loop with its TLS session, and so that a plaintext peer is
recognised: a server never speaks plaintext to it, it sends a TLS alert record and closes
(the plaintext client reads that record as the answer of a TLS cluster and says so), and logs
it. A master also answers join requests (`_tls_join`) inside TLS, on connections whose
ClientHello asks for them by ALPN.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import Any, cast

from parl_remote._exceptions import ClusterError
from parl_remote.security import _tls_join
from parl_remote.security._tls_certs import ensure_cluster_files, tls_dir
from parl_remote.security._tls_context import (
    JOIN_ALPN,
    NativeTLSSocket,
    bind,
    client_context,
    client_socket,
    enabled,
    handshake_error,
    server_context,
)

__all__ = [
    "ALERT",
    "NativeTLSSocket",
    "PLAINTEXT_WAIT_S",
    "TLSProtocol",
    "TLSSocket",
    "adopt",
    "bind",
    "client_context",
    "client_socket",
    "enabled",
    "ensure_cluster_files",
    "server_context",
    "tls_dir",
]

logger = logging.getLogger(__name__)
_HANDSHAKE_RECORD = 0x16  # the first byte a TLS client sends
PLAINTEXT_WAIT_S = 2.0
"""A peer silent this long after connecting is a plaintext client waiting to be challenged."""
_READ = 256 << 10
_SLICE = 256 << 10  # plaintext encrypted per write: one huge write is many times slower
ALERT = bytes((0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0A))
"""What a TLS server sends a plaintext peer before it closes: a TLS record, a fatal alert
(`unexpected_message`, RFC 8446 section 6)."""


class TLSSocket:
    """A blocking socket with TLS on top, with what `SyncConnection` uses of a socket.

    Args:
        sock: the connected socket (None under a `TLSProtocol`, which moves the bytes).
        server_side: whether this end accepted the connection.
    """

    def __init__(self, sock: socket.socket | None, server_side: bool) -> None:
        self.raw: Any = sock
        self.server_side = server_side
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        if server_side:
            ctx, self.cert_der = server_context()
        else:
            ctx, self.cert_der = client_context(), b""
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=server_side)

    def handshake(self, where: str) -> bytes:
        """Run the TLS handshake; return the DER of the server's certificate."""
        if self.server_side:
            self._sniff(where)
        try:
            while True:
                try:
                    self.obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._flush()
                    if not self._fill():
                        raise ConnectionError("the peer closed during the TLS handshake") from None
            self._flush()
        except ssl.SSLError as exc:
            with contextlib.suppress(OSError):
                self._flush()
            raise handshake_error(exc, where) from None
        if self.server_side:
            if self.obj.selected_alpn_protocol() == JOIN_ALPN:
                raise ClusterError(f"a join request to a server that is no master ({where})")
            return self.cert_der
        der = self.obj.getpeercert(binary_form=True)
        if not der:  # pragma: no cover - TLS 1.3 servers always present one
            raise ClusterError(f"{where} presented no certificate")
        return der

    def _sniff(self, where: str) -> None:
        timeout = self.raw.gettimeout()
        self.raw.settimeout(min(PLAINTEXT_WAIT_S, timeout or PLAINTEXT_WAIT_S))
        try:
            first = self.raw.recv(_READ)
        except TimeoutError:
            first = None
        self.raw.settimeout(timeout)
        if first is None or (first and first[0] != _HANDSHAKE_RECORD):
            with contextlib.suppress(OSError):
                self.raw.sendall(ALERT)
            raise ClusterError(f"refused a plaintext peer ({where}): this cluster speaks TLS only")
        if not first:
            raise ConnectionError("the peer closed before the TLS handshake")
        self.incoming.write(first)

    def _flush(self) -> None:
        out = self.outgoing.read()
        if out:
            self.raw.sendall(out)

    def _fill(self) -> bool:
        data = self.raw.recv(_READ)
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        return bool(data)

    # the socket methods SyncConnection and its users call
    def recv_into(self, buf: Any) -> int:
        """Read decrypted bytes into `buf`; 0 when the peer closed."""
        while True:
            try:
                return cast(int, self.obj.read(len(buf), buf))
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    return 0
            except ssl.SSLZeroReturnError:
                return 0
            except ssl.SSLError as exc:
                raise ConnectionError(f"a bad TLS record: {exc}") from None

    def sendall(self, data: Any) -> None:
        """Encrypt and send all of `data`."""
        self.sendmsg([data])

    def sendmsg(self, views: list[Any]) -> int:
        """Encrypt and send every buffer (all of them: what `sendmsg` may do partly)."""
        for chunk in _slices(views):
            self.obj.write(chunk)
            if self.outgoing.pending >= _SLICE:
                self._flush()
        self._flush()
        return sum(len(v) for v in views)

    def settimeout(self, value: float | None) -> None:
        """As `socket.settimeout`."""
        self.raw.settimeout(value)

    def setblocking(self, flag: bool) -> None:
        """As `socket.setblocking`."""
        self.raw.setblocking(flag)

    @property
    def family(self) -> int:
        """The raw socket's family."""
        return cast(int, self.raw.family)

    def setsockopt(self, *args: Any) -> None:
        """As `socket.setsockopt`."""
        self.raw.setsockopt(*args)

    def close(self) -> None:
        """Close the raw socket."""
        self.raw.close()

    def shutdown(self, how: int) -> None:
        """As `socket.shutdown`."""
        self.raw.shutdown(how)


def _slices(chunks: Iterable[Any]) -> Iterable[Any]:
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, len(view), _SLICE):
            yield view[start : start + _SLICE]


def adopt(conn: Any, factory: Callable[[], asyncio.BaseProtocol]) -> tuple[Any, Any]:
    """For `loop.connect_accepted_socket`: the socket and protocol factory of `conn`.

    A `SyncConnection` over TLS moves to the loop with its TLS session (a `TLSProtocol` over
    the raw socket); a plain one as it is.
    """
    sock = conn.sock
    if not isinstance(sock, TLSSocket):
        sock.setblocking(False)
        return sock, factory
    sock.setblocking(False)
    return sock.raw, lambda: TLSProtocol(factory(), tls=sock)


class _Facade(asyncio.Transport):
    """What the application protocol sees as its transport: writes are encrypted."""

    def __init__(self, owner: TLSProtocol) -> None:
        super().__init__()
        self._owner = owner

    def write(self, data: Any) -> None:
        self._owner.encrypt([data])

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self._owner.encrypt(list_of_data)

    def is_closing(self) -> bool:
        raw = self._owner.raw
        return raw is None or raw.is_closing()

    def close(self) -> None:
        if self._owner.raw is not None:
            self._owner.raw.close()

    def abort(self) -> None:
        if self._owner.raw is not None:
            self._owner.raw.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._owner.tls.obj
        raw = self._owner.raw
        return default if raw is None else raw.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._owner.raw is not None:
            self._owner.raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        raw = self._owner.raw
        return 0 if raw is None else raw.get_write_buffer_size()

    def pause_reading(self) -> None:
        if self._owner.raw is not None:
            self._owner.raw.pause_reading()

    def resume_reading(self) -> None:
        if self._owner.raw is not None:
            self._owner.raw.resume_reading()


class TLSProtocol(asyncio.Protocol):
    """TLS between a raw asyncio transport and an application protocol (a BufferedProtocol).

    Args:
        app: the protocol that reads and writes plaintext.
        server_side: for a fresh connection: whether this end accepted it.
        tls: an established `TLSSocket` to continue (its handshake is done).
    """

    def __init__(
        self, app: Any, *, server_side: bool = False, tls: TLSSocket | None = None
    ) -> None:
        self.app = app
        self.tls = tls if tls is not None else TLSSocket(None, server_side)
        self.raw: asyncio.Transport | None = None
        self.secure = tls is not None
        self._timers: list[asyncio.TimerHandle] = []
        self._first = True
        self._error: Exception | None = None
        self._join: bytearray | None = None  # a join request arriving inside TLS (`_tls_join`)
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = cast(asyncio.Transport, transport)  # a stream (uvloop's is no subclass)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self.secure:
            self.app.connection_made(_Facade(self))
            return
        from parl_remote._config import settings

        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(settings.connect_timeout_s, self._expire))
        if self.tls.server_side:
            self._timers.append(loop.call_later(PLAINTEXT_WAIT_S, self._refuse_plaintext))
        else:
            self._handshake()

    def _expire(self) -> None:
        if not self.secure:
            self._fail(ConnectionError(f"no TLS handshake with {self.peer} in time"))

    def _refuse_plaintext(self) -> None:
        logger.warning("refused a plaintext peer at %s: the cluster requires TLS", self.peer)
        if self.raw is not None and not self.raw.is_closing():
            self.raw.write(ALERT)
            self.raw.close()

    def data_received(self, data: bytes) -> None:
        if self._first and self.tls.server_side and not self.secure:
            self._first = False
            self._timers.pop().cancel()  # the plaintext wait
            if data[:1] != bytes([_HANDSHAKE_RECORD]):
                self._refuse_plaintext()
                return
        self.tls.incoming.write(data)
        if self._join is not None:
            self._joining()
            return
        if not self.secure:
            self._handshake()
            if not self.secure:
                return
        self._decrypt()

    def _joining(self) -> None:
        """A join request to the master (`_tls_join`): answer it once whole, then close.

        The application never starts on such a connection; its connect timer still runs.
        """
        join = cast(bytearray, self._join)
        try:
            while chunk := self.tls.obj.read(_READ):
                join += chunk
        except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
            pass
        except ssl.SSLError as exc:
            self._fail(ConnectionError(f"a bad TLS record: {exc}"))
            return
        reply = _tls_join.answer(join, self.app.proto._token, self.peer)
        if reply is not None and self.raw is not None:
            self.tls.obj.write(reply)
            self._send_out()
            self.raw.close()

    def _handshake(self) -> None:
        try:
            self.tls.obj.do_handshake()
        except ssl.SSLWantReadError:
            self._send_out()
            return
        except ssl.SSLError as exc:
            self._send_out()
            self._fail(handshake_error(exc, self.peer))
            return
        self._send_out()
        if self.tls.server_side and self.tls.obj.selected_alpn_protocol() == JOIN_ALPN:
            if self.app.proto.role != "master":
                self._fail(ClusterError("a join request to a server that is no master"))
                return
            self._join = bytearray()
            self._joining()
            return
        self.secure = True
        for timer in self._timers:
            timer.cancel()
        bind(self.app.proto, self.tls.cert_der or self.tls.obj.getpeercert(binary_form=True))
        self.app.connection_made(_Facade(self))
        if self.tls.incoming.pending:
            self._decrypt()

    def _fail(self, exc: Exception) -> None:
        logger.warning("closing the connection with %s: %s", self.peer, exc)
        self._error = self._error or exc
        if self.raw is not None:
            self.raw.close()

    def _decrypt(self) -> None:
        app, obj, incoming = self.app, self.tls.obj, self.tls.incoming
        while incoming.pending or obj.pending():  # else all is read: no exception to say so
            buf = app.get_buffer(-1)
            try:
                n = obj.read(len(buf), buf)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                break
            except ssl.SSLError as exc:
                self._fail(ConnectionError(f"a bad TLS record: {exc}"))
                return
            if not n:
                break
            app.buffer_updated(n)
            if self.raw is None or self.raw.is_closing():
                return
        self._send_out()

    def encrypt(self, chunks: Iterable[Any]) -> None:
        """Encrypt plaintext from the application and write it."""
        if self.raw is None or self.raw.is_closing():
            return
        for chunk in _slices(chunks):
            self.tls.obj.write(chunk)
            if self.tls.outgoing.pending >= _SLICE:
                self._send_out()
        self._send_out()

    def _send_out(self) -> None:
        out = self.tls.outgoing.read()
        if out and self.raw is not None and not self.raw.is_closing():
            self.raw.write(out)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers:
            timer.cancel()
        self.raw = None
        if self.secure:
            self.app.connection_lost(exc)
        else:  # the application never started: it learns why (an opener's error)
            self.app.connection_lost(
                self._error or exc or ConnectionError(f"{self.peer} closed before TLS was set up")
            )

    def pause_writing(self) -> None:
        if self.secure:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.secure:
            self.app.resume_writing()
