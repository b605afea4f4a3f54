"""The two I/O shells over the sans-I/O `Connection`: blocking sockets and asyncio.

`SyncConnection` is for synchronous calls: the calling thread writes the request with one
`sendmsg` and reads the reply with `recv_into` straight into the protocol's buffers -- no event
loop and no thread hop on the path. `AsyncConnection` is an `asyncio.BufferedProtocol` for
servers and awaitable calls; it too reads payload buffers in place. Both speak the same frames
and run the same handshake; only the I/O differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from parl_remote._config import settings
from parl_remote._exceptions import AuthenticationError, ClusterError, ProtocolError
from parl_remote.security import _tls
from parl_remote.wire import _shm
from parl_remote.wire.protocol.connection import (
    AUTHENTICATED,
    CONTROL_SCRATCH,
    NEED_DATA,
    Connection,
)

__all__ = [
    "AsyncConnection",
    "ConnectionClosed",
    "SyncConnection",
    "open_async",
    "serve_async",
]

logger = logging.getLogger(__name__)
_IOV_MAX = 1024


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (or it broke) before a reply arrived."""


def _connection(role: str, is_server: bool, token: bytes | None) -> Connection:
    """A protocol object with this process's shared-memory store (used if the peer is local).

    The master's connections carry small messages only, one per worker and client: a small
    read area each keeps its memory from growing by the full one's with every worker.
    """
    store = _shm.store(token)
    return Connection(
        role,
        is_server=is_server,
        token=token,
        max_message_bytes=settings.max_message_bytes,
        store=store,
        host=_shm.host_id() if store is not None else "",
        scratch_bytes=CONTROL_SCRATCH if role == "master" else None,
    )


