"""The Ray actor that hosts one parl actor: xparl's actor-host semantics inside a Ray worker.

The Ray engine (`_client.py`) wraps `RayHost` with `ray.remote` and creates one per parl
actor. It speaks the messages of the xparl protocol without the wire: `init` takes an `Init`
and answers `Ready` or `Error`; `call` takes a `Call` (its fields, as a tuple) and answers the
payload of a `Result` (with its buffers, if any) or an `Error`, so that the caller reads
replies with the same `ActorCore` as on xparl, and every error keeps its class and remote
traceback.

A class without `async def` methods gets a plain `RayHost`, a synchronous Ray actor: Ray runs
its calls one at a time, in each caller's order. A class with some gets `AsyncRayHost`, an
async Ray actor: synchronous methods run on its event loop, one at a time, and `async def`
methods run as concurrent tasks on the same loop; calls from one caller start in the order they
were made, whatever order Ray delivers them in (each carries the call id its caller's
`ActorCore` gave it). `sys.exit` in a method and a `max_memory` overrun end the process, after
leaving the reason in Ray's key-value store, where callers read it into `RemoteActorDiedError`.

This module never imports `ray` at import time: Ray's worker does, and the client needs it only
to name the class.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import io
import os
import shutil
import socket
import sys
import threading
import time
import zipfile
from typing import Any, NamedTuple

from parl_remote._util import method_entry, private_dir, sweep_dead_dirs
from parl_remote.actor._calls import unpickling_error
from parl_remote.actor._shadow import ShadowWatch
from parl_remote.wire import _serialize as ser
from parl_remote.wire.protocol import messages as m

__all__ = [
    "AsyncRayHost",
    "FATE_NAMESPACE",
    "RayHost",
    "in_async_actor",
    "internal_kv",
    "put_fate",
    "writable",
]

FATE_NAMESPACE = "parl_actor_fates"
_TURN_WAIT_S = 10.0  # a call id never sent (its caller was interrupted) stops holding up others
_MEMORY_EVERY_S = 0.1


_in_async_actor = False


def in_async_actor() -> bool:
    """Whether this process hosts an `AsyncRayHost` (where Ray warns of a blocking `ray.get`)."""
    return _in_async_actor


def internal_kv() -> Any:
    """Ray's key-value store in the cluster's control service (an untyped module)."""
    return importlib.import_module("ray.experimental.internal_kv")


def put_fate(actor_id: str, reason: str) -> None:
    """Leave why `actor_id` ended in Ray's key-value store (the first reason stays)."""
    with contextlib.suppress(Exception):
        internal_kv()._internal_kv_put(
            actor_id.encode(), reason.encode(), overwrite=False, namespace=FATE_NAMESPACE
        )


def writable(buffers: list[Any] | tuple[Any, ...]) -> tuple[Any, ...]:
    """The out-of-band buffers of a message from Ray, each one writable.

    Ray hands them over as read-only views of its object store; arrays a caller or an actor
    receives are its own to write, as on xparl, so a read-only one is copied (once).
    """
    return tuple(bytearray(b) if memoryview(b).readonly else b for b in buffers)


class _Turns:
    """The call ids of one caller: a call starts after every call with a smaller id started."""

    def __init__(self) -> None:
        self.next = 1
        self.changed = asyncio.Event()

    async def wait(self, call_id: int) -> None:
        deadline = time.monotonic() + _TURN_WAIT_S
        while call_id > self.next:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def started(self, call_id: int) -> None:
        if call_id >= self.next:
            self.next = call_id + 1
            self.changed.set()


