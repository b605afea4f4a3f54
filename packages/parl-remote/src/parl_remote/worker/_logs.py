"""What a worker's actor processes print, on its way to the master.

`ActorLogs` reads each actor process's stdout and stderr line by line (`read`), keeps the lines
of processes that run an actor (a warm process's lines go to the worker's own log), and sends
them to the master in batches, at most `_FLUSH_S` after the first of a batch. While the master
is away the lines wait, up to `_BACKLOG` of them (the oldest go first), and leave once it is
back (`schedule`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

from parl_remote.wire._link import MasterLink
from parl_remote.wire.protocol import messages as m
from parl_remote.worker._actor_process import ActorProcess

__all__ = ["ActorLogs"]

logger = logging.getLogger(__name__)

_FLUSH_S = 0.05
_BACKLOG = 100_000


class ActorLogs:
    """Lines of a worker's actors, batched to the master (see the module docstring).

    Args:
        link: the worker's link to the master.
    """

    def __init__(self, link: MasterLink) -> None:
        self.link = link
        self.lines: deque[tuple[str, str, str]] = deque(maxlen=_BACKLOG)
        self._flush: asyncio.TimerHandle | None = None

    async def read(self, host: ActorProcess, stream: asyncio.StreamReader, name: str) -> None:
        """Read one output stream of `host` until it closes."""
        while True:
            try:
                raw = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raw = await stream.read(1 << 16)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if host.actor_id is None:
                logger.info("[warm process %s %s] %s", host.proc.pid, name, line)
                continue
            self.lines.append((host.actor_id, name, line))
            self.schedule()

    def extend(self, lines: Iterable[tuple[str, str, str]]) -> None:
        """Add `(actor_id, stream, text)` lines and send them soon."""
        self.lines.extend(lines)
        self.schedule()

    def schedule(self) -> None:
        """Send the waiting lines within `_FLUSH_S` (if any wait)."""
        if self._flush is None and self.lines:
            self._flush = asyncio.get_running_loop().call_later(_FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send the waiting lines now, if the master is there."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self.lines and self.link.connected:
            lines: list[Any] = list(self.lines)
            self.lines.clear()
            self.link.send(m.LogLines(lines))
