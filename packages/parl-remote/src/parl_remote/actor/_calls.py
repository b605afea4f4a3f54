"""How an actor process runs its clients' calls: in the order they arrive, one at a time.

`CallRunner` is the half of `ActorHost` (`_host.py`) that serves `Call` messages on the
process's event loop: a synchronous method runs on the loop itself (no thread hop), an `async
def` method as a task of its own; its value or exception goes back as `Result` or `Error`. A
call that arrives alone, with nothing queued and nothing behind it (a blocking caller's), runs
at once; calls that arrive in a burst wait in a queue, and replies to quick methods in a burst
leave in one write. A result whose buffers the socket still reads from holds the next call
back until it is written, so no method changes an array that is still being sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sys
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any, ClassVar

from parl_remote._util import method_entry
from parl_remote.actor._shadow import ShadowWatch
from parl_remote.wire import _serialize as ser
from parl_remote.wire._transport import AsyncConnection, CloseHandler, MessageHandler
from parl_remote.wire.protocol import messages as m

__all__ = ["CallConnection", "CallRunner", "unpickling_error"]

logger = logging.getLogger(__name__)

_QUICK_S = 200e-6  # methods quicker than this may have their replies batched
_METHOD = m.CallKind.METHOD
_CALL, _RESULT = m.Call, m.Result
_NONE: tuple[str, ...] = ()  # no news of hidden methods
_NO_KEYWORDS: dict[str, Any] = {}  # never changed: a callee's **kwargs is a new dict


class CallRunner:
    """The calls of one actor process and their bookkeeping (see the module docstring)."""

    def __init__(self) -> None:
        self.actor_id: str | None = None
        self.class_name = "?"
        self.instance: Any = None
        self.methods: dict[str, tuple[Any, bool]] = {}
        self.shadow = ShadowWatch()
        self.calls = 0
        self.errors = 0
        self.ctl: AsyncConnection | None = None
        self._backlog: deque[Any] = deque()
        self._gated = False
        self._async_starting = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cork = False
        self._corked: set[AsyncConnection] = set()
        self._durations: dict[str, float] = {}  # per method: recent run time, slow ones sticky

    def _queue_call(self, conn: AsyncConnection, msg: m.Call, buffers: tuple[Any, ...]) -> None:
        backlog = self._backlog
        idle = not (backlog or self._gated or self._async_starting or self._corked)
        if idle and not conn.pending:
            # Nothing ahead of it, nothing behind it: what `_process` does, without the queue.
            self._call(conn, msg, buffers)
            return
        backlog.append((conn, msg, buffers))
        if len(backlog) == 1:
            self._process()

    def _process(self) -> None:
        """Run queued calls in arrival order, unless a large reply is still being written.

        Replies to calls that have more calls already received behind them are batched into one
        write (the last reply of a burst carries them all out), but only ahead of methods known
        to be quick: before a method that has been slow (or has not run yet), every batched
        reply goes out first, so no reply waits on it.
        """
        backlog = self._backlog
        try:
            while backlog and not self._gated:
                if self._async_starting:
                    # An async call arrived earlier and has not started yet: let it start first.
                    asyncio.get_running_loop().call_soon(self._process)
                    return
                conn, msg, buffers = backlog[0]
                if self._corked and self._durations.get(msg.name, 1.0) > _QUICK_S:
                    self._flush_corked()
                # More calls already received behind this one: its reply may wait for theirs.
                self._cork = len(backlog) > 1 or conn.pending
                try:
                    self._call(conn, msg, buffers)
                finally:
                    backlog.popleft()
        finally:
            self._cork = False

    def _flush_corked(self) -> None:
        corked, self._corked = self._corked, set()
        for conn in corked:
            conn.flush()

    def _method(self, name: str) -> tuple[Any, bool] | None:
        return method_entry(self.instance, self.methods, name)

    def _call(self, conn: AsyncConnection, msg: m.Call, buffers: tuple[Any, ...]) -> None:
        """Run a call now: a method (inline here: every call's path), or an attribute's."""
        if self.instance is None:
            self._send(
                conn,
                m.Error(msg.id, "error", "RuntimeError", f"actor {self.actor_id} is not built yet"),
            )
            return
        if not msg.payload and msg.kind == _METHOD:  # plain arguments, sent as themselves
            args, kwargs = msg.args, _NO_KEYWORDS
        else:
            try:
                payload = pickle.loads(msg.payload, buffers=buffers)
            except Exception as exc:
                self.errors += 1
                text = f"the actor could not unpickle the arguments of {self._where(msg.name)}()"
                self._send(conn, unpickling_error(msg.id, text, exc))
                return
            if msg.kind != _METHOD:
                self._kinds[msg.kind](self, conn, msg, payload)
                return
            args, kwargs = payload
        name = msg.name
        entry = self.methods.get(name) or self._method(name)
        if entry is None:
            self._missing(conn, msg)
            return
        fn, is_async = entry
        if is_async:
            self._start_async(conn, msg.id, name, fn, args, kwargs)
            return
        start = perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._raised(conn, msg.id, name, exc)
            return
        finally:
            took = perf_counter() - start
            durations = self._durations
            last = durations.get(name, took)
            durations[name] = took if took > _QUICK_S else 0.8 * last + 0.2 * took
        self.calls += 1
        self._reply(conn, msg.id, name, result)

    def lane_for(self, conn: AsyncConnection) -> Callable[[m.Call], None]:
        """The lane of `conn`'s small calls: a `Call` that arrived alone in its read runs here.

        A synchronous method with plain arguments, while nothing else is queued or running,
        runs at once, and a plain result goes straight back; every other call, and a call
        while others wait, takes the queue (`_queue_call`), as it would have. What it needs
        per call is looked up once, here.
        """
        methods, backlog, durations = self.methods, self._backlog, self._durations
        queue, plain, frame = self._queue_call, ser.plain, conn.proto.frame

        def lane(msg: m.Call) -> None:
            try:
                name = msg.name
                entry = methods.get(name)
                if entry is None and self.instance is not None:
                    entry = self._method(name)
                if (
                    entry is None
                    or entry[1]
                    or msg.payload
                    or msg.kind is not _METHOD
                    or backlog
                    or self._gated
                    or self._async_starting
                    or self._corked
                ):
                    queue(conn, msg, ())
                    return
                start = perf_counter()
                try:
                    result = entry[0](*msg.args)
                except BaseException as exc:
                    self._raised(conn, msg.id, name, exc)
                    return
                took = perf_counter() - start
                if took > _QUICK_S:  # a slow method's replies are never held back behind it
                    durations[name] = took
                self.calls += 1
                shadow = self.shadow
                if shadow.names or len(shadow.vars) != shadow.size or not plain(result):
                    self._reply(conn, msg.id, name, result)
                    return
                # Nothing is batched (nothing corked): the reply leaves at once, as `_send` would.
                conn.transport.write(frame(_RESULT(msg.id, b"", result)))  # type: ignore[union-attr]  # it was read from
            except Exception:
                logger.exception(
                    "closing the connection from %s after an internal error", conn.peername
                )
                conn.close()

        return lane

    def _raised(self, conn: AsyncConnection, call_id: int, name: str, exc: BaseException) -> None:
        """A method raised `exc`: its caller gets it (`SystemExit` ends the process)."""
        if isinstance(exc, SystemExit):
            self._exit_from_user(exc)
        self.calls += 1
        self.errors += 1
        self._send(conn, self._error(call_id, name, exc))

    def _where(self, name: str) -> str:
        return f"{self.class_name}.{name}"

    def _get_attribute(self, conn: AsyncConnection, msg: m.Call, _: Any) -> None:
        try:
            value = getattr(self.instance, msg.name)
        except AttributeError:
            self._missing(conn, msg)
            return
        except BaseException as exc:
            self._send(conn, self._error(msg.id, msg.name, exc))
            return
        self._reply(conn, msg.id, msg.name, value)

    def _set_attribute(self, conn: AsyncConnection, msg: m.Call, value: Any) -> None:
        try:
            setattr(self.instance, msg.name, value)
            self.methods.pop(msg.name, None)
        except BaseException as exc:
            self._send(conn, self._error(msg.id, msg.name, exc))
            return
        self._reply(conn, msg.id, msg.name, None)

    _kinds: ClassVar[dict[m.CallKind, Any]] = {  # the other kinds: methods run in `_call`
        m.CallKind.GETATTR: _get_attribute,
        m.CallKind.SETATTR: _set_attribute,
    }

    def _start_async(
        self, conn: AsyncConnection, call_id: int, name: str, fn: Any, args: Any, kwargs: Any
    ) -> None:
        self._async_starting += 1

        async def run_call() -> None:
            self._async_starting -= 1
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                self._raised(conn, call_id, name, exc)
                return
            self.calls += 1
            self._reply(conn, call_id, name, result)

        task = asyncio.get_running_loop().create_task(run_call())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _missing(self, conn: AsyncConnection, msg: m.Call) -> None:
        self.errors += 1
        text = f"{self.class_name!r} object has no attribute {msg.name!r}"
        self._send(conn, m.Error(msg.id, "attribute", "AttributeError", text))

    def _reply(self, conn: AsyncConnection, call_id: int, name: str, value: Any) -> None:
        shadow = self.shadow  # methods hidden since: news only after a change (`_shadow.py`)
        news = shadow.news(conn) if shadow.names or len(shadow.vars) != shadow.size else _NONE
        if ser.plain(value):  # sent as itself: nothing to pickle
            self._send(conn, m.Result(call_id, b"", value, news))
            return
        try:
            data, buffers = ser.dumps(value)
        except Exception as exc:
            self.errors += 1
            text = (
                f"the result of {self._where(name)}() cannot be pickled: {ser.describe(value)}: "
                f"{type(exc).__name__}: {exc}"
            )
            self._send(conn, m.Error(call_id, "serialize", type(exc).__name__, text))
            return
        self._send(conn, m.Result(call_id, data, shadowed=news), buffers)
        if (
            buffers
            and not conn.closed
            and conn.transport.get_write_buffer_size()  # type: ignore[union-attr]  # open
            and conn.proto.sends_views(buffers)
        ):
            # The reply still points into the result's memory: run nothing that could change it
            # until the kernel has it all.
            self._gated = True
            asyncio.get_running_loop().create_task(self._ungate(conn))

    async def _ungate(self, conn: AsyncConnection) -> None:
        try:
            await conn.flushed()
        except ConnectionError:
            pass
        finally:
            self._gated = False
            self._process()

    def _error(self, call_id: int, name: str, exc: BaseException) -> m.Error:
        where = self._where(name)
        remote_tb = ser.format_remote_traceback(exc)
        self._log_exception(where, remote_tb)
        return m.Error(
            call_id, "raised", type(exc).__qualname__, str(exc), remote_tb, ser.dumps_exception(exc)
        )

    def _log_exception(self, where: str, remote_tb: str) -> None:
        """Keep a raised exception in the actor's log for the dashboard (the client raises it)."""
        if self.ctl is None or self.actor_id is None:
            return
        for stream in (sys.stdout, sys.stderr):  # what it printed first comes first
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(ConnectionError):
            text = f"{where}() raised:\n{remote_tb.rstrip()}"
            self.ctl.send(m.LogLines([(self.actor_id, "exception", text)]))

    def _send(
        self, conn: AsyncConnection, msg: Any, buffers: list[Any] | tuple[Any, ...] = ()
    ) -> None:
        try:
            if self._cork and not buffers:
                conn.send(msg, batch=True)
                self._corked.add(conn)
            else:
                conn.send(msg, buffers)  # carries out whatever this connection had batched
                if self._corked:
                    self._corked.discard(conn)
        except ConnectionError:
            pass  # the caller is gone: nobody waits for it

    def _exit_from_user(self, exc: SystemExit) -> None:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if self.ctl is not None and self.actor_id is not None:
            reason = f"the actor called sys.exit({code!r})"
            try:
                self.ctl.send(m.ActorExited(self.actor_id, reason, status))
                sock = self.ctl.transport.get_extra_info("socket")  # type: ignore[union-attr]  # open
                if self.ctl.transport.get_write_buffer_size() and sock is not None:  # type: ignore[union-attr]  # open
                    sock.setblocking(True)
            except Exception:
                pass
        os._exit(status)


class CallConnection(AsyncConnection):
    """A client's connection to the actor: a read that is one whole `Call` goes to its lane.

    Every other read takes the general path of `AsyncConnection`, to `on_message`.
    """

    lane: ClassVar[bool] = True
    """Whether connections made from now on have the lane (a benchmark measures it off)."""

    def __init__(
        self,
        proto: Any,
        runner: CallRunner,
        on_message: MessageHandler,
        on_close: CloseHandler | None = None,
    ) -> None:
        super().__init__(proto, on_message, on_close, exact_flow=True)
        if not self.lane:
            return
        # The loop calls this instance's `buffer_updated`: small calls first (`lane_for`).
        self.buffer_updated = proto.dispatcher(  # type: ignore[method-assign]  # same signature
            _CALL, runner.lane_for(self), super().buffer_updated
        )


def unpickling_error(call_id: int, text: str, exc: Exception) -> m.Error:
    """The `Error` of a message whose payload could not be unpickled here."""
    return m.Error(
        call_id,
        "serialize",
        type(exc).__name__,
        f"{text}: {type(exc).__name__}: {exc}",
        ser.format_remote_traceback(exc),
    )
