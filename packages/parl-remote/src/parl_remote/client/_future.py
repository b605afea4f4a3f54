"""`RemoteFuture`: the pending result of a call made with `@parl.remote_class(wait=False)`.

Engine-neutral: an engine's driver settles it (`settle`, `fail`) once, and the caller takes the
result with `get()`, which the call core (`ActorCore.result`) reads.
"""

from __future__ import annotations

import threading
from typing import Any

from parl_remote._exceptions import FutureGetRepeatedlyError

__all__ = ["RemoteFuture"]


class RemoteFuture:
    """The pending result of a call made with `@parl.remote_class(wait=False)`.

    `get()` blocks until the call finished and returns its result (or raises its exception);
    the result can be taken once.
    """

    __slots__ = ("_buffers", "_done", "_error", "_name", "_ref", "_reply", "_taken")

    def __init__(self, ref: Any, name: str) -> None:
        self._ref = ref  # the actor lives at least as long as its futures
        self._name = name
        self._done = threading.Lock()
        self._done.acquire()
        self._reply: Any = None
        self._buffers: tuple[Any, ...] = ()
        self._error: BaseException | None = None
        self._taken = False

    def settle(self, reply: Any, buffers: tuple[Any, ...]) -> None:
        """The reply arrived (called by the driver, once)."""
        self._reply, self._buffers = reply, buffers
        self._done.release()

    def fail(self, error: BaseException) -> None:
        """The call failed with `error` (called by the driver, once)."""
        self._error = error
        self._done.release()

    def done(self) -> bool:
        """Whether the call finished (successfully or not)."""
        return self._reply is not None or self._error is not None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Wait for the result (at most `timeout` seconds) and return it, or raise its error.

        Raises:
            TimeoutError: not finished within `timeout` (or at once, with `block=False`);
                the call goes on, and `get` may be called again.
            FutureGetRepeatedlyError: the result was already taken by an earlier `get`.
        """
        core = self._ref.core
        if self._taken:
            raise FutureGetRepeatedlyError(
                f"the result of {core.class_name}.{self._name}() was already taken by get(); "
                "keep the value from the first call"
            )
        if not self._done.acquire(block, -1 if timeout is None or not block else timeout):
            raise self._unfinished(block, timeout)
        self._taken = True
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
