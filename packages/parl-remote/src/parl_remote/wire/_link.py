"""A process's link to the master, kept alive: what clients and workers share.

`MasterLink` connects and registers (waiting for `Accepted`), sends a heartbeat every
`PARL_HEARTBEAT_S`, and treats a master silent for `PARL_HEARTBEAT_TIMEOUT_S` as lost (the
master pings back, so a link that stopped forwarding is noticed even though TCP still looks
open). Once lost it retries every second until it is back, or until `give_up_after` seconds
have passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from parl_remote._config import settings
from parl_remote._exceptions import AuthenticationError, ClusterError, ProtocolError
from parl_remote.wire._transport import AsyncConnection, open_async
from parl_remote.wire.protocol import messages as m

__all__ = ["MasterLink"]

logger = logging.getLogger(__name__)


class MasterLink:
    """The connection of a client or worker to the master (see the module docstring).

    Args:
        host: the master's host.
        port: the master's port.
        token: the cluster token.
        role: "client" or "worker", as told to the master.
        registration: builds the registration message from the new connection (at every
            (re)connection).
        heartbeat: builds the heartbeat message.
        on_message: receives every message but `Ping` and `Accepted`.
        on_connected: called with the connection once registered.
        on_disconnected: called when the connection closes.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: bytes | None,
        role: str,
        registration: Callable[[AsyncConnection], Any],
        heartbeat: Callable[[], Any],
        on_message: Callable[[AsyncConnection, Any, tuple[Any, ...]], None],
        on_connected: Callable[[AsyncConnection], None] | None = None,
        on_disconnected: Callable[[], None] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.token = token
        self.role = role
        self.registration = registration
        self.heartbeat = heartbeat
        self.on_message = on_message
        self.on_connected = on_connected
        self.on_disconnected = on_disconnected
        self.conn: AsyncConnection | None = None
        self._accepted: asyncio.Future[Any] | None = None
        self._last_heard = 0.0

    @property
    def address(self) -> str:
        """The master's HOST:PORT."""
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        """Whether the link is up right now."""
        return self.conn is not None and not self.conn.closed

    def send(self, msg: Any) -> bool:
        """Send if connected; return whether it was sent."""
        conn = self.conn
        if conn is None or conn.closed:
            return False
        try:
            conn.send(msg)
        except ConnectionError:
            return False
        return True

    async def connect(self) -> AsyncConnection:
        """Connect, register and wait for `Accepted` (raises on any failure)."""
        self._accepted = asyncio.get_running_loop().create_future()
        conn = await open_async(
            self.host,
            self.port,
            token=self.token,
            role=self.role,
            on_message=self._on_message,
            on_close=self._on_close,
            expect="master",
        )
        try:
            conn.send(self.registration(conn))
            await asyncio.wait_for(self._accepted, settings.connect_timeout_s)
        except BaseException:
            conn.close()
            raise
        self._last_heard = time.monotonic()
        self.conn = conn
        if self.on_connected is not None:
            self.on_connected(conn)
        return conn

    async def maintain(self, give_up_after: float | None = None) -> str:
        """Heartbeat and reconnect forever; return why it gave up (grace over, refused)."""
        lost_since: float | None = None
        while True:
            conn = self.conn
            if conn is not None and not conn.closed:
                silent = time.monotonic() - self._last_heard
                if silent > settings.heartbeat_timeout_s:
                    logger.warning(
                        "no word from the PARL master at %s for %.0f s", self.address, silent
                    )
                    conn.close()
                    continue
                with contextlib.suppress(ConnectionError):
                    conn.send(self.heartbeat())
                await asyncio.sleep(settings.heartbeat_s)
                continue
            self.conn = None
            now = time.monotonic()
            if lost_since is None:
                lost_since = now
                logger.warning("lost the PARL master at %s; reconnecting", self.address)
            if give_up_after is not None and now - lost_since > give_up_after:
                return (
                    f"the master at {self.address} did not come back within {give_up_after:.0f} s"
                )
            try:
                await self.connect()
            except AuthenticationError as exc:
                return f"the master at {self.address} refused us: {exc}"
            except (OSError, ClusterError, ProtocolError, TimeoutError):
                await asyncio.sleep(min(1.0, settings.heartbeat_s))
                continue
            logger.warning("reconnected to the PARL master at %s", self.address)
            lost_since = None

    def _on_message(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        self._last_heard = time.monotonic()
        if isinstance(msg, m.Ping):
            return
        if isinstance(msg, m.Accepted):
            if self._accepted is not None and not self._accepted.done():
                self._accepted.set_result(msg)
            return
        self.on_message(conn, msg, buffers)

    def _on_close(self, conn: AsyncConnection, exc: Exception | None) -> None:
        if self.conn is conn:
            self.conn = None
        if self.on_disconnected is not None:
            self.on_disconnected()
