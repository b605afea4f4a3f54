"""`@parl.remote_class` and actor handles: method names bound to the call drivers.

`remote_class(cls)` returns a proxy class with the same name and methods. Instantiating it
places an actor in the cluster and returns a *blocking handle*: `actor.add(1, 2)` runs on the
actor and returns the result. `actor.aio` is the *awaitable handle* of the same actor (`await
actor.aio.add(1, 2)`), and `await Actor.aio(...)` creates one from async code; `handle.sync`
goes back. With `wait=False`, blocking-handle methods return a `RemoteFuture` instead of
waiting.

All handles of one actor share one reference to it (`_engine.ActorRef`), made by the engine
this process is connected to (`_engine.Engine`: xparl's, or Ray's): the actor's call core and
the engine's way of carrying its calls. Handles only bind names to it: blocking methods to
`ref.blocking.call`, awaitable ones to `ref.acall`, future mode to `ref.call_future`. The actor
lives as long as some handle (or a bound method of one, or a call in flight) does: when the
last goes, the ref's finalizer frees the actor and its CPU slot.

A handle passed to an actor method (or returned from one) arrives in the other process as a
handle of the same kind to the same actor: that process joins the cluster if it is not a
client yet, and tells the master it holds the actor, which then lives while any process
holds a handle of it, and ends with the client that created it.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import sys
import threading
import weakref
from typing import Any, cast

from parl_remote._exceptions import NotConnectedError
from parl_remote.client import _engine
from parl_remote.client._connect import current_client
from parl_remote.client._engine import ActorRef
from parl_remote.client._spec import _check_reserved, _ClassSpec, _method_specs, _MethodSpec
from parl_remote.wire import _serialize as ser
from parl_remote.wire.protocol import messages as m

__all__ = ["ActorHandle", "AsyncActorHandle", "kill", "remote_class"]

METHOD, GETATTR, SETATTR = m.CallKind.METHOD, m.CallKind.GETATTR, m.CallKind.SETATTR
_PROXIES: weakref.WeakKeyDictionary[type, type[Any]] = weakref.WeakKeyDictionary()  # cls -> proxy


def _reduce(ref: ActorRef, awaitable: bool) -> tuple[Any, ...]:
    """How a handle of `ref`'s actor travels to another process (see `_rebuild`)."""
    spec = ref.spec
    carried = getattr(_transit, "refs", None)
    if carried is not None:  # sent in a call: the call keeps the actor until it is answered
        carried.append(ref)
    kind = (_class_ref(spec.cls), spec.wait, spec.max_memory_mb, spec.n_gpu, awaitable)
    actor = (ref.client.backend, ref.actor_id, ref.shadowed, ref.where())
    return _rebuild, (*kind, *actor)


_transit = threading.local()


def _carrying(call: Any) -> Any:
    """Return `call()`'s future, which keeps every actor whose handle the call carried.

    A handle sent in a call that is not waited for, and dropped at once, must not end its
    actor before the receiver holds it: the actor lives at least as long as the call's future
    (the driver keeps it until the answer, when the receiver has unpickled the handle).
    """
    outer = getattr(_transit, "refs", None)
    carried: list[Any] = []
    _transit.refs = carried
    try:
        future = call()
    finally:
        _transit.refs = outer
    if carried:
        weakref.finalize(future, carried.clear)  # `carried` lives while `future` does
    return future


def _class_ref(cls: type) -> type:
    """What names the class of a travelling handle.

    Its proxy where a module exports it (pickled by reference), else the plain class (pickled
    by value, as a class of the user's script is).
    """
    proxy = _PROXIES.get(cls)
    module = sys.modules.get(cls.__module__) if cls.__module__ != "__main__" else None
    exported = module is not None and getattr(module, cls.__qualname__, None) is proxy
    return proxy if proxy is not None and exported else cls


def _rebuild(
    cls: type,
    wait: bool,
    max_memory_mb: float,
    n_gpu: int,
    awaitable: bool,
    backend: str,
    actor_id: str,
    shadowed: tuple[str, ...],
    where: tuple[Any, ...],
) -> Any:
    """A handle that arrived from another process: the same actor, of the same kind.

    This process joins the actor's cluster (through its engine, `where` says where) if it is
    not connected yet, and its engine adopts the actor.
    """
    try:
        client = current_client()
    except NotConnectedError:
        client = _engine.find(backend).join(where)
    if client.backend != backend:
        raise NotConnectedError(
            f"a handle of an actor on {backend!r} arrived in a process connected to "
            f"{client.backend!r}: connect it to the actor's cluster"
        )
    ref = client.refs.get(actor_id)
    if ref is None:
        ref = client.adopt(_spec_of(cls, wait, max_memory_mb, n_gpu), actor_id, where)
        ref.shadowed = tuple(shadowed)
    proxy = _PROXIES[ref.spec.cls]
    return (proxy._parl_async_cls if awaitable else proxy)._parl_wrap(ref)


