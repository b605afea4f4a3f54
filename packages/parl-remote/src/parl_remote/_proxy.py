"""`@parl.remote_class` and actor handles: the user-facing half of the remote runtime.

`remote_class(cls)` returns a proxy class with the same name and methods. Instantiating it
places an actor in the cluster and returns a *blocking handle*: `actor.add(1, 2)` sends the call
straight to the actor's process over a socket owned by the calling thread and returns the
result. `actor.aio` is the *awaitable handle* of the same actor (`await actor.aio.add(1, 2)`),
and `await Actor.aio(...)` creates one from async code; `handle.sync` goes back. With
`wait=False`, blocking-handle methods return a `RemoteFuture` instead of waiting.

All handles of one actor share one `_ActorRef`, which holds its address and connections. The
actor lives as long as some handle (or a bound method of one) does: when the last goes, the
ref's finalizer frees the actor and its CPU slot.

Paths: blocking calls take an idle connection from a per-actor pool (or open one), write the
request, read the reply -- one round trip, no thread hop, arrays sent and received without
copies. Awaitable calls are pipelined on one connection per event loop. Future-mode calls are
pipelined on the client's own loop and resolved in the caller's thread by `get()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import pickle
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from parl_remote import _serialize as ser
from parl_remote._client import Client, current_client
from parl_remote._config import settings
from parl_remote._exceptions import (
    FutureGetRepeatedlyError,
    RemoteActorDiedError,
    RemoteAttributeError,
    RemoteError,
    RemoteSerializeError,
)
from parl_remote._transport import AsyncConnection, ConnectionClosed, SyncConnection, open_async
from parl_remote.protocol import messages as m

__all__ = ["ActorHandle", "AsyncActorHandle", "RemoteFuture", "remote_class"]

METHOD, GETATTR, SETATTR = 0, 1, 2
_NONE = pickle.dumps(None, protocol=5)
_RESERVED = ("aio", "sync")


# -- class specs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _MethodSpec:
    name: str
    is_async: bool
    signature: inspect.Signature | None


@dataclass(frozen=True)
class _ClassSpec:
    cls: type
    name: str
    methods: dict[str, _MethodSpec]
    wait: bool
    max_memory_mb: float
    n_gpu: int


def _method_specs(cls: type) -> dict[str, _MethodSpec]:
    specs = {}
    for name, static in inspect.getmembers_static(cls):
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(static, staticmethod | classmethod):
            func = getattr(cls, name)
            drop_first = False
        elif inspect.isfunction(static):
            func = static
            drop_first = True
        else:
            continue
        try:
            sig = inspect.signature(func)
            if drop_first:
                params = list(sig.parameters.values())[1:]
                sig = sig.replace(parameters=params)
        except (TypeError, ValueError):
            sig = None
        specs[name] = _MethodSpec(name, inspect.iscoroutinefunction(func), sig)
    return specs


def _check_reserved(cls: type) -> None:
    for klass in cls.__mro__[:-1]:  # everything but object
        for name in vars(klass):
            if name in _RESERVED or name.startswith("_parl_"):
                raise TypeError(
                    f"{cls.__qualname__} defines {name!r} (in {klass.__qualname__}), a name that "
                    f"@parl.remote_class reserves for its handles ({', '.join(_RESERVED)} and "
                    "_parl_*); rename it"
                )


# -- the shared reference to one actor --------------------------------------------------------
class _ActorRef:
    """Address, connections and fate of one actor, shared by all its handles."""

    def __init__(self, client: Client, spec: _ClassSpec, assigned: m.ActorAssigned) -> None:
        self.client = client
        self.spec = spec
        self.class_name = spec.name
        self.actor_id = assigned.actor_id
        self.host, self.port, self.pid = assigned.host, assigned.port, assigned.pid
        self.dead: str | None = None
        self.pool: deque[SyncConnection] = deque()
        self.conns: set[SyncConnection] = set()
        self.channels: dict[asyncio.AbstractEventLoop, _Channel] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        client.refs[self.actor_id] = self
        self.release = weakref.finalize(
            self, _release, client, self.actor_id, self.conns, self.channels, self.lock
        )

    def __repr__(self) -> str:
        return f"{self.class_name} actor {self.actor_id} at {self.host}:{self.port}"

    # -- death ---------------------------------------------------------------------------------
    def mark_dead(self, reason: str) -> None:
        """The actor is gone: wake every waiting call (called from the client's loop)."""
        if self.dead is None:
            self.dead = reason
        self.close_connections(wake_only=True)

    def close_connections(self, wake_only: bool = False) -> None:
        """Close every connection to the actor (or only wake the calls waiting on them)."""
        _close_all(self.conns, self.channels, self.lock, wake_only)

    def died(self, wait: bool = True) -> RemoteError:
        """The error for a call whose connection broke.

        The actor died, and why (asking the master if not yet known); or, if the master still
        counts it alive, the connection alone was lost.
        """
        if self.dead is None:
            reason = self.client.fate(self.actor_id, 2.0 if wait else 0.0)
            if reason is None:
                return self._lost_error()
            self.dead = reason
        return self._died_error()

    async def adied(self) -> RemoteError:
        if self.dead is None:
            reason = await self.client.afate(self.actor_id)
            if reason is None:
                return self._lost_error()
            self.dead = reason
        return self._died_error()

    def _lost_error(self) -> RemoteError:
        return RemoteError(
            f"lost the connection to {self.class_name} actor {self.actor_id} (pid {self.pid} on "
            f"{self.host}), which the master still counts alive; the call may or may not have "
            "run. Later calls connect again."
        )

    def _died_error(self) -> RemoteActorDiedError:
        return RemoteActorDiedError(
            f"{self.class_name} actor {self.actor_id} (pid {self.pid} on {self.host}) died: "
            f"{self.dead}. This call and every later call on it fail; create a new actor to go on."
        )

    # -- payloads --------------------------------------------------------------------------
    def pack(self, kind: int, name: str, args: tuple, kwargs: dict) -> tuple[bytes, list]:
        if kind == GETATTR:
            return _NONE, []
        # Arguments are not checked against the signature here (it would cost more than the
        # call): a mismatch raises the method's own TypeError, from the actor.
        obj: Any = args[0] if kind == SETATTR else (args, kwargs)
        try:
            return ser.dumps(obj)
        except Exception as exc:
            if kind == SETATTR:
                named = {f"the value for {name!r}": args[0]}
            else:
                named = {f"argument {i}": a for i, a in enumerate(args)}
                named.update({f"argument {k!r}": v for k, v in kwargs.items()})
            raise RemoteSerializeError(
                f"cannot send the arguments of {self.class_name}.{name}() to the actor: "
                f"{ser.find_culprit(named)}"
            ) from exc

    def unwrap(self, msg: Any, buffers: tuple, name: str) -> Any:
        if isinstance(msg, m.Result):
            try:
                return ser.loads(msg.payload, buffers)
            except Exception as exc:
                raise RemoteSerializeError(
                    f"the result of {self.class_name}.{name}() could not be unpickled here: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if isinstance(msg, m.Error):
            raise _error_from(msg, f"{self.class_name}.{name}() of actor {self.actor_id}")
        raise RemoteError(f"the actor answered {type(msg).__name__} to a call")

    # -- blocking calls --------------------------------------------------------------------
    def open_sync(self) -> SyncConnection:
        try:
            conn = SyncConnection.open(
                self.host, self.port, token=self.client.token, role="client", expect="actor"
            )
        except (OSError, ConnectionError) as exc:
            raise self.died() from exc
        with self.lock:
            self.conns.add(conn)
        return conn

    def _discard(self, conn: SyncConnection) -> None:
        conn.close()
        with self.lock:
            self.conns.discard(conn)

    def call(self, kind: int, name: str, args: tuple, kwargs: dict) -> Any:
        """A blocking call: one request, one reply, on a connection of this thread's own."""
        if self.dead is not None:
            raise self._died_error()
        data, buffers = self.pack(kind, name, args, kwargs)
        try:
            conn = self.pool.pop()
        except IndexError:
            conn = self.open_sync()
        try:
            conn.send(m.Call(next(self._ids), name, data, kind), buffers)
            msg, rbuffers = conn.receive()
        except (ConnectionError, OSError):
            self._discard(conn)
            raise self.died() from None
        except BaseException:
            self._discard(conn)  # interrupted mid-call: the reply would confuse the next caller
            raise
        self.pool.append(conn)
        return self.unwrap(msg, rbuffers, name)

    def init_sync(self, data: bytes, buffers: list, bundle: bytes) -> None:
        conn = self.open_sync()
        try:
            conn.send(m.Init(self.actor_id, data, bundle), buffers)
            msg, _ = conn.receive()
        except (ConnectionError, OSError):
            self._discard(conn)
            raise self.died() from None
        except BaseException:
            self._discard(conn)
            raise
        if isinstance(msg, m.Error):
            self._discard(conn)
            raise _error_from(msg, f"{self.class_name}.__init__() of actor {self.actor_id}")
        self.pool.append(conn)

    # -- pipelined calls -------------------------------------------------------------------
    def channel(self, loop: asyncio.AbstractEventLoop) -> _Channel:
        channel = self.channels.get(loop)
        if channel is None:
            with self.lock:
                for old in [lp for lp in self.channels if lp.is_closed()]:
                    del self.channels[old]
                channel = self.channels[loop] = _Channel(self, loop)
        return channel

    def call_future(self, kind: int, name: str, args: tuple, kwargs: dict) -> RemoteFuture:
        """A future-mode call: sent in order on the client's loop, waited for with `get()`."""
        future = RemoteFuture(self, name)
        if self.dead is not None:
            future._settle(None, (), ConnectionClosed("dead"))
            return future
        data, buffers = self.pack(kind, name, args, kwargs)
        if buffers:
            buffers = [bytes(b) for b in buffers]  # the caller may change its arrays after this
        client = self.client
        client.run_soon(self._submit, client.loop, kind, name, data, buffers, future._settle)
        return future

    def _submit(
        self, loop: Any, kind: int, name: str, data: bytes, buffers: list, callback: Any
    ) -> None:
        self.channel(loop).call(kind, name, data, buffers, callback)

    def call_async(self, kind: int, name: str, args: tuple, kwargs: dict) -> asyncio.Future:
        """An awaitable call on the running loop's pipelined connection."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise TypeError(
                f"{self.class_name} handle.aio.{name}(...) needs a running event loop: await it in "
                f"async code, or call handle.{name}(...) in plain code"
            ) from None
        future = loop.create_future()
        if self.dead is not None:
            future.set_exception(self._died_error())
            return future
        data, buffers = self.pack(kind, name, args, kwargs)
        if buffers:
            buffers = [bytes(b) for b in buffers]
        self.channel(loop).call(
            kind, name, data, buffers, functools.partial(self._resolve, future, name)
        )
        return future

    def _resolve(
        self, future: asyncio.Future, name: str, msg: Any, buffers: tuple, exc: Exception | None
    ) -> None:
        if future.done():
            return
        if exc is not None:
            task = asyncio.get_running_loop().create_task(self.adied())
            task.add_done_callback(lambda t: future.done() or future.set_exception(t.result()))
            return
        try:
            future.set_result(self.unwrap(msg, buffers, name))
        except BaseException as error:
            future.set_exception(error)


def _close_all(conns: set, channels: dict, lock: threading.Lock, wake_only: bool = False) -> None:
    with lock:
        conns_now, channels_now = list(conns), list(channels.items())
    for conn in conns_now:
        if wake_only:
            conn.shutdown()
        else:
            conn.close()
    for loop, channel in channels_now:
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                loop.call_soon_threadsafe(channel.close)


def _release(
    client: Client, actor_id: str, conns: set, channels: dict, lock: threading.Lock
) -> None:
    """Finalizer of an `_ActorRef`: close its connections and free the actor."""
    _close_all(conns, channels, lock)
    client.release(actor_id)


def _error_from(msg: m.Error, where: str) -> BaseException:
    if msg.kind == "raised":
        return ser.loads_exception(msg.payload, msg.type_name, msg.message, msg.traceback, where)
    if msg.kind == "attribute":
        return RemoteAttributeError(f"{msg.message} (in {where})")
    if msg.kind == "serialize":
        text = msg.message + (
            f"\n--- remote traceback ---\n{msg.traceback}" if msg.traceback else ""
        )
        return RemoteSerializeError(text)
    return RemoteError(f"{where}: {msg.message}")


class _Channel:
    """One pipelined connection from one event loop to one actor; replies matched by call id."""

    def __init__(self, ref: _ActorRef, loop: asyncio.AbstractEventLoop) -> None:
        # Only what the channel needs, never the ref itself: the ref owns its channels, and a
        # cycle would keep the actor alive until the garbage collector ran.
        self.host, self.port, self.token = ref.host, ref.port, ref.client.token
        self.label = repr(ref)
        self.channels, self.lock = ref.channels, ref.lock
        self.loop = loop
        self.conn: AsyncConnection | None = None
        self.opening: asyncio.Task | None = None
        self.queue: list[tuple[Any, list]] = []
        self.waiters: dict[int, Any] = {}
        self.ids = itertools.count(1)
        self.closed = False
        # The loop closes its async generators before it closes (asyncio.run does): this one
        # closes the connection then, while the loop can still run the transport's goodbye.
        self._guard = self._close_with_loop()
        with contextlib.suppress(StopIteration):
            self._guard.__anext__().send(None)  # registers it with the running loop

    async def _close_with_loop(self) -> Any:
        try:
            yield
        finally:
            self.close()

    def call(self, kind: int, name: str, data: bytes, buffers: list, callback: Any) -> None:
        """Send a call; `callback(msg, buffers, exc)` gets its reply."""
        call_id = next(self.ids)
        self.submit(m.Call(call_id, name, data, kind), buffers, callback, call_id)

    def submit(self, msg: Any, buffers: list, callback: Any, key: int = 0) -> None:
        """Send `msg`; `callback(msg, buffers, exc)` gets the reply with id `key` (Init: 0)."""
        if self.closed:
            callback(None, (), ConnectionClosed("closed"))
            return
        self.waiters[key] = callback
        if self.conn is None:
            self.queue.append((msg, buffers))
            if self.opening is None:
                self.opening = self.loop.create_task(self._open())
            return
        try:
            self.conn.send(msg, buffers, batch=True)
        except ConnectionError as exc:
            self._fail(exc)

    async def _open(self) -> None:
        try:
            self.conn = await open_async(
                self.host,
                self.port,
                token=self.token,
                role="client",
                on_message=self._on_message,
                on_close=self._on_close,
                expect="actor",
            )
        except Exception as exc:
            self._fail(exc)
            return
        queued, self.queue = self.queue, []
        for msg, buffers in queued:
            self.conn.send(msg, buffers, batch=True)

    def _on_message(self, conn: AsyncConnection, msg: Any, buffers: tuple) -> None:
        callback = self.waiters.pop(getattr(msg, "id", 0), None)  # Ready (to Init) has none
        if callback is not None:
            callback(msg, buffers, None)

    def _on_close(self, conn: AsyncConnection, exc: Exception | None) -> None:
        self._fail(ConnectionClosed(f"the connection to {self.label} closed"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        waiters, self.waiters = self.waiters, {}
        self.queue = []
        for callback in waiters.values():
            callback(None, (), exc)
        with self.lock:
            if self.channels.get(self.loop) is self:
                del self.channels[self.loop]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        else:
            self._fail(ConnectionClosed("closed"))


# -- futures -----------------------------------------------------------------------------------
class RemoteFuture:
    """The pending result of a call made with `@parl.remote_class(wait=False)`.

    `get()` blocks until the call finished and returns its result (or raises its exception);
    the result can be taken once.
    """

    __slots__ = ("_buffers", "_done", "_exc", "_msg", "_name", "_ref", "_taken")

    def __init__(self, ref: _ActorRef, name: str) -> None:
        self._ref = ref
        self._name = name
        self._done = threading.Lock()
        self._done.acquire()
        self._msg: Any = None
        self._buffers: tuple = ()
        self._exc: Exception | None = None
        self._taken = False

    def _settle(self, msg: Any, buffers: tuple, exc: Exception | None) -> None:
        self._msg, self._buffers, self._exc = msg, buffers, exc
        self._done.release()

    def done(self) -> bool:
        """Whether the call finished (successfully or not)."""
        return self._msg is not None or self._exc is not None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Wait for the result (at most `timeout` seconds) and return it, or raise its error.

        Raises:
            TimeoutError: not finished within `timeout` (or at once, with `block=False`);
                the call goes on, and `get` may be called again.
            FutureGetRepeatedlyError: the result was already taken by an earlier `get`.
        """
        if self._taken:
            raise FutureGetRepeatedlyError(
                f"the result of {self._ref.class_name}.{self._name}() was already taken by get(); "
                "keep the value from the first call"
            )
        if not self._done.acquire(block, -1 if timeout is None or not block else timeout):
            raise TimeoutError(
                f"{self._ref.class_name}.{self._name}() has not finished"
                + (f" within {timeout:g} s" if block and timeout is not None else " yet")
            )
        self._taken = True
        if self._exc is not None:
            raise self._ref.died() from None
        msg, buffers = self._msg, self._buffers
        self._msg, self._buffers = True, ()  # drop the payload: it is the caller's now
        return self._ref.unwrap(msg, buffers, self._name)

    def get_nowait(self) -> Any:
        """`get(block=False)`: the result if the call finished, else TimeoutError."""
        return self.get(block=False)


# -- handles ---------------------------------------------------------------------------------
class _AioAccess:
    """`Actor.aio(...)` creates an actor from async code; `actor.aio` is its awaitable handle."""

    def __get__(self, handle: Any, owner: type) -> Any:
        if handle is None:
            return functools.partial(_acreate, owner)
        twin = handle._parl_aio
        if twin is None:
            twin = owner._parl_async_cls._parl_wrap(handle._parl_ref)
            object.__setattr__(handle, "_parl_aio", twin)
        return twin


class _SyncAccess:
    """`handle.sync`: the blocking handle of the same actor."""

    def __get__(self, handle: Any, owner: type) -> Any:
        if handle is None:
            raise TypeError(
                f"{owner.__name__}.sync is not a constructor: create actors with "
                f"{owner.__name__}(...) (blocking) or await {owner.__name__}.aio(...) (async)"
            )
        if isinstance(handle, ActorHandle):
            return handle
        return owner._parl_sync_cls._parl_wrap(handle._parl_ref)


class ActorHandle:
    """Base of the blocking handles `@parl.remote_class` generates (one subclass per class)."""

    __slots__ = ("_parl_aio", "_parl_ref")
    _parl_spec: _ClassSpec
    _parl_async_cls: type
    _parl_sync_cls: type
    _original: type
    aio = _AioAccess()
    sync = _SyncAccess()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_parl_aio", None)
        object.__setattr__(self, "_parl_ref", _create(type(self)._parl_spec, args, kwargs))

    @classmethod
    def _parl_wrap(cls, ref: _ActorRef) -> Any:
        handle = object.__new__(cls)
        object.__setattr__(handle, "_parl_aio", None)
        object.__setattr__(handle, "_parl_ref", ref)
        return handle

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_parl_") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return self._parl_ref.call(GETATTR, name, (), {})

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_parl_"):
            raise AttributeError(f"{name!r} is internal to the actor handle")
        self._parl_ref.call(SETATTR, name, (value,), {})

    def __repr__(self) -> str:
        return f"<{self._parl_ref!r}>"

    def __reduce__(self) -> Any:
        raise TypeError(
            f"an actor handle ({self._parl_ref!r}) cannot be pickled or sent to another process"
        )


class AsyncActorHandle:
    """Base of the awaitable handles: every method returns an awaitable of the result."""

    __slots__ = ("_parl_ref",)
    _parl_spec: _ClassSpec
    _parl_async_cls: type
    _parl_sync_cls: type
    _original: type
    sync = _SyncAccess()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"create actors with `await {type(self).__name__}.aio(...)` in async code, or "
            f"`{type(self).__name__}(...)` in plain code"
        )

    @classmethod
    def _parl_wrap(cls, ref: _ActorRef) -> Any:
        handle = object.__new__(cls)
        object.__setattr__(handle, "_parl_ref", ref)
        return handle

    @property
    def aio(self) -> AsyncActorHandle:
        """This handle itself."""
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_parl_") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return self._parl_ref.call_async(GETATTR, name, (), {})

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(
            f"set actor attributes through the blocking handle: `handle.sync.{name} = value` "
            "(an assignment cannot be awaited)"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "`actor.aio` is the awaitable handle of an existing actor: call its methods with "
            "`await actor.aio.method(...)`; to create an actor from async code use "
            "`await ClassName.aio(...)`"
        )

    def __repr__(self) -> str:
        return f"<awaitable {self._parl_ref!r}>"

    def __reduce__(self) -> Any:
        raise TypeError(
            f"an actor handle ({self._parl_ref!r}) cannot be pickled or sent to another process"
        )


def _create(spec: _ClassSpec, args: tuple, kwargs: dict) -> _ActorRef:
    client = current_client()
    data, buffers = _pack_init(spec, args, kwargs)
    assigned = client.create_actor(
        spec.name, spec.n_gpu, spec.max_memory_mb, settings.resource_wait_s
    )
    ref = _ActorRef(client, spec, assigned)
    try:
        ref.init_sync(data, buffers, client.bundle.data())
    except BaseException:
        ref.release()
        raise
    return ref


async def _acreate(proxy_cls: type, *args: Any, **kwargs: Any) -> AsyncActorHandle:
    spec = proxy_cls._parl_spec
    client = current_client()
    data, buffers = _pack_init(spec, args, kwargs)
    assigned = await client.acreate_actor(
        spec.name, spec.n_gpu, spec.max_memory_mb, settings.resource_wait_s
    )
    ref = _ActorRef(client, spec, assigned)
    loop = asyncio.get_running_loop()
    ready: asyncio.Future = loop.create_future()

    def settle(msg: Any, buffers: tuple, exc: Exception | None) -> None:
        if not ready.done():
            ready.set_result((msg, exc))

    ref.channel(loop).submit(
        m.Init(ref.actor_id, data, client.bundle.data()), [bytes(b) for b in buffers], settle
    )
    try:
        msg, exc = await ready
        if exc is not None:
            raise await ref.adied()
        if isinstance(msg, m.Error):
            raise _error_from(msg, f"{spec.name}.__init__() of actor {ref.actor_id}")
    except BaseException:
        ref.release()
        raise
    return proxy_cls._parl_async_cls._parl_wrap(ref)


def _pack_init(spec: _ClassSpec, args: tuple, kwargs: dict) -> tuple[bytes, list]:
    init = inspect.signature(spec.cls) if spec.cls.__init__ is not object.__init__ else None
    if init is not None:
        try:
            init.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{spec.name}(): {exc}") from None
    try:
        return ser.dumps((spec.cls, args, kwargs))
    except Exception as exc:
        named = {f"the class {spec.name}": spec.cls}
        named.update({f"argument {i}": a for i, a in enumerate(args)})
        named.update({f"argument {k!r}": v for k, v in kwargs.items()})
        raise RemoteSerializeError(
            f"cannot send {spec.name}(...) to the cluster: {ser.find_culprit(named)}"
        ) from exc


def _sync_method(spec: _MethodSpec, wait: bool) -> Any:
    name = spec.name
    if wait:

        def method(self: ActorHandle, /, *args: Any, **kwargs: Any) -> Any:
            return self._parl_ref.call(METHOD, name, args, kwargs)
    else:

        def method(self: ActorHandle, /, *args: Any, **kwargs: Any) -> Any:
            return self._parl_ref.call_future(METHOD, name, args, kwargs)

    return method


def _async_method(spec: _MethodSpec) -> Any:
    name = spec.name

    def method(self: AsyncActorHandle, /, *args: Any, **kwargs: Any) -> Any:
        return self._parl_ref.call_async(METHOD, name, args, kwargs)

    return method


def _decorate(method: Any, cls: type, spec: _MethodSpec) -> Any:
    original = inspect.getattr_static(cls, spec.name)
    func = getattr(original, "__func__", original)
    method.__name__ = spec.name
    method.__qualname__ = f"{cls.__qualname__}.{spec.name}"
    method.__doc__ = getattr(func, "__doc__", None)
    method.__module__ = cls.__module__
    if spec.signature is not None:
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        method.__signature__ = spec.signature.replace(
            parameters=[self_param, *spec.signature.parameters.values()]
        )
    return method


def remote_class(
    cls: type | None = None,
    *,
    wait: bool = True,
    max_memory: float | None = None,
    n_gpu: int = 0,
) -> Any:
    """Make instances of `cls` live in the cluster; calls look like ordinary method calls.

    Use as `@parl.remote_class` or `@parl.remote_class(wait=False, max_memory=MB, n_gpu=k)`.

    Args:
        cls: the class to decorate.
        wait: True: blocking calls return results. False: they return a `RemoteFuture`
            (PARL's future mode), in the order the calls were made.
        max_memory: the actor's memory limit in MB; over it, the actor is stopped and its
            caller gets `RemoteActorDiedError` saying so.
        n_gpu: GPUs the actor needs, all on one worker; it runs with `CUDA_VISIBLE_DEVICES` set
            to exactly those.

    Returns:
        A class of the same name: `Actor(...)` creates a blocking handle, `await
        Actor.aio(...)` an awaitable one, `Actor._original` is the plain class.
    """
    if cls is None:
        return functools.partial(remote_class, wait=wait, max_memory=max_memory, n_gpu=n_gpu)
    if not inspect.isclass(cls):
        raise TypeError(f"@parl.remote_class decorates a class, not {ser.describe(cls)}")
    if isinstance(cls, type) and issubclass(cls, ActorHandle | AsyncActorHandle):
        raise TypeError(f"{cls.__name__} is already a remote class")
    if max_memory is not None and not max_memory > 0:
        raise ValueError(f"remote_class: {max_memory=} must be a positive number of MB")
    if not isinstance(n_gpu, int) or n_gpu < 0:
        raise ValueError(f"remote_class: {n_gpu=} must be a non-negative integer")
    _check_reserved(cls)
    spec = _ClassSpec(cls, cls.__name__, _method_specs(cls), wait, float(max_memory or 0.0), n_gpu)
    common = {
        "__slots__": (),
        "__module__": cls.__module__,
        "__doc__": cls.__doc__,
        "_parl_spec": spec,
        "_original": cls,
    }
    sync_ns = dict(
        common, **{n: _decorate(_sync_method(s, wait), cls, s) for n, s in spec.methods.items()}
    )
    async_ns = dict(
        common, **{n: _decorate(_async_method(s), cls, s) for n, s in spec.methods.items()}
    )
    sync_cls = type(cls.__name__, (ActorHandle,), sync_ns)
    async_cls = type(cls.__name__, (AsyncActorHandle,), async_ns)
    sync_cls.__qualname__ = async_cls.__qualname__ = cls.__qualname__
    for proxy in (sync_cls, async_cls):
        proxy._parl_sync_cls = sync_cls
        proxy._parl_async_cls = async_cls
    return sync_cls