class RayHost:
    """One parl actor inside a Ray actor (see the module docstring).

    Args:
        actor_id: the parl actor id (Ray's log prefix shows it).
        class_name: the user's class.
        max_memory_mb: the memory limit (RSS, in MB) enforced here; 0 for none.
    """

    def __init__(self, actor_id: str, class_name: str, max_memory_mb: float) -> None:
        self.actor_id = actor_id
        self.class_name = class_name
        self.instance: Any = None
        self.methods: dict[str, tuple[Any, bool]] = {}
        self.shadow = ShadowWatch()
        self.turns: dict[str, _Turns] = {}
        if max_memory_mb > 0:
            threading.Thread(
                target=self._watch_memory, args=(max_memory_mb,), name="parl-memory", daemon=True
            ).start()

    def __repr__(self) -> str:
        return f"{self.class_name} {self.actor_id}"  # Ray's prefix of the actor's output

    def ready(self) -> tuple[int, str]:
        """The process id and host name, once Ray placed the actor."""
        return os.getpid(), socket.gethostname()

    def init(
        self, msg: m.Init, buffers: list[Any], carried: tuple[Any, ...] = ()
    ) -> m.Ready | m.Error:
        """Unpack the code bundle in a private directory, then build the instance.

        `carried`: the Ray handles of the actors whose parl handles the arguments carry (Ray
        counts this process as their holder through them); a call's request ends with them.
        """
        try:
            # Ray may end this process with SIGKILL (`ray.kill`), leaving no time to remove
            # the directory: each actor removes those of actor processes that are gone.
            sweep_dead_dirs("ray-actor")
            workdir = private_dir("ray-actor")
            atexit.register(shutil.rmtree, workdir, True)
            os.chdir(workdir)
            sys.path.insert(0, workdir)
            if msg.bundle:
                with zipfile.ZipFile(io.BytesIO(msg.bundle)) as bundle:
                    bundle.extractall(workdir)
            cls, args, kwargs = ser.loads(msg.payload, writable(buffers))
        except Exception as exc:
            text = f"the actor process could not load the class {self.class_name} or its arguments"
            return unpickling_error(0, text, exc)
        try:
            self.instance = cls(*args, **kwargs)
        except SystemExit as exc:
            self._exit(exc)
        except BaseException as exc:
            return _raised(0, f"{self.class_name}.__init__", exc)
        self.shadow = ShadowWatch(self.instance, self.methods)
        return m.Ready(actor_id=self.actor_id, pid=os.getpid(), shadowed=list(self.shadow.names))

    def call(self, request: tuple[Any, ...], *buffers: Any) -> Any:
        """Run a method, or read or write an attribute (see `_result` for the reply).

        `request` is a `Call`'s fields (then the carried handles, if any: see `init`): a
        tuple travels through Ray several times faster than the Struct would.

        Ray runs the calls of a synchronous actor one at a time, in each caller's order.
        """
        reply = self._begin(m.Call(*request[:5]), buffers)
        if isinstance(reply, _Pending):  # a coroutine method of an instance attribute
            return asyncio.new_event_loop().run_until_complete(_finish(self, reply))
        return reply

    def _begin(self, msg: m.Call, buffers: tuple[Any, ...]) -> Any:
        """Start a call: its reply, or the `_Pending` coroutine of an async method."""
        where = f"{self.class_name}.{msg.name}"
        try:
            payload = ser.loads(msg.payload, writable(buffers)) if msg.payload else (msg.args, {})
        except Exception as exc:
            text = f"the actor could not unpickle the arguments of {where}()"
            return unpickling_error(msg.id, text, exc)
        try:
            if msg.kind == m.CallKind.METHOD:
                entry = method_entry(self.instance, self.methods, msg.name)
                if entry is None:
                    return self._missing(msg)
                fn, is_async = entry
                args, kwargs = payload
                if is_async:
                    return _Pending(fn(*args, **kwargs), msg.id, where)
                result = fn(*args, **kwargs)
            elif msg.kind == m.CallKind.GETATTR:
                try:
                    result = getattr(self.instance, msg.name)
                except AttributeError:
                    return self._missing(msg)
            else:
                setattr(self.instance, msg.name, payload)
                self.methods.pop(msg.name, None)
                result = None
        except SystemExit as exc:
            self._exit(exc)
        except BaseException as exc:
            return _raised(msg.id, where, exc)
        return self.told(msg.id, _result(msg.id, where, result))

    def told(self, call_id: int, reply: Any) -> Any:
        """`reply`, as a `Result` naming the hidden methods when instance attributes hide some.

        Ray does not say which process calls, so every reply says it while any is hidden.
        """
        shadow = self.shadow
        if not (shadow.names or len(shadow.vars) != shadow.size) or isinstance(reply, m.Error):
            return reply
        names = shadow.current()
        if not names:
            return reply
        data, buffers = reply if isinstance(reply, tuple) else (reply, ())
        result = m.Result(call_id, data, shadowed=tuple(names))
        return (result, buffers) if buffers else result

    def _missing(self, msg: m.Call) -> m.Error:
        text = f"{self.class_name!r} object has no attribute {msg.name!r}"
        return m.Error(msg.id, "attribute", "AttributeError", text)

    def _exit(self, exc: SystemExit) -> None:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        self._end(f"the actor called sys.exit({code!r})", status)

    def _end(self, reason: str, status: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        put_fate(self.actor_id, reason)
        os._exit(status)

    def _watch_memory(self, max_memory_mb: float) -> None:
        import psutil

        from parl_remote.worker._actor_process import tree_rss

        process = psutil.Process()
        while True:
            rss = tree_rss(process)
            if rss > max_memory_mb * 1e6:
                self._end(
                    f"it exceeded its memory limit of {max_memory_mb:g} MB (RSS "
                    f"{rss / 1e6:.0f} MB)",
                    1,
                )
            time.sleep(_MEMORY_EVERY_S)


class AsyncRayHost(RayHost):
    """`RayHost` as an async Ray actor, for classes with `async def` methods.

    Synchronous methods run on its event loop, one at a time; `async def` methods run as
    concurrent tasks on the same loop, each started before the caller's next call.
    """

    def __init__(self, actor_id: str, class_name: str, max_memory_mb: float) -> None:
        global _in_async_actor
        _in_async_actor = True
        super().__init__(actor_id, class_name, max_memory_mb)

    async def ready(self) -> tuple[int, str]:  # type: ignore[override]  # Ray awaits it
        """The process id and host name, once Ray placed the actor."""
        return super().ready()

    async def init(  # type: ignore[override]  # Ray awaits it
        self, msg: m.Init, buffers: list[Any], carried: tuple[Any, ...] = ()
    ) -> m.Ready | m.Error:
        """Unpack the code bundle in a private directory, then build the instance."""
        return super().init(msg, buffers, carried)

    async def call(self, caller: str, request: tuple[Any, ...], *buffers: Any) -> Any:  # type: ignore[override]
        """Run a call once the caller's earlier calls have started; its reply."""
        msg = m.Call(*request[:5])
        turns = self.turns.get(caller)
        if turns is None:
            turns = self.turns[caller] = _Turns()
        if msg.id > turns.next:
            await turns.wait(msg.id)
        reply = self._begin(msg, buffers)
        turns.started(msg.id)
        if isinstance(reply, _Pending):
            return await _finish(self, reply)  # runs to its first await before anything else
        return reply


async def _finish(host: RayHost, pending: _Pending) -> Any:
    """The reply of a started `async def` call.

    A function, not a method: an async method would make every `RayHost` an async Ray actor.
    """
    try:
        result = await pending.coroutine
    except SystemExit as exc:
        host._exit(exc)
    except BaseException as exc:
        return _raised(pending.call_id, pending.where, exc)
    return host.told(pending.call_id, _result(pending.call_id, pending.where, result))


class _Pending(NamedTuple):
    """An `async def` method's call, created but not started."""

    coroutine: Any
    call_id: int
    where: str


def _raised(call_id: int, where: str, exc: BaseException) -> m.Error:
    remote_tb = ser.format_remote_traceback(exc)
    return m.Error(
        call_id, "raised", type(exc).__qualname__, str(exc), remote_tb, ser.dumps_exception(exc)
    )


def _result(call_id: int, where: str, value: Any) -> Any:
    """The reply of a call that returned `value`: its pickle, or `(pickle, buffers)`.

    With out-of-band arrays the buffers come too; a value that cannot be pickled is an
    `Error`. The caller makes the `Result` of the pickle.
    """
    try:
        data, buffers = ser.dumps(value)
    except Exception as exc:
        text = (
            f"the result of {where}() cannot be pickled: {ser.describe(value)}: "
            f"{type(exc).__name__}: {exc}"
        )
        return m.Error(call_id, "serialize", type(exc).__name__, text)
    return (data, buffers) if buffers else data
