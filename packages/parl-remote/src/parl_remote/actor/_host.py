"""An actor process: started warm by a worker, it becomes exactly one actor and then serves it.

Life of the process:

1. The worker starts it with a private socket pair (`--ctl-fd`) and a pipe (`--death-fd`)
   whose other end only the worker holds. It listens on a free port, says `HostReady`.
2. The worker `Assign`s it to an actor: it leaves the worker's session if told to, sets the
   environment (e.g. `CUDA_VISIBLE_DEVICES`), answers `Assigned`, and waits for the client.
   The worker tells the master (and so the client) as soon as it has sent the `Assign`: an
   `Init` that arrives first waits for it.
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
import zipfile
from typing import Any, ClassVar

from parl_remote._config import load_token, settings
from parl_remote._exceptions import ClusterError, ProtocolError
from parl_remote._loop import run
from parl_remote.actor._calls import CallConnection, CallRunner, unpickling_error
from parl_remote.actor._preload import Preloader, drop_shadowed, imported_since
from parl_remote.actor._shadow import ShadowWatch
from parl_remote.security import _tls
from parl_remote.wire import _serialize as ser
from parl_remote.wire import _shm
from parl_remote.wire._transport import AsyncConnection, SyncConnection
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import Connection

__all__ = ["ActorHost", "main"]

logger = logging.getLogger(__name__)

_STATS_EVERY_S = 1.0
_MAX_HANDSHAKES = 64


class ActorHost(CallRunner):
    """The state of one actor process (see the module docstring)."""

    def __init__(self, ctl_sock: socket.socket, host: str, token: bytes | None) -> None:
        super().__init__()
        self.ctl_sock = ctl_sock
        self.host = host
        self.token = token
        self._connections = 0
        self.preloader = Preloader(on_idle=self._preloaded)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early_init: tuple[AsyncConnection, m.Init, tuple[Any, ...]] | None = None

    async def serve(self) -> None:
        """Listen, announce readiness to the worker, and serve until the process is ended."""
        loop = self._loop = asyncio.get_running_loop()
        port = self._start_acceptor(loop)
        _warm_up(self.token)
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
            conn, lambda: CallConnection(conn.proto, self, self._on_message, closed)
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
        if msg.own_session:
            self._leave_session(conn, m.LeaveSession())
        os.environ.update(msg.env)
        self.actor_id, self.class_name = msg.actor_id, msg.class_name
        if msg.workdir:
            os.makedirs(msg.workdir, exist_ok=True)
            os.chdir(msg.workdir)
            sys.path.insert(0, msg.workdir)
        conn.send(m.Assigned(msg.actor_id))
        if self._early_init is not None:  # the client was quicker than this message
            early, self._early_init = self._early_init, None
            self._init(*early)

    def _leave_session(self, conn: AsyncConnection, msg: m.LeaveSession) -> None:
        if os.getsid(0) != os.getpid():
            with contextlib.suppress(OSError):  # a process-group leader (never started so)
                os.setsid()

    def _preload(self, conn: AsyncConnection, msg: m.Preload) -> None:
        if settings.preload and self.actor_id is None:
            self.preloader.add(msg.modules)

    def _pause_preload(self, conn: AsyncConnection, msg: m.PausePreload) -> None:
        if self.actor_id is None:
            self.preloader.pause(msg.paused)

    def _preloaded(self, done: int) -> None:
        """The preloader went through `done` names (on its thread): tell the worker."""
        loop = self._loop
        if loop is not None and self.ctl is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing: nobody to tell
                loop.call_soon_threadsafe(self.ctl.send, m.Preloaded(done))

    _ctl_handlers: ClassVar[dict[type, Any]] = {
        m.Assign: _assign,
        m.Preload: _preload,
        m.PausePreload: _pause_preload,
        m.LeaveSession: _leave_session,
    }

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

    def _init(self, conn: AsyncConnection, msg: m.Init, buffers: tuple[Any, ...]) -> None:
        if self.actor_id is None and self._early_init is None:
            self._early_init = (conn, msg, buffers)  # the worker's `Assign` is on its way
            return
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
        # No wait for a preloaded import in flight: the actor waits (on its module lock) only
        # if it imports that module too.
        self.preloader.stop()
        before = set(sys.modules)
        try:
            if msg.bundle:
                with zipfile.ZipFile(io.BytesIO(msg.bundle)) as bundle:
                    bundle.extractall(os.getcwd())
                    drop_shadowed(bundle.namelist(), ".")
            cls, args, kwargs = ser.loads(msg.payload, buffers)
        except Exception as exc:
            text = f"the actor process could not load the class {self.class_name} or its arguments"
            self._send(conn, unpickling_error(0, text, exc))
            self._report_init(ok=False)
            return
        try:
            self.instance = cls(*args, **kwargs)
        except SystemExit as exc:
            self._exit_from_user(exc)
        except BaseException as exc:
            self._send(conn, self._error(0, "__init__", exc))
            self._report_init(ok=False)
            return
        self.shadow = ShadowWatch(self.instance, self.methods)
        self.shadow.news(conn)  # told in `Ready`
        shadowed = list(self.shadow.names)
        self._send(conn, m.Ready(actor_id=self.actor_id, pid=os.getpid(), shadowed=shadowed))
        limit = settings.preload_max_modules if settings.preload else 0
        self._report_init(ok=True, imports=imported_since(before, ".", limit=limit))

    _handlers: ClassVar[dict[type, Any]] = {m.Call: CallRunner._queue_call, m.Init: _init}

    def _report_init(self, ok: bool, imports: list[str] | None = None) -> None:
        if self.ctl is not None and self.actor_id is not None:
            self.ctl.send(m.ActorInitialized(self.actor_id, ok, imports or []))


def _warm_up(token: bytes | None) -> None:
    """Do now what the first connection and `Init` would otherwise do while a client waits."""
    import encodings.cp437  # noqa: F401  # the bundle's member names decode with it

    _shm.store(token)


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
    parser = argparse.ArgumentParser(prog="python -m parl_remote.actor._host")
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
