"""An actor process: started warm by a worker, it becomes exactly one actor and then serves it.

Life of the process:

1. The worker starts it with a private socket pair (`--ctl-fd`) and a pipe (`--death-fd`)
   whose other end only the worker holds. It listens on a free port, says `HostReady`.
2. The worker `Assign`s it to an actor: it sets the environment (e.g. `CUDA_VISIBLE_DEVICES`),
   answers `Assigned`, and waits for the client.
3. The client connects straight here (authenticated with the cluster token) and sends `Init`:
   the code bundle is unpacked into the actor's working directory, the class and arguments
   are unpickled and the instance is built.
4. Calls run in the order they arrive. Synchronous methods run on the event loop itself, so a
   call costs no thread hop; `async def` methods run as concurrent tasks on the same loop.
   Liveness never depends on user code returning: the worker watches the process, not the loop.

The process exits when the worker kills it (the actor is freed), when the worker dies (the
pipe reaches end-of-file; a thread notices even while a long method runs), or when user code
calls `sys.exit` (the worker is told why first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import socket
import sys
import threading
import time
import zipfile
from collections import deque
from typing import Any, ClassVar

from parl_remote import _serialize as ser
from parl_remote import _tls
from parl_remote._config import load_token, settings
from parl_remote._exceptions import ClusterError, ProtocolError
from parl_remote._loop import run
from parl_remote._preload import Preloader, drop_shadowed, imported_since
from parl_remote._transport import AsyncConnection, SyncConnection
from parl_remote._util import method_entry
from parl_remote.protocol import messages as m
from parl_remote.protocol.connection import Connection

__all__ = ["ActorHost", "main"]

logger = logging.getLogger(__name__)

_STATS_EVERY_S = 1.0
_MAX_HANDSHAKES = 64
_QUICK_S = 200e-6  # methods quicker than this may have their replies batched


class ActorHost:
    """The state of one actor process (see the module docstring)."""

    def __init__(self, ctl_sock: socket.socket, host: str, token: bytes | None) -> None:
        self.ctl_sock = ctl_sock
        self.host = host
        self.token = token
        self.actor_id: str | None = None
        self.class_name = "?"
        self.instance: Any = None
        self.methods: dict[str, tuple[Any, bool]] = {}
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
        self._connections = 0
        self.preloader = Preloader()

    async def serve(self) -> None:
        """Listen, announce readiness to the worker, and serve until the process is ended."""
        loop = asyncio.get_running_loop()
        port = self._start_acceptor(loop)
        _, self.ctl = await loop.create_connection(
            lambda: AsyncConnection(
                Connection("actor", is_server=False, token=None, trusted=True),
                self._on_ctl,
                self._on_ctl_closed,
            ),
            sock=self.ctl_sock,
        )
        self.ctl.send(m.HostReady(port=port, pid=os.getpid()))
        loop.call_later(_STATS_EVERY_S, self._report_stats)
        await asyncio.Event().wait()  # runs until the process is ended

    def _start_acceptor(self, loop: asyncio.AbstractEventLoop) -> int:
        """Accept and authenticate clients on threads of their own.

        A synchronous method runs on the event loop and may hold it for minutes; a client that
        connects meanwhile (another thread of the caller) must still get through the handshake,
        or it would take the actor for dead. Its calls then wait in line, as they should.
        """
        listener = socket.create_server((self.host, 0), backlog=128)
        handshakes = threading.BoundedSemaphore(_MAX_HANDSHAKES)

        def handshake(sock: socket.socket, peer: Any) -> None:
            try:
                conn = SyncConnection.accept(sock, token=self.token, role="actor")
            except (OSError, ClusterError) as exc:
                logger.warning("refused a connection from %s: %s", peer, exc)
                return
            finally:
                handshakes.release()
            loop.call_soon_threadsafe(self._adopt, conn)

        def accept_forever() -> None:
            while True:
                try:
                    sock, peer = listener.accept()
                except OSError:  # pragma: no cover - the listener is never closed
                    return
                if not handshakes.acquire(blocking=False):
                    sock.close()  # too many handshakes in progress: refuse, do not queue
                    continue
                threading.Thread(target=handshake, args=(sock, peer), daemon=True).start()

        threading.Thread(target=accept_forever, name="parl-accept", daemon=True).start()
        port: int = listener.getsockname()[1]
        return port

    def _adopt(self, conn: SyncConnection) -> None:
        """Serve an authenticated connection on the event loop."""
        loop = asyncio.get_running_loop()
        if self._connections >= settings.max_connections:
            conn.close()
            return
        self._connections += 1

        def closed(c: AsyncConnection, exc: Exception | None) -> None:
            self._connections -= 1

        sock, factory = _tls.adopt(  # a TLS connection moves with its session
            conn, lambda: AsyncConnection(conn.proto, self._on_message, closed, exact_flow=True)
        )
        task = loop.create_task(loop.connect_accepted_socket(factory, sock))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the worker's channel ------------------------------------------------------------------
    def _on_ctl(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        handler = self._ctl_handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(
                f"an actor process does not take {type(msg).__name__} from its worker"
            )
        handler(self, conn, msg)

    def _assign(self, conn: AsyncConnection, msg: m.Assign) -> None:
        if self.actor_id is not None:
            raise ProtocolError(
                f"an actor process of actor {self.actor_id} does not take a second Assign"
            )
        self.preloader.stop()
        os.environ.update(msg.env)
        self.actor_id, self.class_name = msg.actor_id, msg.class_name
        if msg.workdir:
            os.makedirs(msg.workdir, exist_ok=True)
            os.chdir(msg.workdir)
            sys.path.insert(0, msg.workdir)
        conn.send(m.Assigned(msg.actor_id))

    def _preload(self, conn: AsyncConnection, msg: m.Preload) -> None:
        if settings.preload and self.actor_id is None:
            self.preloader.add(msg.modules)

    _ctl_handlers: ClassVar[dict[type, Any]] = {m.Assign: _assign, m.Preload: _preload}

    def _on_ctl_closed(self, conn: AsyncConnection, exc: Exception | None) -> None:
        os._exit(1)  # the worker is gone: so is every actor it ran

    def _report_stats(self) -> None:
        """Tell the worker the counters, every second.

        No report at all means a synchronous method holds the loop: the worker calls that busy.
        """
        if self.actor_id is not None and self.ctl is not None:
            busy = bool(self._tasks)  # async methods in flight
            self.ctl.send(m.ActorStats(self.actor_id, 0.0, 0, self.calls, self.errors, busy))
        asyncio.get_running_loop().call_later(_STATS_EVERY_S, self._report_stats)

    # -- clients -------------------------------------------------------------------------------
    def _on_message(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"an actor process does not take {type(msg).__name__}")
        handler(self, conn, msg, buffers)

    def _queue_call(self, conn: AsyncConnection, msg: m.Call, buffers: tuple[Any, ...]) -> None:
        self._backlog.append((conn, msg, buffers))
        if len(self._backlog) == 1:
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
                self._cork = len(backlog) > 1 or conn.more_pending
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

    def _init(self, conn: AsyncConnection, msg: m.Init, buffers: tuple[Any, ...]) -> None:
        if self.actor_id is None or msg.actor_id != self.actor_id:
            self._send(
                conn,
                m.Error(0, "error", "RuntimeError", f"this process is not actor {msg.actor_id}"),
            )
            conn.close()
            return
        if self.instance is not None:
            self._send(
                conn, m.Error(0, "error", "RuntimeError", f"actor {msg.actor_id} is already built")
            )
            return
        self.preloader.finish(settings.connect_timeout_s)  # no import races the actor's own
        before = set(sys.modules)
        try:
            if msg.bundle:
                with zipfile.ZipFile(io.BytesIO(msg.bundle)) as bundle:
                    bundle.extractall(os.getcwd())
                    drop_shadowed(bundle.namelist(), ".")
            cls, args, kwargs = ser.loads(msg.payload, buffers)
        except Exception as exc:
            text = f"the actor process could not load the class {self.class_name} or its arguments"
            self._send(conn, _unpickling_error(0, text, exc))
            self._report_init(ok=False)
            return
        try:
            self.instance = cls(*args, **kwargs)
        except SystemExit as exc:
            self._exit_from_user(exc)
        except BaseException as exc:
            self._send(conn, self._error(0, f"{self.class_name}.__init__", exc))
            self._report_init(ok=False)
            return
        shadowed = [n for n in getattr(self.instance, "__dict__", ()) if hasattr(cls, n)]
        self._send(conn, m.Ready(actor_id=self.actor_id, pid=os.getpid(), shadowed=shadowed))
        limit = settings.preload_max_modules if settings.preload else 0
        self._report_init(ok=True, imports=imported_since(before, ".", limit=limit))

    _handlers: ClassVar[dict[type, Any]] = {m.Call: _queue_call, m.Init: _init}

    def _report_init(self, ok: bool, imports: list[str] | None = None) -> None:
        if self.ctl is not None and self.actor_id is not None:
            self.ctl.send(m.ActorInitialized(self.actor_id, ok, imports or []))

    def _method(self, name: str) -> tuple[Any, bool] | None:
        return method_entry(self.instance, self.methods, name)

    def _call(self, conn: AsyncConnection, msg: m.Call, buffers: tuple[Any, ...]) -> None:
        where = f"{self.class_name}.{msg.name}"
        if self.instance is None:
            self._send(
                conn,
                m.Error(msg.id, "error", "RuntimeError", f"actor {self.actor_id} is not built yet"),
            )
            return
        try:
            payload = ser.loads(msg.payload, buffers)
        except Exception as exc:
            self.errors += 1
            text = f"the actor could not unpickle the arguments of {where}()"
            self._send(conn, _unpickling_error(msg.id, text, exc))
            return
        self._kinds[msg.kind](self, conn, msg, where, payload)

    def _run_method(self, conn: AsyncConnection, msg: m.Call, where: str, payload: Any) -> None:
        entry = self._method(msg.name)
        if entry is None:
            self._missing(conn, msg)
            return
        fn, is_async = entry
        args, kwargs = payload
        if is_async:
            self._start_async(conn, msg.id, where, fn, args, kwargs)
            return
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except SystemExit as exc:
            self._exit_from_user(exc)
        except BaseException as exc:
            self.calls += 1
            self.errors += 1
            self._send(conn, self._error(msg.id, where, exc))
            return
        finally:
            took = time.perf_counter() - start
            last = self._durations.get(msg.name, took)
            self._durations[msg.name] = took if took > _QUICK_S else 0.8 * last + 0.2 * took
        self.calls += 1
        self._reply(conn, msg.id, where, result)

    def _get_attribute(self, conn: AsyncConnection, msg: m.Call, where: str, _: Any) -> None:
        try:
            value = getattr(self.instance, msg.name)
        except AttributeError:
            self._missing(conn, msg)
            return
        except BaseException as exc:
            self._send(conn, self._error(msg.id, where, exc))
            return
        self._reply(conn, msg.id, where, value)

    def _set_attribute(self, conn: AsyncConnection, msg: m.Call, where: str, value: Any) -> None:
        try:
            setattr(self.instance, msg.name, value)
            self.methods.pop(msg.name, None)
        except BaseException as exc:
            self._send(conn, self._error(msg.id, where, exc))
            return
        self._reply(conn, msg.id, where, None)

    _kinds: ClassVar[dict[m.CallKind, Any]] = {
        m.CallKind.METHOD: _run_method,
        m.CallKind.GETATTR: _get_attribute,
        m.CallKind.SETATTR: _set_attribute,
    }

    def _start_async(
        self, conn: AsyncConnection, call_id: int, where: str, fn: Any, args: Any, kwargs: Any
    ) -> None:
        self._async_starting += 1

        async def run_call() -> None:
            self._async_starting -= 1
            try:
                result = await fn(*args, **kwargs)
            except SystemExit as exc:
                self._exit_from_user(exc)
            except BaseException as exc:
                self.calls += 1
                self.errors += 1
                self._send(conn, self._error(call_id, where, exc))
                return
            self.calls += 1
            self._reply(conn, call_id, where, result)

        task = asyncio.get_running_loop().create_task(run_call())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _missing(self, conn: AsyncConnection, msg: m.Call) -> None:
        self.errors += 1
        text = f"{self.class_name!r} object has no attribute {msg.name!r}"
        self._send(conn, m.Error(msg.id, "attribute", "AttributeError", text))

    def _reply(self, conn: AsyncConnection, call_id: int, where: str, value: Any) -> None:
        try:
            data, buffers = ser.dumps(value)
        except Exception as exc:
            self.errors += 1
            text = (
                f"the result of {where}() cannot be pickled: {ser.describe(value)}: "
                f"{type(exc).__name__}: {exc}"
            )
            self._send(conn, m.Error(call_id, "serialize", type(exc).__name__, text))
            return
        self._send(conn, m.Result(call_id, data), buffers)
        if buffers and not conn.closed and conn.transport.get_write_buffer_size():  # type: ignore[union-attr]  # open
            if conn.proto.shm is not None and conn.proto.shm.took(buffers):
                return  # into a segment, or copied when none was free: nothing points into them
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

    def _error(self, call_id: int, where: str, exc: BaseException) -> m.Error:
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
        with contextlib.suppress(ConnectionError):  # the caller is gone: nobody waits for it
            if self._cork and not buffers:
                conn.send(msg, batch=True)
                self._corked.add(conn)
            else:
                conn.send(msg, buffers)  # carries out whatever this connection had batched
                self._corked.discard(conn)

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


def _unpickling_error(call_id: int, text: str, exc: Exception) -> m.Error:
    return m.Error(
        call_id,
        "serialize",
        type(exc).__name__,
        f"{text}: {type(exc).__name__}: {exc}",
        ser.format_remote_traceback(exc),
    )


def _watch_worker(death_fd: int) -> None:
    """Exit as soon as the worker dies, even while a long method holds the event loop."""

    def watch() -> None:
        try:
            while os.read(death_fd, 1):
                pass
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=watch, name="parl-worker-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Entry point of an actor process (started by a worker, never by hand)."""
    parser = argparse.ArgumentParser(prog="python -m parl_remote._actor_host")
    parser.add_argument("--ctl-fd", type=int, required=True)
    parser.add_argument("--death-fd", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    # `python -m` put the worker's working directory first on sys.path; the actor's own
    # directory (with the client's code) goes there once assigned.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)
    _watch_worker(args.death_fd)
    ctl_sock = socket.socket(fileno=args.ctl_fd)
    host = ActorHost(ctl_sock, args.host, load_token())
    run(host.serve())


if __name__ == "__main__":
    main()
