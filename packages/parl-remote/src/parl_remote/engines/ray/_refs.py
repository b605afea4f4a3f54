"""The handles' side of the Ray engine: one Ray-hosted actor as the handles of a process see it.

`_RayActorRef` is the `_ActorRef` twin that the handles of `@parl.remote_class` bind to on Ray:
its blocking calls (`_RayCalls`, from any thread), awaitable calls and `wait=False` futures
(`_RayFuture`) are Ray tasks of the actor's `RayHost` carrying the xparl messages that the one
`ActorCore` builds and reads. `RayClient` (`_client.py`) creates them, and adopts those whose
handles arrive from another process of the same Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from typing import Any

from parl_remote._exceptions import RemoteError
from parl_remote.client._call_core import INIT, ActorCore
from parl_remote.client._future import RemoteFuture
from parl_remote.client._spec import _ClassSpec, _running_loop
from parl_remote.engines.ray._host import writable
from parl_remote.wire.protocol import messages as m

__all__: list[str] = []


def _has_async_methods(spec: _ClassSpec) -> bool:
    """Whether the class needs the async host (`AsyncRayHost`)."""
    return any(method.is_async for method in spec.methods.values())


_carried = threading.local()


class _carrying:  # used as a function: `with _carrying() as carried`
    """Collect the Ray handles of the actors whose parl handles are pickled meanwhile.

    A parl handle travels inside the call's own pickle, where Ray does not see the Ray handle
    it carries: Ray would count the receiver as no holder of that actor, and free it with the
    sender's last handle. So the Ray handles also go beside the pickle, as arguments of the Ray
    task, where Ray counts them: in flight, and in the receiver for as long as it keeps them.
    (A class, not a generator: it is on every call's path.)
    """

    __slots__ = ("handles", "outer")

    def __enter__(self) -> list[Any]:
        self.outer = getattr(_carried, "handles", None)
        self.handles: list[Any] = []
        _carried.handles = self.handles
        return self.handles

    def __exit__(self, *exc_info: object) -> None:
        _carried.handles = self.outer


def _awaitable(object_ref: Any) -> asyncio.Future[Any]:
    """An asyncio future of a Ray ObjectRef, on the running loop."""
    return asyncio.wrap_future(object_ref.future())


class _RayCalls:
    """Blocking calls to one Ray-hosted actor, from any thread; the twin of `BlockingDriver`.

    Holds no reference to its `_RayActorRef`, so that the last handle going frees the actor.
    """

    def __init__(self, client: Any, core: ActorCore, handle: Any, caller: tuple[str, ...]) -> None:
        self.client, self.core, self.handle = client, core, handle
        self.caller = caller  # (the caller's key,) for an async host's turns; () for a sync one

    def create(
        self, payload: bytes, buffers: list[Any], bundle: bytes, carried: list[Any]
    ) -> tuple[str, ...]:
        """Build the actor; raise what its constructor raised. Returns the shadowed methods."""
        msg, buffers = self.core.init(payload, buffers, bundle)
        reply = self.wait(self.handle.init.remote(msg, buffers, tuple(carried)))
        hidden: tuple[str, ...] = self.value(reply, INIT)
        return hidden

    def call(self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `name` on the actor and return its result."""
        return self.value(self.wait(self.send(kind, name, args, kwargs)), name)

    def send(self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Submit a call now (in this caller's order); the Ray ObjectRef of its reply."""
        core = self.core
        if core.dead is not None:
            raise core.died_error()
        with _carrying() as carried:
            msg, buffers = core.call(kind, name, args, kwargs)
        request: tuple[Any, ...] = (msg.id, msg.name, msg.payload, int(msg.kind), msg.args)
        if carried:
            request += (tuple(carried),)
        return self.handle.call.remote(*self.caller, request, *buffers)

    def wait(self, object_ref: Any) -> Any:
        """The reply of a submitted call, or the parl error for what Ray reports."""
        try:
            return self.client.get(object_ref)
        except Exception as exc:
            raise self.error(exc) from None

    def value(self, reply: Any, name: str) -> Any:
        """What a reply (`(Result, buffers)` or a message) means: a value, or raised."""
        return self.core.result(*self.reply_parts(reply), name)

    @staticmethod
    def reply_parts(reply: Any) -> tuple[Any, tuple[Any, ...]]:
        """`(message, buffers)` of what the host returned (see `RayHost.call`)."""
        kind = type(reply)
        if kind is bytes:
            return m.Result(0, reply), ()
        if kind is tuple:
            first = reply[0]  # a pickle, or a `Result` that names hidden methods
            return (first if type(first) is m.Result else m.Result(0, first)), writable(reply[1])
        return reply, ()

    def error(self, exc: BaseException) -> BaseException:
        """The parl exception for a Ray failure of a call."""
        core, exceptions = self.core, self.client.ray.exceptions
        if isinstance(exc, exceptions.RayActorError | exceptions.ActorUnavailableError):
            return core.fate_error(core.dead or self.client.fate(core.actor_id, exc))
        if isinstance(exc, exceptions.RayError):
            said = " ".join(str(exc).split())[:400]
            return RemoteError(f"Ray failed a call to {core!r}: {said}")
        return exc

    def close(self, *, wake_only: bool = False) -> None:
        """Nothing to close: Ray owns the connections."""


class _RayActorRef:
    """One Ray-hosted actor as all its handles in this process share it; the `_ActorRef` twin."""

    def __init__(self, client: Any, spec: _ClassSpec, actor_id: str, handle: Any) -> None:
        self.client = client
        self.spec = spec
        self.class_name = spec.name
        self.actor_id = actor_id
        self.handle = handle
        self.core = ActorCore(spec.name, m.ActorAssigned(0, actor_id, "?", 0, 0, ""))
        caller = (uuid.uuid4().hex,) if _has_async_methods(spec) else ()
        self.blocking = _RayCalls(client, self.core, handle, caller)
        self.shadowed: tuple[str, ...] = ()
        self.created_here = False  # True: this process made it, and stops it on disconnect
        client.refs[actor_id] = self

    def __repr__(self) -> str:
        return f"{self.class_name} actor {self.actor_id} on Ray (pid {self.core.pid})"

    def placed(self, pid: int, node: str) -> None:
        """Ray started the actor: its process id and node address, for messages."""
        self.core.pid, self.core.host = pid, node

    def release(self) -> None:
        """Stop the actor now (its constructor failed, or it could not be placed)."""
        with contextlib.suppress(Exception):
            self.client.ray.kill(self.handle, no_restart=True)

    def mark_dead(self, reason: str) -> None:
        """The actor is gone: later calls fail at once."""
        self.core.mark_dead(reason)

    def close_connections(self, wake_only: bool = False) -> None:
        """Nothing to close: Ray owns the connections."""

    def abandon(self) -> tuple[Any, ...]:
        """In a child made by `fork`: nothing to set aside."""
        return ()

    def acall(
        self, kind: m.CallKind, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """An awaitable call, submitted now."""
        loop = _running_loop(self.class_name, name)
        future: asyncio.Future[Any] = loop.create_future()
        try:
            object_ref = self.blocking.send(kind, name, args, kwargs)
        except RemoteError as exc:
            future.set_exception(exc)
            return future

        def done(reply: Any) -> None:  # on a thread of Ray's: hop to the caller's loop
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(self._settle, future, reply, name)

        object_ref.future().add_done_callback(done)
        return future

    def _settle(self, future: asyncio.Future[Any], reply: Any, name: str) -> None:
        if future.done():  # cancelled by its caller
            return
        try:
            future.set_result(self.blocking.value(reply.result(), name))
        except BaseException as exc:
            future.set_exception(self.blocking.error(exc))

    def call_future(
        self, kind: m.CallKind, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RemoteFuture:
        """A future-mode call: submitted now, waited for with `get()`."""
        future = _RayFuture(self, name)
        try:
            future.object_ref = self.blocking.send(kind, name, args, kwargs)
        except RemoteError as exc:
            future.fail(exc)
        return future

    def where(self) -> tuple[Any, ...]:
        """What names this actor to another process of the same Ray (`RayClient.adopt`).

        Its Ray handle also goes beside the pickle of a call that carries it (`_carrying`).
        """
        carried = getattr(_carried, "handles", None)
        if carried is not None:
            carried.append(self.handle)
        return (self.handle, self.core.pid, self.core.host)


class _RayFuture(RemoteFuture):
    """A `RemoteFuture` whose reply Ray holds: `get` waits on the ObjectRef itself."""

    __slots__ = ("object_ref",)

    def __init__(self, ref: _RayActorRef, name: str) -> None:
        super().__init__(ref, name)
        self.object_ref: Any = None

    def done(self) -> bool:
        """Whether the call finished (successfully or not)."""
        if super().done() or self.object_ref is None:
            return True
        ready, _ = self._ref.client.ray.wait([self.object_ref], timeout=0)
        return bool(ready)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Wait for the result (at most `timeout` seconds) and return it, or raise its error.

        Raises:
            TimeoutError: not finished within `timeout` (or at once, with `block=False`);
                the call goes on, and `get` may be called again.
            FutureGetRepeatedlyError: the result was already taken by an earlier `get`.
        """
        object_ref, calls = self.object_ref, self._ref.blocking
        if object_ref is not None and not self._taken:
            ray = self._ref.client.ray
            try:
                reply = self._ref.client.get(object_ref, timeout=timeout if block else 0)
            except ray.exceptions.GetTimeoutError:
                raise self._unfinished(block, timeout) from None
            except Exception as exc:
                self.fail(calls.error(exc))
            else:
                self.settle(*calls.reply_parts(reply))
            self.object_ref = None
        return super().get(block=False)
