"""The Ray engine: `parl.connect(backend="ray")` places actors on a Ray cluster.

`RayClient` stands where the xparl `Client` stands, behind the same interface to the handles
of `@parl.remote_class` (`create_ref` / `acreate_ref`, `kill`, `refs`, `bundle`): each parl
actor is one Ray actor running `RayHost` (asking Ray for 1 CPU, its `n_gpu` GPUs and its
`max_memory` as Ray `memory`), and the handles bind to a `_RayActorRef`, whose calls are Ray
tasks carrying the xparl messages (`Init`, `Call`) that the one `ActorCore` builds and reads.
So results, errors (the method's own type and `RemoteError`, with the remote traceback),
attribute access and the call order mean on Ray what they mean on xparl.

What Ray does itself: placement, the transport (an array argument travels through Ray's object
store), freeing an actor when its last handle in any process goes, and failing every pending
call when an actor dies -- which becomes `RemoteActorDiedError` here, with the reason the actor
left in Ray's key-value store if it left one (`sys.exit`, its memory limit, `parl.kill`).

Every call into Ray goes through the untyped module object `self.ray`, never a typed name, so
that the rest of the package stays typed without stubs for Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

from parl_remote._actor_ref import _ClassSpec, _running_loop
from parl_remote._bundle import Bundle
from parl_remote._call_core import INIT, ActorCore, init_payload
from parl_remote._config import settings
from parl_remote._drivers import RemoteFuture
from parl_remote._exceptions import NotConnectedError, RemoteError, ResourceError
from parl_remote._ray_host import (
    FATE_NAMESPACE,
    AsyncRayHost,
    RayHost,
    internal_kv,
    put_fate,
    writable,
)
from parl_remote.protocol import messages as m

__all__ = ["INSTALL_RAY", "RayClient", "import_ray"]

logger = logging.getLogger(__name__)

INSTALL_RAY = 'pip install "parl-remote[ray]"'
_MAX_CONCURRENCY = 1000  # async methods of one actor running at once (Ray's default is 1000)


def import_ray() -> Any:
    """The `ray` module, or ImportError naming the command that installs it."""
    try:
        import ray  # type: ignore[import-untyped,unused-ignore]  # Ray ships no complete stubs
    except ImportError as exc:
        if exc.name not in (None, "ray") and not str(exc).startswith("import of ray"):
            raise  # Ray is there, but its own import failed: keep that error
        raise ImportError(
            f'parl.connect(backend="ray") needs Ray, which is not installed: {INSTALL_RAY}'
        ) from exc
    return ray


class RayClient:
    """This process's membership in a Ray cluster (see the module docstring).

    Args:
        ray: the `ray` module, initialized.
        address: what `ray.init` was given (None: a local Ray or `RAY_ADDRESS`).
        distributed_files: files every actor gets in its working directory.
        owns_ray: whether `parl.connect` started Ray here (then `close` shuts it down).
    """

    backend = "ray"
    token = None

    def __init__(
        self,
        ray: Any,
        address: str | None,
        *,
        distributed_files: Iterable[str] = (),
        owns_ray: bool = False,
    ) -> None:
        self.ray = ray
        self.address = address or "a local Ray"
        self.bundle = Bundle(distributed_files)
        self.owns_ray = owns_ray
        self.refs: weakref.WeakValueDictionary[str, _RayActorRef] = weakref.WeakValueDictionary()
        self.fates: dict[str, str] = {}
        self._closed = False
        self._hosts = (ray.remote(RayHost), ray.remote(AsyncRayHost))  # without / with async def

    @classmethod
    def start(
        cls,
        address: str | None,
        *,
        distributed_files: Iterable[str] = (),
        log_to_driver: bool = True,
        cpu_num: int | None = None,
    ) -> RayClient:
        """Initialize Ray here (unless it already is) and return the client over it."""
        ray = import_ray()
        if cpu_num is not None and address is not None:
            raise ValueError("cpu_num sets the size of a local Ray; it needs address=None")
        files = list(distributed_files)
        Bundle(files)  # a pattern that matches nothing fails now, before Ray starts
        owns = not ray.is_initialized()
        if owns:
            kwargs: dict[str, Any] = {"address": address, "log_to_driver": log_to_driver}
            if cpu_num is not None:
                kwargs["num_cpus"] = cpu_num
            ray.init(**kwargs)
        else:
            logger.info("parl: using the Ray this process already joined")
        return cls(ray, address, distributed_files=files, owns_ray=owns)

    def close(self) -> None:
        """Leave: every actor this process created is stopped; a Ray started here shuts down."""
        if self._closed:
            return
        self._closed = True
        for ref in list(self.refs.values()):
            ref.core.mark_dead("this client is closed")
            if ref.created_here:
                ref.release()
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()

    def abandon(self) -> None:
        """In a child made by `fork`: the parent's Ray is not ours; never use it, nor close it."""
        self._closed = True
        self.refs = weakref.WeakValueDictionary()

    # -- creating actors ----------------------------------------------------------------------
    def _new(self, spec: _ClassSpec) -> _RayActorRef:
        self._check_open()
        is_async = _has_async_methods(spec)
        options: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0, "max_task_retries": 0}
        if is_async:
            options["max_concurrency"] = _MAX_CONCURRENCY
        if spec.n_gpu:
            options["num_gpus"] = spec.n_gpu
        if spec.max_memory_mb:
            options["memory"] = int(spec.max_memory_mb * 1e6)
        actor_id = uuid.uuid4().hex[:12]
        handle = (
            self._hosts[is_async].options(**options).remote(actor_id, spec.name, spec.max_memory_mb)
        )
        ref = _RayActorRef(self, spec, actor_id, handle)
        ref.created_here = True
        return ref

    def _unplaced(self, spec: _ClassSpec) -> ResourceError:
        gpus = f" and {spec.n_gpu} GPU(s)" if spec.n_gpu else ""
        return ResourceError(
            f"Ray found no node with 1 CPU{gpus} free for {spec.name} within "
            f"{settings.resource_wait_s:g} s (PARL_RESOURCE_WAIT_S); free some actors, add "
            "nodes, or wait longer. `ray status` shows what the cluster has."
        )

    def create_ref(
        self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _RayActorRef:
        """Place a new actor and build its instance (blocking); its shared reference."""
        payload, buffers = init_payload(spec.cls, spec.name, args, kwargs)
        ref = self._new(spec)
        try:
            try:
                where = self.ray.get(ref.handle.ready.remote(), timeout=settings.resource_wait_s)
            except self.ray.exceptions.GetTimeoutError:
                raise self._unplaced(spec) from None
            except Exception as exc:
                raise ref.blocking.error(exc) from None
            ref.placed(*where)
            ref.shadowed = ref.blocking.create(payload, buffers, self.bundle.data())
        except BaseException:
            ref.release()
            raise
        return ref

    async def acreate_ref(
        self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _RayActorRef:
        """`create_ref` from async code."""
        payload, buffers = init_payload(spec.cls, spec.name, args, kwargs)
        ref = self._new(spec)
        try:
            try:
                where = await asyncio.wait_for(
                    _awaitable(ref.handle.ready.remote()), settings.resource_wait_s
                )
                ref.placed(*where)
                msg, buffers = ref.core.init(payload, buffers, self.bundle.data(), copy=False)
                reply = await _awaitable(ref.handle.init.remote(msg, buffers))
            except TimeoutError:
                raise self._unplaced(spec) from None
            except Exception as exc:
                raise ref.blocking.error(exc) from None
            ref.shadowed = ref.blocking.value(reply, INIT)
        except BaseException:
            ref.release()
            raise
        return ref

    # -- fates --------------------------------------------------------------------------------
    def kill(self, actor_id: str, reason: str, timeout: float = 10.0) -> None:
        """Stop an actor now: its calls here and in every process fail with `reason`."""
        self.fates.setdefault(actor_id, reason)
        ref = self.refs.get(actor_id)
        if ref is None:
            return
        ref.core.mark_dead(reason)
        put_fate(actor_id, reason)
        with contextlib.suppress(Exception):
            self.ray.kill(ref.handle, no_restart=True)

    def fate(self, actor_id: str, error: BaseException) -> str:
        """Why an actor died: what it or its killer left, else what Ray says (`error`)."""
        if actor_id in self.fates:
            return self.fates[actor_id]
        with contextlib.suppress(Exception):
            left = internal_kv()._internal_kv_get(actor_id.encode(), namespace=FATE_NAMESPACE)
            if left:
                reason: str = left.decode()
                self.fates[actor_id] = reason
                return reason
        said = " ".join(str(error).split())
        return f"its Ray actor died ({said[:400]})"

    def _check_open(self) -> None:
        if self._closed:
            raise NotConnectedError("this PARL client is closed; call parl.connect(...) again")


def _has_async_methods(spec: _ClassSpec) -> bool:
    """Whether the class needs the async host (`AsyncRayHost`)."""
    return any(method.is_async for method in spec.methods.values())


def _awaitable(object_ref: Any) -> asyncio.Future[Any]:
    """An asyncio future of a Ray ObjectRef, on the running loop."""
    return asyncio.wrap_future(object_ref.future())


class _RayCalls:
    """Blocking calls to one Ray-hosted actor, from any thread; the twin of `BlockingDriver`.

    Holds no reference to its `_RayActorRef`, so that the last handle going frees the actor.
    """

    def __init__(
        self, client: RayClient, core: ActorCore, handle: Any, caller: tuple[str, ...]
    ) -> None:
        self.client, self.core, self.handle = client, core, handle
        self.caller = caller  # (the caller's key,) for an async host's turns; () for a sync one

    def create(self, payload: bytes, buffers: list[Any], bundle: bytes) -> tuple[str, ...]:
        """Build the actor; raise what its constructor raised. Returns the shadowed methods."""
        msg, buffers = self.core.init(payload, buffers, bundle, copy=False)
        hidden: tuple[str, ...] = self.value(self.wait(self.handle.init.remote(msg, buffers)), INIT)
        return hidden

    def call(self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `name` on the actor and return its result."""
        return self.value(self.wait(self.send(kind, name, args, kwargs)), name)

    def send(self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Submit a call now (in this caller's order); the Ray ObjectRef of its reply."""
        core = self.core
        if core.dead is not None:
            raise core.died_error()
        msg, buffers = core.call(kind, name, args, kwargs, copy=False)
        request = (msg.id, msg.name, msg.payload, int(msg.kind), msg.args)  # see RayHost.call
        return self.handle.call.remote(*self.caller, request, *buffers)

    def wait(self, object_ref: Any) -> Any:
        """The reply of a submitted call, or the parl error for what Ray reports."""
        try:
            return self.client.ray.get(object_ref)
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
            return m.Result(0, reply[0]), writable(reply[1])
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

    def __init__(self, client: RayClient, spec: _ClassSpec, actor_id: str, handle: Any) -> None:
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

    def travel(self, awaitable: bool, class_ref: type) -> tuple[Any, ...]:
        """How a handle of this actor is pickled into another process of the same Ray."""
        spec = self.spec
        kind = (class_ref, spec.wait, spec.max_memory_mb, spec.n_gpu, awaitable)
        where = (self.actor_id, self.handle, self.core.pid, self.core.host, self.shadowed)
        return _rebuild, (*kind, *where)


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
                reply = ray.get(object_ref, timeout=timeout if block else 0)
            except ray.exceptions.GetTimeoutError:
                raise self._unfinished(block, timeout) from None
            except Exception as exc:
                self.fail(calls.error(exc))
            else:
                self.settle(*calls.reply_parts(reply))
            self.object_ref = None
        return super().get(block=False)


def _rebuild(
    cls: type,
    wait: bool,
    max_memory_mb: float,
    n_gpu: int,
    awaitable: bool,
    actor_id: str,
    handle: Any,
    pid: int,
    node: str,
    shadowed: tuple[str, ...],
) -> Any:
    """A handle that arrived from another process of the same Ray: the same actor."""
    from parl_remote import _connect
    from parl_remote._remote_class import _PROXIES, _spec_of

    try:
        client = _connect.current_client()
    except NotConnectedError:
        client = _connect.connect(backend="ray", log_to_driver=False)
    if not isinstance(client, RayClient):
        raise NotConnectedError(
            "a handle of an actor on Ray arrived in a process connected to an xparl cluster"
        )
    ref = client.refs.get(actor_id)
    if ref is None:
        ref = _RayActorRef(client, _spec_of(cls, wait, max_memory_mb, n_gpu), actor_id, handle)
        ref.placed(pid, node)
        ref.shadowed = tuple(shadowed)
    proxy = _PROXIES[ref.spec.cls]
    return (proxy._parl_async_cls if awaitable else proxy)._parl_wrap(ref)
