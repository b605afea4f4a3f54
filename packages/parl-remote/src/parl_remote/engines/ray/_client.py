"""The Ray engine: `parl.connect(backend="ray")` places actors on a Ray cluster.

`RayClient` stands where the xparl `Client` stands, behind the same interface to the handles
of `@parl.remote_class` (`create_ref` / `acreate_ref`, `kill`, `refs`, `bundle`): each parl
actor is one Ray actor running `RayHost` (asking Ray for 1 CPU, its `n_gpu` GPUs and its
`max_memory` as Ray `memory`), and the handles bind to a `_RayActorRef` (`_refs.py`),
whose calls are Ray tasks carrying the xparl messages (`Init`, `Call`) that the one
`ActorCore` builds and reads.
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
import concurrent.futures
import contextlib
import logging
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

from parl_remote._config import settings
from parl_remote._exceptions import NotConnectedError, ResourceError
from parl_remote.client._bundle import Bundle
from parl_remote.client._call_core import INIT, init_payload
from parl_remote.client._engine import already_connected
from parl_remote.client._spec import _ClassSpec
from parl_remote.engines.ray._host import (
    FATE_NAMESPACE,
    AsyncRayHost,
    RayHost,
    in_async_actor,
    internal_kv,
    put_fate,
)
from parl_remote.engines.ray._refs import _awaitable, _carrying, _has_async_methods, _RayActorRef

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

    # -- the engine's side of `parl.connect` (see `client/_engine.py`) ------------------------
    @classmethod
    def prepare(
        cls, address: str | None, *, tls: bool, cpu_num: int | None, preload: list[str]
    ) -> None:
        """Refuse `tls` (Ray has its own) and `preload`, and say how to install Ray if missing."""
        if tls:
            raise ValueError(
                "connect: tls=True applies to PARL's own clusters; a Ray cluster's traffic is "
                "secured by Ray's TLS settings (RAY_USE_TLS and its certificates)"
            )
        if preload:
            raise ValueError(
                "connect: preload applies to PARL's own clusters, whose warm processes wait for "
                "actors; Ray starts a worker process per actor (see Ray's runtime_env)"
            )
        import_ray()

    @classmethod
    def connect(
        cls,
        address: str | None,
        *,
        distributed_files: Iterable[str] = (),
        log_to_driver: bool = True,
        cpu_num: int | None = None,
        inherited: tuple[str, bytes | None] | None = None,
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

    def preload(self, modules: list[str]) -> None:
        """Never asked: `prepare` refuses `preload`."""
        raise ValueError("connect: preload applies to PARL's own clusters")

    def after_fork(self) -> None:
        """In a child made by `fork`: abandon this client; Ray's driver state dies with fork."""
        self.abandon()

    @classmethod
    def join(cls, where: tuple[Any, ...]) -> Any:
        """Connect this process to Ray, where an arriving handle's actor lives."""
        from parl_remote.client._connect import connect

        return connect(backend="ray", log_to_driver=False)

    def reconnect(
        self, address: str | None, cpu_num: int | None, distributed_files: Iterable[str]
    ) -> RayClient:
        """This client, unless `parl.connect` asks for files to ship (a new client's)."""
        if list(distributed_files):
            raise already_connected(self)
        return self

    def adopt(self, spec: _ClassSpec, actor_id: str, where: tuple[Any, ...]) -> _RayActorRef:
        """The reference of an actor whose handle arrived (`_RayActorRef.where` there)."""
        handle, pid, node = where
        ref = _RayActorRef(self, spec, actor_id, handle)
        ref.placed(pid, node)
        return ref

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
        with _carrying() as carried:
            payload, buffers = init_payload(spec.cls, spec.name, args, kwargs)
        ref = self._new(spec)
        try:
            try:
                where = self.get(ref.handle.ready.remote(), timeout=settings.resource_wait_s)
            except self.ray.exceptions.GetTimeoutError:
                raise self._unplaced(spec) from None
            except Exception as exc:
                raise ref.blocking.error(exc) from None
            ref.placed(*where)
            ref.shadowed = ref.blocking.create(payload, buffers, self.bundle.data(), carried)
        except BaseException:
            ref.release()
            raise
        return ref

    async def acreate_ref(
        self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _RayActorRef:
        """`create_ref` from async code."""
        with _carrying() as carried:
            payload, buffers = init_payload(spec.cls, spec.name, args, kwargs)
        ref = self._new(spec)
        try:
            try:
                where = await asyncio.wait_for(
                    _awaitable(ref.handle.ready.remote()), settings.resource_wait_s
                )
                ref.placed(*where)
                msg, buffers = ref.core.init(payload, buffers, self.bundle.data())
                reply = await _awaitable(ref.handle.init.remote(msg, buffers, tuple(carried)))
            except TimeoutError:
                raise self._unplaced(spec) from None
            except Exception as exc:
                raise ref.blocking.error(exc) from None
            ref.shadowed = ref.blocking.value(reply, INIT)
        except BaseException:
            ref.release()
            raise
        return ref

    def get(self, object_ref: Any, timeout: float | None = None) -> Any:
        """`ray.get`; in an async actor's process, the ObjectRef's future's result instead.

        A blocking parl call from a method of an async actor means to block its loop, as on
        xparl; Ray's `ray.get` would warn about that, the future waits the same without it.
        """
        if not in_async_actor():
            return self.ray.get(object_ref, timeout=timeout)
        try:
            return object_ref.future().result(timeout)
        except concurrent.futures.TimeoutError:
            raise self.ray.exceptions.GetTimeoutError(f"not ready within {timeout} s") from None

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