def _tune(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _check_role(proto: Connection, expect: str | None, where: str) -> None:
    if expect is not None and proto.peer_role != expect:
        raise ClusterError(
            f"{where} is a PARL {proto.peer_role}, not a {expect}; check the address"
        )


# -- blocking shell ------------------------------------------------------------------------------
class SyncConnection:
    """A blocking connection; one request at a time (callers hold it exclusively)."""

    def __init__(self, sock: socket.socket | _tls.TLSSocket, proto: Connection) -> None:
        self.sock = sock
        self.proto = proto
        self.closed = False
        self._round_trip: Callable[[Any], Any] | None = None  # made once authenticated

    @classmethod
    def open(
        cls,
        host: str,
        port: int,
        *,
        token: bytes | None,
        role: str,
        expect: str | None = None,
        timeout: float | None = None,
    ) -> SyncConnection:
        """Connect and authenticate, within `timeout` seconds in all."""
        timeout = settings.connect_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        proto = _connection(role, False, token)
        sock: Any = socket.create_connection((host, port), timeout=timeout)
        try:
            _tune(sock)
            if _tls.enabled():  # TLS first; the token handshake then proves its certificate
                sock = _tls.client_socket(sock)
                _tls.bind(proto, sock.handshake(f"{host}:{port}"))
            conn = cls(sock, proto)
            while not proto.authenticated:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                event = conn.receive()
                if event is not AUTHENTICATED:
                    raise ProtocolError(
                        f"an unexpected {type(event[0]).__name__} during the handshake"
                    )
            _check_role(proto, expect, f"{host}:{port}")
            sock.settimeout(None)
            return conn
        except BaseException:
            sock.close()
            raise

    @classmethod
    def accept(
        cls, sock: socket.socket, *, token: bytes | None, role: str, timeout: float | None = None
    ) -> SyncConnection:
        """Authenticate an accepted socket as the server, within `timeout` seconds."""
        timeout = settings.connect_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        proto = _connection(role, True, token)
        try:
            _tune(sock)
            sock.settimeout(timeout)
            conn = cls(sock, proto)
            if _tls.enabled():  # TLS first; the token handshake then proves its certificate
                conn.sock = _tls.TLSSocket(sock, server_side=True)
                _tls.bind(proto, conn.sock.handshake(str(sock.getpeername())))
            conn.sock.sendall(b"".join(proto.initiate()))
            while not proto.authenticated:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                event = conn.receive()
                if event is not AUTHENTICATED:  # pragma: no cover - the protocol forbids it
                    raise ProtocolError("a message before the handshake completed")
            sock.settimeout(None)
            return conn
        except BaseException:
            sock.close()
            raise

    def send(self, msg: Any, buffers: list[Any] | tuple[Any, ...] = ()) -> None:
        """Write one message and its buffers (scatter-gather, no copy of the buffers)."""
        frames = self.proto.send(msg, buffers) if buffers else None
        try:
            if frames is None:
                self.sock.sendall(self.proto.frame(msg))
            elif len(frames) == 1:
                self.sock.sendall(frames[0])
            else:
                self._sendmsg_all(frames)
        except OSError as exc:
            self.close()
            raise ConnectionClosed(f"the connection broke while sending: {exc}") from exc

    def _sendmsg_all(self, frames: list[Any]) -> None:
        views = [memoryview(f).cast("B") for f in frames]
        i = 0
        while i < len(views):
            sent = self.sock.sendmsg(views[i : i + _IOV_MAX])
            while sent:
                size = len(views[i])
                if sent >= size:
                    sent -= size
                    i += 1
                else:
                    views[i] = views[i][sent:]
                    sent = 0

    def exchange(
        self, msg: Any, buffers: list[Any] | tuple[Any, ...] = ()
    ) -> tuple[Any, tuple[Any, ...]]:
        """`send(msg, buffers)`, then `receive()`: the first event after a request, its reply.

        A message without buffers and a reply read whole in one read make one round trip of
        the protocol's (`Connection.exchanger`): framed, written, read and decoded in one
        function, as every blocking call and request is. For an authenticated connection.
        """
        if buffers:
            self.send(msg, buffers)
            return self.receive()
        round_trip = self._round_trip
        if round_trip is None:
            proto, sock = self.proto, self.sock
            round_trip = self._round_trip = proto.exchanger(sock.sendall, sock.recv_into)
        try:
            reply = round_trip(msg)
        except TimeoutError:
            self.close()
            raise
        except OSError as exc:  # ConnectionError too: the peer closed it
            self.close()
            raise ConnectionClosed(f"the connection broke: {exc}") from exc
        return self.receive() if reply is None else (reply, ())

    def receive(self) -> tuple[Any, tuple[Any, ...]]:
        """Block until the next event: `(message, buffers)`, or, once, `AUTHENTICATED`.

        `AUTHENTICATED` comes only during the handshake, which `open` and `accept` complete.
        """
        proto = self.proto
        event: Any = proto.next_event()
        while event is NEED_DATA:
            try:
                n = self.sock.recv_into(proto.get_buffer())
            except TimeoutError:
                self.close()
                raise
            except OSError as exc:
                self.close()
                raise ConnectionClosed(f"the connection broke: {exc}") from exc
            if n == 0:
                self.close()
                raise ConnectionClosed("the peer closed the connection")
            try:
                event = proto.received(n)
            finally:
                if proto.has_output:
                    self.sock.sendall(b"".join(proto.data_to_send()))
        reply: tuple[Any, tuple[Any, ...]] = event
        return reply

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()
            self.proto.release_segments()

    def shutdown(self) -> None:
        """Wake a thread blocked on this connection: its read fails at once."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


# -- asyncio shell ---------------------------------------------------------------------------
MessageHandler = Callable[["AsyncConnection", Any, tuple[Any, ...]], None]
CloseHandler = Callable[["AsyncConnection", "Exception | None"], None]


class AsyncConnection(asyncio.BufferedProtocol):
    """An asyncio connection: messages are handed to `on_message(conn, msg, buffers)`."""

    def __init__(
        self,
        proto: Connection,
        on_message: MessageHandler,
        on_close: CloseHandler | None = None,
        *,
        exact_flow: bool = False,
    ) -> None:
        self.proto = proto
        self.on_message = on_message
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.peername: str = "?"
        self.closed = False
        self.context: Any = None  # owner's per-connection state (a registered client, a worker)
        self._loop = asyncio.get_running_loop()
        self.authenticated: asyncio.Future[Any] = self._loop.create_future()
        self._paused = False
        self._drain_waiters: list[asyncio.Future[Any]] = []
        self._batch: list[Any] = []
        self.pending = 0
        """Messages of the current read still to be handled after the one being handled."""
        # The loop asks for a buffer before every read: the protocol's own method answers.
        self.get_buffer = proto.get_buffer  # type: ignore[method-assign]  # same signature
        self._exact_flow = exact_flow

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # a stream: TCP or Unix
        if self._exact_flow:
            # Told the moment anything waits in the write buffer, and when it is all written.
            stream.set_write_buffer_limits(high=0, low=0)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _tune(sock)
        peer = transport.get_extra_info("peername")
        self.peername = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "local")
        frames = self.proto.initiate()
        if frames:
            stream.writelines(frames)
        if self.proto.authenticated and not self.authenticated.done():
            self.authenticated.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.proto.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        proto = self.proto
        msg = proto.whole_message(nbytes)
        if msg is not None:  # the common case: a small message read on its own
            try:
                self.on_message(self, msg, ())
            except Exception as exc:
                self._failed(exc)
            return
        try:
            proto.buffer_updated(nbytes)
        except (ProtocolError, AuthenticationError) as exc:
            self._flush_handshake()
            self.abort(exc)
            return
        if proto.has_output:
            self._flush_handshake()
        if not proto.has_events:
            return
        events = proto.take_events()
        on_message = self.on_message
        try:
            for i, event in enumerate(events):
                self.pending = len(events) - i - 1
                if event is AUTHENTICATED:
                    if not self.authenticated.done():
                        self.authenticated.set_result(None)
                    continue
                on_message(self, event[0], event[1])
                if self.closed:
                    return
        except Exception as exc:
            self._failed(exc)
        finally:
            self.pending = 0

    def _failed(self, exc: Exception) -> None:
        """Handling a message raised `exc`: a peer's fault is logged and closes the connection."""
        if isinstance(exc, ProtocolError | AuthenticationError):
            self.abort(exc)
            return
        logger.error(
            "closing the connection from %s after an internal error",
            self.peername,
            exc_info=exc,
        )
        self.close()

    def _flush_handshake(self) -> None:
        out = self.proto.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.proto.release_segments()
        if not self.authenticated.done():
            self.authenticated.set_exception(
                exc or ConnectionClosed("the peer closed the connection")
            )
            self.authenticated.exception()  # retrieved: no "never retrieved" warning
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionClosed("the connection closed"))
        self._drain_waiters.clear()
        if self.on_close is not None:
            self.on_close(self, exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # API
    def send(
        self, msg: Any, buffers: list[Any] | tuple[Any, ...] = (), *, batch: bool = False
    ) -> None:
        """Queue one message for writing (buffers are written as they are, not copied).

        With `batch=True` the write waits for the end of this turn of the event loop, so that
        many messages sent in one turn leave in one system call.
        """
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise ConnectionClosed(f"the connection to {self.peername} is closed")
        if not (buffers or batch or self._batch):  # the common case: one frame, written now
            transport.write(self.proto.frame(msg))
            return
        frames = self.proto.send(msg, buffers)
        if batch:
            if not self._batch:
                self._loop.call_soon(self._flush_batch)
            self._batch.extend(frames)
        elif self._batch:
            self._batch.extend(frames)
            self._flush_batch()
        else:
            transport.writelines(frames)

    def flush(self) -> None:
        """Write batched messages now."""
        self._flush_batch()

    def _flush_batch(self) -> None:
        frames, self._batch = self._batch, []
        if (
            frames
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self.transport.writelines(frames)

    async def flushed(self) -> None:
        """Wait until everything written so far is in the kernel (needs `exact_flow`)."""
        while self._paused and not self.closed:
            await self.drain()

    async def drain(self) -> None:
        """Wait until the write buffer is below its high-water mark."""
        if self._paused and not self.closed:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def abort(self, exc: Exception | None = None) -> None:
        """Close at once, logging why if `exc` is given (a bad frame, a refused peer)."""
        if exc is not None:
            logger.warning(
                "closing the connection from %s (%s): %s", self.peername, self.proto.role, exc
            )
            if not self.authenticated.done():
                self.authenticated.set_exception(exc)
                self.authenticated.exception()  # retrieved: the opener reports it
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


async def open_async(
    host: str,
    port: int,
    *,
    token: bytes | None,
    role: str,
    on_message: MessageHandler,
    on_close: CloseHandler | None = None,
    expect: str | None = None,
    timeout: float | None = None,
) -> AsyncConnection:
    """Connect and authenticate on the running loop, within `timeout` seconds."""
    timeout = settings.connect_timeout_s if timeout is None else timeout
    loop = asyncio.get_running_loop()
    proto = _connection(role, False, token)

    async def connect() -> AsyncConnection:
        def factory() -> asyncio.BaseProtocol:
            app = AsyncConnection(proto, on_message, on_close)
            return _tls.TLSProtocol(app, server_side=False) if _tls.enabled() else app

        _, made = await loop.create_connection(factory, host, port)
        conn = cast(AsyncConnection, made.app if isinstance(made, _tls.TLSProtocol) else made)
        try:
            await conn.authenticated
            _check_role(proto, expect, f"{host}:{port}")
        except BaseException:
            conn.close()
            raise
        return conn

    return await asyncio.wait_for(connect(), timeout)


async def serve_async(
    host: str,
    port: int,
    *,
    token: bytes | None,
    role: str,
    on_message: MessageHandler,
    on_close: CloseHandler | None = None,
    on_open: Callable[[AsyncConnection], None] | None = None,
    handshake_timeout: float | None = None,
    sock: socket.socket | None = None,
    exact_flow: bool = False,
) -> asyncio.Server:
    """Serve authenticated connections on host:port (or an already bound `sock`).

    Connections that do not complete the handshake within `handshake_timeout` are closed, and
    at most `settings.max_connections` are held at once: idle or hostile connections cannot
    pile up. `on_open` runs once a connection is authenticated. With `exact_flow`, each
    connection learns when its write buffer is empty (see `AsyncConnection.flushed`).
    """
    loop = asyncio.get_running_loop()
    handshake_timeout = (
        settings.connect_timeout_s if handshake_timeout is None else handshake_timeout
    )
    live: set[AsyncConnection] = set()

    def closed(conn: AsyncConnection, exc: Exception | None) -> None:
        live.discard(conn)
        if (
            on_close is not None
            and conn.authenticated.done()
            and not conn.authenticated.exception()
        ):
            on_close(conn, exc)

    def factory() -> asyncio.BaseProtocol:
        proto = _connection(role, True, token)
        conn = AsyncConnection(proto, on_message, closed, exact_flow=exact_flow)
        if len(live) >= settings.max_connections:
            loop.call_soon(
                conn.abort, ProtocolError(f"over {settings.max_connections} connections")
            )
        live.add(conn)

        def expire() -> None:
            if not conn.authenticated.done():
                conn.abort(ProtocolError(f"no handshake within {handshake_timeout:g} s"))

        timer = loop.call_later(handshake_timeout, expire)

        def authenticated(fut: asyncio.Future[Any]) -> None:
            timer.cancel()
            if not fut.cancelled() and fut.exception() is None and on_open is not None:
                on_open(conn)

        conn.authenticated.add_done_callback(authenticated)
        if _tls.enabled():
            return _tls.TLSProtocol(conn, server_side=True)
        return conn

    if sock is not None:
        return await loop.create_server(factory, sock=sock)
    return await loop.create_server(factory, host, port)
