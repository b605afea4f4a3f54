"""The two drivers of calls to an actor, blocking and pipelined: twins over `_call_core`.

`BlockingDriver` serves `actor.method(...)`: the calling thread takes an idle socket from the
actor's pool (or opens one), writes the request and reads the reply -- one round trip, no event
loop and no thread hop, arrays sent from and received into their own memory.
`PipelinedDriver` serves `await actor.aio.method(...)` and future-mode calls: one asyncio
connection per event loop and actor, many calls in flight on it, replies matched by id.

What a call means (its message, id, result, error, the actor's fate) is decided by the
`ActorCore` both share; the drivers only move bytes, and mirror each other name for name, sync
first (`create`/`acreate`, `call`/`acall`, `request`/`arequest`, `close`), so that what differs
between them is I/O. One difference is deliberate: `acall` sends at once and returns a future,
so calls leave in the order they are made and a caller may keep many in flight; what it sends
may leave after it returns, so its arrays are held first (`hold`): where they go, a segment of
the connection's shared memory or a copy, is the connection's to decide
(`connection.hold`), for future-mode calls too (`submit_held`).

`request` / `arequest` are the same pair for one request to the master (`xparl`'s, and the
client's), matched with the same `Replies`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import deque
from typing import Any, NoReturn, Protocol, cast

from parl_remote._exceptions import ProtocolError
from parl_remote.client._call_core import INIT, ActorCore, Replies, message_id
from parl_remote.wire._transport import AsyncConnection, SyncConnection, open_async
from parl_remote.wire.protocol.connection import Held, hold

__all__ = ["BlockingDriver", "ClientView", "PipelinedDriver", "arequest", "request"]


class ClientView(Protocol):
    """What the drivers and actor refs use of this process's xparl client (`_client.Client`)."""

    address: str
    token: bytes | None
    loop: asyncio.AbstractEventLoop
    refs: Any

    def fate(self, actor_id: str, wait: float = ...) -> str | None:
        """Why the actor is gone, asking the master; None while it lives."""

    async def afate(self, actor_id: str, wait: float = ...) -> str | None:
        """`fate` from the client's loop."""

    def known_fate(self, actor_id: str) -> str | None:
        """Why the actor is gone, if known without asking."""

    def run_soon(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the client's loop."""

    def release(self, actor_id: str) -> None:
        """Free the actor."""


def request(
    conn: SyncConnection, msg: Any, buffers: list[Any] | tuple[Any, ...] = ()
) -> tuple[Any, tuple[Any, ...]]:
    """Send `msg` and read until its reply (what else arrives meanwhile, e.g. a ping, is skipped).

    Returns `(reply, buffers)`. Raises ConnectionError (or OSError) if the connection breaks.
    """
    key = message_id(msg)
    reply = conn.exchange(msg, buffers)
    while message_id(reply[0]) != key:
        reply = conn.receive()
    return reply


async def arequest(
    conn: AsyncConnection,
    replies: Replies[asyncio.Future[Any]],
    msg: Any,
    buffers: list[Any] | tuple[Any, ...] = (),
) -> tuple[Any, tuple[Any, ...]]:
    """Send `msg` and wait for its reply, which `replies` matches (other requests stay in flight).

    The owner of `conn` hands `replies` what arrives (`match` -> set the future's result) and
    fails what is left when the connection is lost. Returns `(reply, buffers)`.
    """
    key = cast(int, message_id(msg))  # a request always carries an id
    future: asyncio.Future[tuple[Any, tuple[Any, ...]]] = asyncio.get_running_loop().create_future()
    replies.expect(key, future)
    try:
        conn.send(msg, buffers)
        return await future
    finally:
        replies.forget(key)


# -- blocking ------------------------------------------------------------------------------------
class BlockingDriver:
    """Blocking calls to one actor, from any thread (see the module docstring).

    Args:
        core: the actor's call core.
        client: the client, for the cluster token and the actor's fate.
    """

    def __init__(self, core: ActorCore, client: ClientView) -> None:
        self.core = core
        self.client = client
        self.pool: deque[SyncConnection] = deque()  # idle connections, the last used on top
        self.conns: set[SyncConnection] = set()
        self.lock = threading.Lock()

    def create(self, payload: bytes, buffers: list[Any], bundle: bytes) -> tuple[str, ...]:
        """Build the actor from `init_payload`'s pickle; raise what its constructor raised.

        Returns the names of methods that the instance's attributes hide.
        """
        msg, buffers = self.core.init(payload, buffers, bundle)
        reply, rbuffers = self.request(msg, buffers)
        hidden: tuple[str, ...] = self.core.result(reply, rbuffers, INIT)
        return hidden

    def call(self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `name` on the actor and return its result: one round trip (`request`)."""
        if self.core.dead is not None:
            raise self.core.died_error()
        msg, buffers = self.core.call(kind, name, args, kwargs)  # sent now: views will do
        reply, rbuffers = self.request(msg, buffers)
        return self.core.result(reply, rbuffers, name)

    def request(self, msg: Any, buffers: list[Any]) -> tuple[Any, tuple[Any, ...]]:
        """Send `msg` on an idle connection (a new one if none is idle); return its reply.

        A connection carries one request at a time, so the next message is the reply.
        """
        try:
            conn = self.pool.pop()
        except IndexError:
            conn = self._open()
        try:
            reply = conn.exchange(msg, buffers)
            if not conn.proto.idle:
                raise ProtocolError("more arrived than the reply to one request")
        except BaseException as exc:
            self._broken(conn, exc)
        self.pool.append(conn)
        return reply

    def _broken(self, conn: SyncConnection, exc: BaseException) -> NoReturn:
        """A request on `conn` failed with `exc`: close `conn`, raise what its caller sees.

        A connection that broke raises what the master says of the actor; anything else (an
        interrupt, a bad frame) is raised as it is, and the connection, whose reply would
        confuse the next caller, goes too.
        """
        self._discard(conn)
        if isinstance(exc, ConnectionError | OSError):
            raise self.core.fate_error(self._fate()) from None
        raise exc

    def close(self, *, wake_only: bool = False) -> None:
        """Close every connection (thread-safe), or only wake the threads blocked on them."""
        with self.lock:
            conns = list(self.conns)
        for conn in conns:
            if wake_only:
                conn.shutdown()
            else:
                conn.close()

    def _fate(self) -> str | None:
        reason = self.core.dead
        return self.client.fate(self.core.actor_id) if reason is None else reason

    def _open(self) -> SyncConnection:
        core = self.core
        try:
            conn = SyncConnection.open(
                core.host, core.port, token=self.client.token, role="client", expect="actor"
            )
        except (OSError, ConnectionError) as exc:
            raise core.fate_error(self._fate()) from exc
        with self.lock:
            self.conns.add(conn)
        return conn

    def _discard(self, conn: SyncConnection) -> None:
        conn.close()
        with self.lock:
            self.conns.discard(conn)


# -- pipelined -----------------------------------------------------------------------------------
class PipelinedDriver:
    """Pipelined calls to one actor from the running event loop (see the module docstring).

    Made on its loop, it starts a task that owns the connection: it opens it (calls made
    meanwhile wait in order), holds it, and when it ends fails the calls still in flight with
    what the master says of the actor. Cancelling the task (`close`, or the loop ending: asyncio
    closes its tasks first) closes the connection.

    Args:
        core: the actor's call core.
        client: the client, for the cluster token and the actor's fate.
        owner: the object that holds this driver (kept alive by each call in flight).
        drivers: the owner's drivers by loop, which this one leaves when its connection ends.
        lock: guards `drivers`.
    """

    def __init__(
        self,
        core: ActorCore,
        client: ClientView,
        owner: Any,
        drivers: dict[asyncio.AbstractEventLoop, PipelinedDriver],
        lock: threading.Lock,
    ) -> None:
        self.core = core
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.replies: Replies[Any] = Replies()
        self.conn: AsyncConnection | None = None
        self.queue: list[tuple[Any, list[Any]]] = []  # sent before the connection was open
        self.closed = False
        self._owner = weakref.ref(owner)  # weak: the owner holds this driver
        self._drivers, self._lock = drivers, lock
        self._gone = self.loop.create_future()
        self.task = self.loop.create_task(self._run())

    async def acreate(self, payload: bytes, buffers: list[Any], bundle: bytes) -> tuple[str, ...]:
        """Build the actor from `init_payload`'s pickle; raise what its constructor raised.

        Returns the names of methods that the instance's attributes hide.
        """
        msg, buffers = self.core.init(payload, buffers, bundle)
        reply, rbuffers = await self.arequest(msg, self.hold(buffers).buffers)
        hidden: tuple[str, ...] = self.core.result(reply, rbuffers, INIT)
        return hidden

    def acall(
        self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Send a call to `name` now; return the future of its result."""
        future = self.loop.create_future()
        if self.core.dead is not None:
            future.set_exception(self.core.died_error())
            return future
        msg, buffers = self.core.call(kind, name, args, kwargs)
        if buffers:  # it may leave after this returns (queued, or in the transport's buffer)
            buffers = self.hold(buffers).buffers
        self.submit(msg, buffers, _Awaited(self, future, name))
        return future

    def hold(self, buffers: list[Any]) -> Held:
        """`buffers` made safe to send later, on this driver's connection (`connection.hold`).

        Any thread may call it (a future-mode call holds its arrays before it returns).
        """
        conn = self.conn
        return hold(conn.proto if conn is not None and not self.closed else None, buffers)

    def submit_held(self, msg: Any, held: Held, waiter: Any) -> None:
        """`submit` with buffers that `hold` made, perhaps for a connection gone since."""
        conn = self.conn
        self.submit(msg, held.to(conn.proto if conn is not None else None), waiter)

    async def arequest(self, msg: Any, buffers: list[Any]) -> tuple[Any, tuple[Any, ...]]:
        """Send `msg` (behind the calls before it) and return its reply."""
        future: asyncio.Future[tuple[Any, tuple[Any, ...]]] = self.loop.create_future()
        self.submit(msg, buffers, _Awaited(self, future, None))
        return await future

    def close(self) -> None:
        """Close the connection now (on its loop); calls still in flight fail."""
        self.task.cancel()
        self._end()

    def submit(self, msg: Any, buffers: list[Any], waiter: Any) -> None:
        """Send `msg`; `waiter.settle(reply, buffers)` gets its reply, `.fail(error)` a loss."""
        if self.closed:
            waiter.fail(self.core.fate_error(self.core.dead))
            return
        self.replies.expect(message_id(msg), waiter)  # type: ignore[arg-type]  # a request has an id
        if self.conn is None:
            self.queue.append((msg, buffers))
            return
        try:  # noqa: SIM105 - contextlib.suppress would cost a tenth of the call
            self._send(self.conn, msg, buffers)
        except ConnectionError:
            pass  # closing: the connection's task fails the waiter

    def _send(self, conn: AsyncConnection, msg: Any, buffers: list[Any]) -> None:
        try:
            conn.send(msg, buffers, batch=True)
        except ProtocolError as exc:  # too large to send: this call fails, the others go on
            waiter = self.replies.match(msg)
            if waiter is not None:
                waiter.fail(exc)

    async def _run(self) -> None:
        core = self.core
        try:
            try:
                conn = await open_async(
                    core.host,
                    core.port,
                    token=self.client.token,
                    role="client",
                    on_message=self._on_message,
                    on_close=self._on_close,
                    expect="actor",
                )
            except Exception:
                pass  # unreachable: the calls fail below, with what became of the actor
            else:
                self.conn = conn
                queued, self.queue = self.queue, []
                with contextlib.suppress(ConnectionError):  # closed already: handled below
                    for msg, buffers in queued:
                        self._send(conn, msg, buffers)
                await self._gone
            self._leave()
            waiters, reason = self.replies.take_all(), core.dead
            try:
                if waiters and reason is None:
                    reason = await self.client.afate(core.actor_id)
            finally:
                for waiter in waiters:
                    waiter.fail(core.fate_error(reason))
        finally:  # also when cancelled: closed, or its loop ends
            self._end()

    def _on_message(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        waiter = self.replies.match(msg)
        if waiter is not None:
            waiter.settle(msg, buffers)

    def _on_close(self, conn: AsyncConnection, exc: Exception | None) -> None:
        self._leave()
        if not self._gone.done():
            self._gone.set_result(None)

    def _end(self) -> None:
        self._leave()
        if self.conn is not None:
            self.conn.close()
        core = self.core
        for waiter in self.replies.take_all():
            waiter.fail(core.fate_error(core.dead or self.client.known_fate(core.actor_id)))

    def _leave(self) -> None:
        """Closed from now on: later calls on this loop open a new connection."""
        self.closed = True
        self.queue = []
        with self._lock:
            if self._drivers.get(self.loop) is self:
                del self._drivers[self.loop]


class _Awaited:
    """The future of a pipelined call: settled with its result (the raw reply if `name` is None)."""

    __slots__ = ("core", "future", "name", "owner")

    def __init__(
        self, driver: PipelinedDriver, future: asyncio.Future[Any], name: str | None
    ) -> None:
        self.core = driver.core
        self.owner = driver._owner()  # the actor lives at least until its reply
        self.future = future
        self.name = name

    def settle(self, reply: Any, buffers: tuple[Any, ...]) -> None:
        future = self.future
        if future.done():  # cancelled by its caller
            return
        if self.name is None:
            future.set_result((reply, buffers))
            return
        try:
            future.set_result(self.core.result(reply, buffers, self.name))
        except BaseException as exc:
            future.set_exception(exc)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