def _spec_of(cls: type, wait: bool, max_memory_mb: float, n_gpu: int) -> _ClassSpec:
    """The class spec of a travelling handle's class (its proxy, or the plain class)."""
    if issubclass(cls, ActorHandle):
        proxy: Any = cls
    else:
        proxy = _PROXIES.get(cls) or remote_class(
            cls, wait=wait, max_memory=max_memory_mb or None, n_gpu=n_gpu
        )
    spec: _ClassSpec = proxy._parl_spec
    return spec


# -- handles ---------------------------------------------------------------------------------
class _AioAccess:
    """`Actor.aio(...)` creates an actor from async code; `actor.aio` is its awaitable handle."""

    def __get__(self, handle: Any, owner: type[Any]) -> Any:
        if handle is None:
            return functools.partial(_acreate, owner)
        twin = handle._parl_aio
        if twin is None:
            twin = owner._parl_async_cls._parl_wrap(handle._parl_ref)
            object.__setattr__(handle, "_parl_aio", twin)
        return twin


class _SyncAccess:
    """`handle.sync`: the blocking handle of the same actor."""

    def __get__(self, handle: Any, owner: type[Any]) -> Any:
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

    __slots__ = ("__weakref__", "_parl_aio", "_parl_ref")
    _parl_spec: _ClassSpec
    _parl_async_cls: type[Any]  # the AsyncActorHandle subclass of the same class
    _parl_sync_cls: type[Any]  # the ActorHandle subclass
    _original: type
    aio = _AioAccess()
    sync = _SyncAccess()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._parl_wrap(_create(cls._parl_spec, args, kwargs))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # `__new__` built the actor

    @classmethod
    def _parl_wrap(cls: type[Any], ref: ActorRef) -> Any:
        handle: object = object.__new__(
            _shadowing(cast(type, cls), ref.shadowed) if ref.shadowed else cls
        )
        object.__setattr__(handle, "_parl_aio", None)
        object.__setattr__(handle, "_parl_ref", ref)
        return _track(handle, ref)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_parl_") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return self._parl_ref.blocking.call(GETATTR, name, (), {})

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_parl_"):
            raise AttributeError(f"{name!r} is internal to the actor handle")
        ref = self._parl_ref
        ref.blocking.call(SETATTR, name, (value,), {})
        if name in ref.spec.methods and name not in ref.shadowed:  # now hides the method
            _reshadow(weakref.ref(ref), (*ref.shadowed, name))

    def __repr__(self) -> str:
        return f"<{self._parl_ref!r}>"

    def __reduce__(self) -> Any:
        return _reduce(self._parl_ref, awaitable=False)


class AsyncActorHandle:
    """Base of the awaitable handles: every method returns an awaitable of the result."""

    __slots__ = ("__weakref__", "_parl_ref")
    _parl_spec: _ClassSpec
    _parl_async_cls: type[Any]  # the AsyncActorHandle subclass of the same class
    _parl_sync_cls: type[Any]  # the ActorHandle subclass
    _original: type
    sync = _SyncAccess()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"create actors with `await {type(self).__name__}.aio(...)` in async code, or "
            f"`{type(self).__name__}(...)` in plain code"
        )

    @classmethod
    def _parl_wrap(cls: type[Any], ref: ActorRef) -> Any:
        handle: object = object.__new__(
            _shadowing(cast(type, cls), ref.shadowed) if ref.shadowed else cls
        )
        object.__setattr__(handle, "_parl_ref", ref)
        return _track(handle, ref)

    @property
    def aio(self) -> AsyncActorHandle:
        """This handle itself."""
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_parl_") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return self._parl_ref.acall(GETATTR, name, (), {})

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
        return _reduce(self._parl_ref, awaitable=True)


