"""An xparl actor's shared reference: its class spec, its call core and its drivers.

Every handle of one actor (blocking, awaitable, a bound method, a call in flight) holds the same
`_ActorRef`: the I/O-free `ActorCore` (call ids, the actor's fate), the blocking driver, and a
pipelined driver per event loop that used it. When the last holder goes, the ref's finalizer
closes its connections and tells the client to free the actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from typing import Any

from parl_remote.client._call_core import ActorCore
from parl_remote.client._future import RemoteFuture
from parl_remote.client._spec import _ClassSpec, _running_loop
from parl_remote.engines.xparl._drivers import BlockingDriver, ClientView, PipelinedDriver
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import Held, hold

__all__: list[str] = []


class _ActorRef:
    """One actor as all its handles share it: its call core and drivers, freed with the last."""

    def __init__(self, client: ClientView, spec: _ClassSpec, assigned: m.ActorAssigned) -> None:
        self.client = client
        self.spec = spec
        self.class_name = spec.name
        self.actor_id = assigned.actor_id
        self.host, self.port, self.pid = assigned.host, assigned.port, assigned.pid
        self.core = ActorCore(spec.name, assigned)
        self.blocking = BlockingDriver(self.core, client)
        self.drivers: dict[asyncio.AbstractEventLoop, PipelinedDriver] = {}  # one per loop
        self.lock = threading.Lock()
        self.shadowed: tuple[str, ...] = ()  # methods hidden by instance attributes
        client.refs[self.actor_id] = self
        self.release = weakref.finalize(
            self, _release, client, self.actor_id, self.blocking, self.drivers, self.lock
        )

    def __repr__(self) -> str:
        return repr(self.core)

    def where(self) -> tuple[Any, ...]:
        """What names this actor to another process (`XparlClient.adopt` there)."""
        return (self.host, self.port, self.pid, self.client.address)

    def abandon(self) -> tuple[Any, ...]:
        """In a child made by `fork`: set the parent's connections aside, unclosed; return them.

        Later calls from the child open connections of its own.
        """
        self.release.detach()
        old = (self.blocking, dict(self.drivers))
        self.drivers.clear()
        self.lock = threading.Lock()
        self.blocking = BlockingDriver(self.core, self.client)
        return old

    def mark_dead(self, reason: str) -> None:
        """The actor is gone: wake every waiting call (called from the client's loop)."""
        self.core.mark_dead(reason)
        self.close_connections(wake_only=True)

    def close_connections(self, wake_only: bool = False) -> None:
        """Close every connection to the actor (or only wake the calls waiting on them)."""
        _close_all(self.blocking, self.drivers, self.lock, wake_only)

    def pipelined(self, loop: asyncio.AbstractEventLoop) -> PipelinedDriver:
        """The pipelined driver of `loop` (the running one), made on first use."""
        driver = self.drivers.get(loop)
        if driver is None:
            with self.lock:
                for old in [lp for lp in self.drivers if lp.is_closed()]:
                    del self.drivers[old]
                driver = PipelinedDriver(self.core, self.client, self, self.drivers, self.lock)
                self.drivers[loop] = driver
        return driver

    def acall(
        self, kind: m.CallKind, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """An awaitable call, sent now on the running loop's pipelined connection."""
        loop = _running_loop(self.class_name, name)
        return self.pipelined(loop).acall(kind, name, args, kwargs)

    def call_future(
        self, kind: m.CallKind, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RemoteFuture:
        """A future-mode call: sent in order on the client's loop, waited for with `get()`."""
        future = RemoteFuture(self, name)
        if self.core.dead is not None:
            future.fail(self.core.died_error())
            return future
        msg, buffers = self.core.call(kind, name, args, kwargs)
        held = None
        if buffers:
            with self.lock:
                driver = self.drivers.get(self.client.loop)
            # It leaves later, from the client's loop: its arrays are held now, for the
            # connection open now (the driver's to decide), so that the caller may change them.
            held = driver.hold(buffers) if driver is not None else hold(None, buffers)
        # (a function, not a bound method: a call queued is as few objects as it can be)
        self.client.run_soon(_submit, self, msg, held, future)
        return future


def _submit(ref: _ActorRef, msg: m.Call, held: Held | None, future: RemoteFuture) -> None:
    """A future-mode call sent, on the client's loop."""
    driver = ref.pipelined(ref.client.loop)
    if held is None:
        driver.submit(msg, [], future)
    else:
        driver.submit_held(msg, held, future)


def _close_all(
    blocking: BlockingDriver,
    drivers: dict[asyncio.AbstractEventLoop, PipelinedDriver],
    lock: threading.Lock,
    wake_only: bool = False,
) -> None:
    blocking.close(wake_only=wake_only)
    with lock:
        now = list(drivers.items())
    for loop, driver in now:
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                loop.call_soon_threadsafe(driver.close)


def _release(
    client: ClientView,
    actor_id: str,
    blocking: BlockingDriver,
    drivers: dict[asyncio.AbstractEventLoop, PipelinedDriver],
    lock: threading.Lock,
) -> None:
    """Finalizer of an `_ActorRef`: close its connections and free the actor."""
    _close_all(blocking, drivers, lock)
    client.release(actor_id)
