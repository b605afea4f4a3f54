"""`RemoteFuture`: the pending result of a call made with `@parl.remote_class(wait=False)`.

Engine-neutral: an engine's driver settles it (`settle`, `fail`) once, and the caller takes the
result with `get()`, which the call core (`ActorCore.result`) reads. A future holds no lock of
its own: a `get()` that has to wait makes one then (`_waiter`). A call in flight is then one
object the garbage collector tracks, not two; with many calls in flight in a process that
holds many objects (torch's, once imported), each of them pushed towards the oldest generation
brings a full collection, which walks every object of the process, that much nearer.
"""

from __future__ import annotations

import threading
from typing import Any

from parl_remote._exceptions import FutureGetRepeatedlyError

__all__ = ["RemoteFuture"]

_waiting = threading.Lock()
"""Guards each future's `_finished` and `_waiter` between the thread that settles it and one
that waits for it."""


class RemoteFuture:
    """The pending result of a call made with `@parl.remote_class(wait=False)`.

    `get()` blocks until the call finished and returns its result (or raises its exception);
    the result can be taken once.
    """

    __slots__ = (
        "_buffers",
        "_error",
        "_finished",
        "_name",
        "_ref",
        "_reply",
        "_taken",
        "_waiter",
    )

    def __init__(self, ref: Any, name: str) -> None:
        self._ref = ref  # the actor lives at least as long as its futures
        self._name = name
        self._reply: Any = None
        self._buffers: tuple[Any, ...] = ()
        self._error: BaseException | None = None
        self._taken = False
        self._finished = False
        self._waiter: Any = None  # a lock, held until the call finishes, once a get() waits

    def settle(self, reply: Any, buffers: tuple[Any, ...]) -> None:
        """The reply arrived (called by the driver, once)."""
        self._reply, self._buffers = reply, buffers
        self._finish()

    def fail(self, error: BaseException) -> None:
        """The call failed with `error` (called by the driver, once)."""
        self._error = error
        self._finish()

    def _finish(self) -> None:
        with _waiting:
            self._finished = True
            waiter = self._waiter
        if waiter is not None:
            waiter.release()

    def _wait(self, block: bool, timeout: float | None) -> bool:
        """Whether the call finished, waiting for it (at most `timeout` s) with `block`."""
        if self._finished:
            return True
        if not block:
            return False
        with _waiting:
            if self._finished:
                return True
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = threading.Lock()
                waiter.acquire()
        if not waiter.acquire(True, -1 if timeout is None else timeout):
            return False
        waiter.release()  # for any other thread waiting on it
        return True

    def done(self) -> bool:
        """Whether the call finished (successfully or not)."""
        return self._finished

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Wait for the result (at most `timeout` seconds) and return it, or raise its error.

        Raises:
            TimeoutError: not finished within `timeout` (or at once, with `block=False`);
                the call goes on, and `get` may be called again.
            FutureGetRepeatedlyError: the result was already taken by an earlier `get`.
        """
        core = self._ref.core
        if not self._taken and not self._wait(block, timeout):
            raise self._unfinished(block, timeout)
        with _waiting:  # one of the threads that waited takes it
            taken, self._taken = self._taken, True
        if taken:
            raise FutureGetRepeatedlyError(
                f"the result of {core.class_name}.{self._name}() was already taken by get(); "
                "keep the value from the first call"
            )
        if self._error is not None:
            raise self._error
        reply, buffers = self._reply, self._buffers
        self._reply, self._buffers = True, ()  # drop the payload: it is the caller's now
        return core.result(reply, buffers, self._name)

    def _unfinished(self, block: bool, timeout: float | None) -> TimeoutError:
        return TimeoutError(
            f"{self._ref.core.class_name}.{self._name}() has not finished"
            + (f" within {timeout:g} s" if block and timeout is not None else " yet")
        )

    def get_nowait(self) -> Any:
        """`get(block=False)`: the result if the call finished, else TimeoutError."""
        return self.get(block=False)
