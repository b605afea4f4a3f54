"""The xparl engine of a user process: its link to the master, and `parl.connect`'s half of it.

One `Client` per process: a child made by `fork` drops the client it inherits (never touching
its sockets or thread) and makes its own when it connects or creates an actor, to the same
cluster. It runs a small event loop in a daemon thread that holds the
control connection to the master: registration, heartbeats both ways, actor placement
requests, the master's news of dead actors, and the actors' output (echoed here with
`log_to_driver`). Calls to actors do not pass through it: blocking calls use the caller's own
socket to the actor, awaitable calls the caller's event loop; only future-mode calls ride this
loop. If the master goes away, existing actors keep working, new ones cannot be created, and
the client reconnects by itself when a master answers again at the same address.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, ClassVar

from parl_remote._config import load_token, settings
from parl_remote._exceptions import (
    AuthenticationError,
    ClusterError,
    MasterUnreachableError,
    NotConnectedError,
    ProtocolError,
    ResourceError,
)
from parl_remote._loop import new_event_loop
from parl_remote.client._bundle import Bundle
from parl_remote.client._call_core import Replies, init_payload
from parl_remote.client._replacing import replaced_actor
from parl_remote.client._spec import _ClassSpec
from parl_remote.engines.xparl._actor_ref import _ActorRef
from parl_remote.engines.xparl._drivers import arequest
from parl_remote.security import _tls_join
from parl_remote.wire._link import MasterLink
from parl_remote.wire._transport import AsyncConnection
from parl_remote.wire.protocol import messages as m

__all__ = ["Client", "STATUS_PAGE"]

STATUS_PAGE = 20
"""How many workers, clients and live actors a status lists (the summary counts every one)."""

logger = logging.getLogger(__name__)


def _parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address={address!r} must be HOST:PORT, e.g. 'localhost:8010'")
    return host or "127.0.0.1", int(port)


def _warm_up() -> None:
    """Do now what the first actor's connection would otherwise do while its creator waits.

    `socket.create_connection` encodes the host name with the idna codec, which Python imports
    on first use, with two modules of its own: imported then, they would also have the bundle
    of the next actor look through `sys.modules` again.
    """
    import encodings.idna  # noqa: F401


class Client:
    """This process's membership in a cluster (see the module docstring)."""

    backend = "xparl"

    def __init__(
        self,
        address: str,
        *,
        token: bytes | None,
        distributed_files: Iterable[str] = (),
        log_to_driver: bool = True,
        cluster: Any = None,
    ) -> None:
        self.address = address
        self.host, self.port = _parse_address(address)
        self.token = token
        self.log_to_driver = log_to_driver
        _warm_up()
        self.bundle = Bundle(distributed_files)
        self.client_id = uuid.uuid4().hex[:12]
        self.cluster = cluster  # an embedded cluster this client owns, stopped with it
        self.loop = new_event_loop()
        self.link = MasterLink(
            self.host,
            self.port,
            token=token,
            role="client",
            registration=self._registration,
            heartbeat=m.Ping,
            on_message=self._on_master,
            on_disconnected=self._on_master_lost,
        )
        self.refs: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self.fates: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._requests: Replies[asyncio.Future[Any]] = Replies()  # to the master, by request id
        self._closed = False
        self._maintainer: ConcurrentFuture[Any] | None = None
        self._soon: list[tuple[Any, ...]] = []
        self._soon_lock = threading.Lock()
        self._soon_scheduled = False
        self._thread = threading.Thread(target=self._run_loop, name="parl-client", daemon=True)
        self._stopped = threading.Event()

    # -- life ------------------------------------------------------------------------------
    # -- the engine's side of `parl.connect` (see `client/_engine.py`) ------------------------
    @classmethod
    def prepare(
        cls, address: str | None, *, tls: bool, cpu_num: int | None, preload: list[str]
    ) -> None:
        """`tls`: this process and those it starts speak TLS from now on."""
        if tls:
            os.environ["PARL_TLS"] = "1"

    @classmethod
    def connect(
        cls,
        address: str | None,
        *,
        distributed_files: Iterable[str],
        log_to_driver: bool,
        cpu_num: int | None,
        inherited: tuple[str, bytes | None] | None,
    ) -> Client:
        """Join the master at `address`, or start a local cluster (a master and a worker)."""
        files = list(distributed_files)
        cluster = None
        token: bytes | None
        if address is None:
            from parl_remote.engines.xparl._cluster import EmbeddedCluster

            cluster = EmbeddedCluster.start(cpu_num=cpu_num)
            address, token = cluster.address, cluster.token
            logger.info("started a local PARL cluster at %s (%s)", address, cluster.describe())
            if cluster.dashboard_url:
                logger.info("PARL dashboard: %s", cluster.dashboard_url)
        else:
            if cpu_num is not None:
                raise ValueError("cpu_num sets the size of a local cluster; it needs address=None")
            _parse_address(address)
            token = load_token()
            if inherited is not None and _parse_address(inherited[0]) == _parse_address(address):
                token = inherited[1]
            if token is None:
                raise AuthenticationError(
                    "no cluster token: set PARL_CLUSTER_TOKEN to the token of the cluster at "
                    f"{address} (on the master's machine: the file that `xparl start` created)"
                )
        try:
            host, port = _parse_address(address)
            _tls_join.trust(host, port, token)  # with TLS: the cluster CA, checked by the token
            client = cls(
                address,
                token=token,
                distributed_files=files,
                log_to_driver=log_to_driver,
                cluster=cluster,
            )
            client.start()
        except BaseException:
            if cluster is not None:
                cluster.stop()
            raise
        return client

    @classmethod
    def join(cls, where: tuple[Any, ...]) -> Any:
        """Connect this process to the cluster of an arriving handle's actor (`where`)."""
        from parl_remote.client._connect import connect

        return connect(where[-1], log_to_driver=False)

    def reconnect(
        self, address: str | None, cpu_num: int | None, distributed_files: Iterable[str]
    ) -> Client:
        """This client, if `parl.connect(address, cpu_num=...)` means its cluster."""
        if address is not None:
            same_cluster = _parse_address(address) == (self.host, self.port)
        else:  # no address: this process's cluster, if it is local and big enough
            same_cluster = cpu_num is None or (
                self.cluster is not None and self.cluster.cpu_num >= cpu_num
            )
        if same_cluster and not list(distributed_files):
            return self
        raise ClusterError(
            f"already connected to {self.address}"
            + (f" (a local cluster of {self.cluster.cpu_num} slots)" if self.cluster else "")
            + "; call parl.disconnect() first to connect differently"
        )

    def preload(self, modules: list[str]) -> None:
        """Tell the master to have every warm process import `modules` now (`_preload`)."""
        self._check_open()
        self.loop.call_soon_threadsafe(self.link.send, m.Preload(list(modules)))

    def after_fork(self) -> tuple[str, bytes | None] | None:
        """In a child made by `fork`: abandon this client; the cluster to rejoin, if open."""
        if self._closed:
            return None
        rejoin = (self.address, self.token)
        self.abandon()
        return rejoin

    # -- actors, as the handles ask for them ----------------------------------------------------
    def create_ref(self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Place a new actor and build its instance (blocking); its shared reference."""
        payload, buffers = init_payload(spec.cls, spec.name, args, kwargs)
        assigned = self.create_actor(
            spec.name, spec.n_gpu, spec.max_memory_mb, settings.resource_wait_s, replaced_actor()
        )
        ref = _ActorRef(self, spec, assigned)
        try:
            ref.shadowed = ref.blocking.create(payload, buffers, self.bundle.data())
        except BaseException:
            ref.release()
            raise
        return ref

    async def acreate_ref(
        self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """`create_ref` from async code."""
        payload, buffers = init_payload(spec.cls, spec.name, args, kwargs)
        assigned = await self.acreate_actor(
            spec.name, spec.n_gpu, spec.max_memory_mb, settings.resource_wait_s, replaced_actor()
        )
        ref = _ActorRef(self, spec, assigned)
        try:
            driver = ref.pipelined(asyncio.get_running_loop())
            ref.shadowed = await driver.acreate(payload, buffers, self.bundle.data())
        except BaseException:
            ref.release()
            raise
        return ref

    def adopt(self, spec: _ClassSpec, actor_id: str, where: tuple[Any, ...]) -> Any:
        """The reference of an actor whose handle arrived (`_ActorRef.where` of the sender's)."""
        host, port, pid, _address = where
        ref = _ActorRef(self, spec, m.ActorAssigned(0, actor_id, host, port, pid, ""))
        gone = self.hold(actor_id)
        if gone is not None:
            ref.core.mark_dead(gone)
        return ref

    def start(self) -> None:
        """Start the client's loop and join the cluster; raise a clear error if nobody answers."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._join(), self.loop)
        try:
            future.result(settings.connect_timeout_s + 5)
        except BaseException:
            self.close()
            raise
        self._maintainer = asyncio.run_coroutine_threadsafe(self.link.maintain(), self.loop)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self._stopped.set()

    def close(self) -> None:
        """Leave the cluster: the master frees this client's actors; stop an owned cluster."""
        if self._closed:
            return
        self._closed = True
        for ref in list(self.refs.values()):
            ref.close_connections()
        if self._thread.is_alive():

            async def stop() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if self.link.conn is not None:
                    self.link.conn.close()
                await asyncio.sleep(0.01)  # let the transport close
                self.loop.stop()

            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(stop()))
            self._stopped.wait(5)
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def abandon(self) -> None:
        """In a child made by `fork`: this is the parent's client; never use it, nor close it.

        Its sockets and thread belong to the parent: nothing is sent or closed on them here,
        and the parent's cluster is not stopped.
        """
        self._closed = True
        self.cluster = None
        self._abandoned = [ref.abandon() for ref in list(self.refs.values())]  # kept, unclosed

    @property
    def connected(self) -> bool:
        """Whether the master link is up right now."""
        return self.link.connected

    # -- the master link (runs on the client's loop) ----------------------------------------
    async def _join(self) -> None:
        try:
            await self.link.connect()
        except AuthenticationError:
            raise
        except (OSError, TimeoutError) as exc:
            raise NotConnectedError(
                f"no PARL master answers at {self.address} ({exc or type(exc).__name__}); "
                f"start one with `xparl start --port {self.port}`, or call parl.connect() "
                "without an address for a local cluster"
            ) from None

    def _registration(self, conn: AsyncConnection) -> m.RegisterClient:
        return m.RegisterClient(
            self.client_id,
            socket.gethostname(),
            os.getpid(),
            self.log_to_driver,
            actors=list(self.refs.keys()),
        )

    def _on_master(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"a client does not take {type(msg).__name__} from the master")
        handler(self, msg)

    def _actor_died(self, msg: m.ActorDied) -> None:
        self.fates[msg.actor_id] = msg.reason
        ref = self.refs.get(msg.actor_id)
        if ref is not None:
            ref.mark_dead(msg.reason)

    def _log_lines(self, msg: m.LogLines) -> None:
        self._echo(msg.lines)

    def _reply(self, msg: Any) -> None:
        waiter = self._requests.match(msg)
        if waiter is not None and not waiter.done():
            waiter.set_result((msg, ()))

    _handlers: ClassVar[dict[type, Any]] = {
        m.ActorDied: _actor_died,
        m.LogLines: _log_lines,
        m.ActorAssigned: _reply,
        m.CreateFailed: _reply,
        m.ActorState: _reply,
        m.StatusReply: _reply,
        m.Ack: _reply,
    }

    def _on_master_lost(self) -> None:
        for waiter in self._requests.take_all():
            if not waiter.done():
                waiter.set_exception(
                    MasterUnreachableError(
                        f"the connection to the PARL master at {self.address} was lost"
                    )
                )

    def _echo(self, lines: list[Any]) -> None:
        for actor_id, stream, line in lines:
            ref = self.refs.get(actor_id)
            name = ref.class_name if ref is not None else "actor"
            out = sys.stderr if stream == "stderr" else sys.stdout
            with contextlib.suppress(Exception):
                print(f"({name} {actor_id}) {line}", file=out, flush=True)

    async def _request(self, msg_for_id: Any, timeout: float) -> Any:
        conn = self.link.conn
        if conn is None or conn.closed:
            raise MasterUnreachableError(
                f"the PARL master at {self.address} is unreachable (it stopped, or the network is "
                "down); actors already created keep working, and new ones can be created once it "
                "is back (the client reconnects by itself)"
            )
        msg = msg_for_id(next(self._ids))
        reply, _ = await asyncio.wait_for(arequest(conn, self._requests, msg), timeout)
        return reply

    # -- API used by actor handles (any thread) ---------------------------------------------
    async def _create(
        self, class_name: str, n_gpu: int, max_memory_mb: float, wait_s: float, replaces: str
    ) -> m.ActorAssigned:
        reply: m.ActorAssigned | m.CreateFailed = await self._request(
            lambda rid: m.CreateActor(rid, class_name, n_gpu, max_memory_mb, wait_s, replaces),
            wait_s + settings.connect_timeout_s + 5,
        )
        if isinstance(reply, m.CreateFailed):
            if reply.kind == "resource":
                raise ResourceError(reply.reason)
            raise ClusterError(f"could not create {class_name}: {reply.reason}")
        return reply

    def create_actor(
        self,
        class_name: str,
        n_gpu: int,
        max_memory_mb: float,
        wait_s: float,
        replaces: str = "",
    ) -> m.ActorAssigned:
        """Ask the master for a process for a new actor (blocking); `replaces`: a dead one's id."""
        self._check_open()
        return asyncio.run_coroutine_threadsafe(
            self._create(class_name, n_gpu, max_memory_mb, wait_s, replaces), self.loop
        ).result()

    async def acreate_actor(
        self,
        class_name: str,
        n_gpu: int,
        max_memory_mb: float,
        wait_s: float,
        replaces: str = "",
    ) -> m.ActorAssigned:
        """Ask the master for a process for a new actor (from any event loop)."""
        self._check_open()
        coro = self._create(class_name, n_gpu, max_memory_mb, wait_s, replaces)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def run_soon(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the client's loop, in call order (thread-safe, never blocks).

        Calls made in a burst share one wake-up of the loop, instead of one each.
        """
        with self._soon_lock:
            self._soon.append((fn, args))
            if self._soon_scheduled:
                return
            self._soon_scheduled = True
        self.loop.call_soon_threadsafe(self._run_soon)

    def _run_soon(self) -> None:
        with self._soon_lock:
            batch, self._soon = self._soon, []
            self._soon_scheduled = False
        for fn, args in batch:
            fn(*args)

    def release(self, actor_id: str) -> None:
        """Free an actor (thread-safe, callable from finalizers; never blocks)."""
        if self._closed or self.loop.is_closed():
            return

        def send() -> None:
            self.link.send(m.ReleaseActor(actor_id))

        with contextlib.suppress(RuntimeError):  # the loop is already stopping
            self.loop.call_soon_threadsafe(send)

    def hold(self, actor_id: str, timeout: float = 10.0) -> str | None:
        """Tell the master this process holds a handle of `actor_id` (created elsewhere).

        Returns why the actor is gone, or None while it lives. On the client's own thread
        (a handle unpickled there) the news is sent without waiting for the answer.
        """
        self._check_open()
        if threading.current_thread() is self._thread:
            self.link.send(m.HoldActor(0, actor_id))
            return None
        coro = self._request(lambda rid: m.HoldActor(rid, actor_id), timeout)
        reply = asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout + 1)
        return (reply.reason or "it ended") if reply.state == "dead" else None

    def kill(self, actor_id: str, reason: str, timeout: float = 10.0) -> None:
        """Stop an actor now (any client may): its calls here and everywhere fail with `reason`.

        Returns once the master has ordered its process stopped; its slot frees as it exits.
        """
        self.fates.setdefault(actor_id, reason)
        ref = self.refs.get(actor_id)
        if ref is not None:
            ref.core.mark_dead(reason)  # later calls fail at once; waiting ones wake below
            self.run_soon(ref.mark_dead, reason)
        if self._closed:
            return  # the actor ended with this client
        coro = self._request(lambda rid: m.KillActor(rid, actor_id, reason), timeout)
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout + 1)

    def known_fate(self, actor_id: str) -> str | None:
        """Why an actor died, if this client knows without asking (None: it does not)."""
        if actor_id in self.fates:
            return self.fates[actor_id]
        return "this client is closed" if self._closed else None

    async def _fate(self, actor_id: str, wait: float) -> str | None:
        deadline = time.monotonic() + wait
        state = "unknown"
        while time.monotonic() < deadline:
            if actor_id in self.fates:
                return self.fates[actor_id]
            try:
                reply: m.ActorState = await self._request(
                    lambda rid: m.QueryActor(rid, actor_id), max(deadline - time.monotonic(), 0.01)
                )
            except (ClusterError, TimeoutError):
                break
            state = reply.state
            if state == "dead" and reply.reason:
                return reply.reason
            await asyncio.sleep(0.05)
        if actor_id in self.fates:
            return self.fates[actor_id]
        if state in ("starting", "idle", "busy"):
            return None  # the master still sees it alive: only the connection failed
        return "its process closed the connection (the master could not say why)"

    def fate(self, actor_id: str, wait: float = 2.0) -> str | None:
        """Why an actor died, asking the master and waiting at most `wait` s for the news.

        None means the master still counts the actor alive after that wait.
        """
        reason = self.known_fate(actor_id)
        if reason is not None:
            return reason
        if not self._thread.is_alive():
            return "this client is closed"
        future: ConcurrentFuture[str | None] = asyncio.run_coroutine_threadsafe(
            self._fate(actor_id, wait), self.loop
        )
        try:
            return future.result(wait + 1)
        except Exception:
            return "its process closed the connection"

    async def afate(self, actor_id: str, wait: float = 2.0) -> str | None:
        """`fate` from any event loop."""
        reason = self.known_fate(actor_id)
        if reason is not None:
            return reason
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._fate(actor_id, wait), self.loop)
        )

    def status(
        self, timeout: float = 10.0, *, offset: int = 0, limit: int | None = STATUS_PAGE
    ) -> dict[str, Any]:
        """The cluster's state, as `xparl status` shows it: the totals and a page of records.

        Args:
            timeout: seconds to wait for the master's reply.
            offset: list the workers, clients and live actors from this one on.
            limit: how many of each to list at most (the totals count them all); None for
                every one, which for a large cluster is a large reply.
        """
        self._check_open()
        coro = self._request(lambda rid: m.StatusRequest(rid, offset, limit), timeout)
        reply: m.StatusReply = asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout + 1)
        return reply.status

    def _check_open(self) -> None:
        if self._closed:
            raise NotConnectedError("this PARL client is closed; call parl.connect(...) again")