# Callers pass `cast(type, proxy)`: to mypy only a plain `type` is hashable, as the cache needs.
@functools.cache
def _shadowing(proxy_cls: type[Any], names: tuple[str, ...]) -> type:
    """`proxy_cls` where the methods `names` read as the actor's attributes of those names.

    As in PARL: an instance attribute hides a method of the same name (`self.arg1 = 5` in
    `__init__` makes `actor.arg1` read 5); calling it then raises the TypeError it would locally.
    """
    if issubclass(proxy_cls, ActorHandle):

        def read(name: str) -> property:
            return property(lambda self: self._parl_ref.blocking.call(GETATTR, name, (), {}))
    else:

        def read(name: str) -> property:
            return property(lambda self: self._parl_ref.acall(GETATTR, name, (), {}))

    namespace = {n: read(n) for n in names if n in proxy_cls._parl_spec.methods}
    shadowing = type(proxy_cls.__name__, (proxy_cls,), {"__slots__": (), **namespace})
    shadowing.__qualname__ = proxy_cls.__qualname__
    shadowing.__module__ = proxy_cls.__module__
    return shadowing


_handles: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
_handles_lock = threading.Lock()


def _track(handle: Any, ref: ActorRef) -> Any:
    """Note `handle` as one of `ref`'s, whose class changes when its actor hides a method."""
    with _handles_lock:
        known = _handles.get(ref)
        if known is None:
            known = _handles[ref] = weakref.WeakSet()
            ref.core.on_shadowed = functools.partial(_reshadow, weakref.ref(ref))
        known.add(handle)
    return handle


def _reshadow(ref_alive: Any, names: tuple[str, ...]) -> None:
    """The actor's attributes hide the methods `names` now: every handle of it reads them."""
    ref = ref_alive()
    if ref is None:
        return
    names = tuple(n for n in names if n in ref.spec.methods)
    with _handles_lock:
        ref.shadowed = names
        handles = list(_handles.get(ref, ()))
    for handle in handles:
        sync = isinstance(handle, ActorHandle)
        base = cast(type, handle._parl_sync_cls if sync else handle._parl_async_cls)
        object.__setattr__(handle, "__class__", _shadowing(base, names) if names else base)


def _create(spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorRef:
    return current_client().create_ref(spec, args, kwargs)


async def _acreate(proxy_cls: type[Any], *args: Any, **kwargs: Any) -> AsyncActorHandle:
    ref = await current_client().acreate_ref(proxy_cls._parl_spec, args, kwargs)
    handle: AsyncActorHandle = proxy_cls._parl_async_cls._parl_wrap(ref)
    return handle


def _sync_method(spec: _MethodSpec, wait: bool) -> Any:
    name = spec.name
    if wait:

        def method(self: ActorHandle, /, *args: Any, **kwargs: Any) -> Any:
            return self._parl_ref.blocking.call(METHOD, name, args, kwargs)
    else:

        def method(self: ActorHandle, /, *args: Any, **kwargs: Any) -> Any:
            ref = self._parl_ref
            return _carrying(lambda: ref.call_future(METHOD, name, args, kwargs))

    return method


def _async_method(spec: _MethodSpec) -> Any:
    name = spec.name

    def method(self: AsyncActorHandle, /, *args: Any, **kwargs: Any) -> Any:
        ref = self._parl_ref
        return _carrying(lambda: ref.acall(METHOD, name, args, kwargs))

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


def kill(handle: ActorHandle | AsyncActorHandle) -> None:
    """Stop the actor of `handle` now and free its slot, whoever created it.

    A call to it waiting at that moment, and every later call on any handle of it in any
    process, raise `RemoteActorDiedError` saying it was killed. Killing an actor that is
    already gone does nothing.

    Args:
        handle: a blocking or awaitable handle of the actor.

    Raises:
        TypeError: `handle` is not an actor handle.
        ClusterError: the master could not be reached to stop it.
    """
    if not isinstance(handle, ActorHandle | AsyncActorHandle):
        raise TypeError(f"parl.kill() takes an actor handle, not {ser.describe(handle)}")
    ref = handle._parl_ref
    if ref.core.dead is not None:
        return
    reason = f"it was killed by parl.kill() in process {os.getpid()} on {socket.gethostname()}"
    ref.client.kill(ref.actor_id, reason)


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
    proxy: type[Any]
    for proxy in (sync_cls, async_cls):
        proxy._parl_sync_cls = sync_cls
        proxy._parl_async_cls = async_cls
    _PROXIES[cls] = sync_cls
    return sync_cls
