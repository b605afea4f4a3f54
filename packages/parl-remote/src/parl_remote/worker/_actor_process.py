"""The worker's view of one actor process: how it is started, described and measured.

An actor process (`actor/_host`) starts warm, without an actor, in a session of its own (or,
for a worker in its client's session, in the worker's until its `Assign`), with a control
socket and a death pipe shared with its worker (`spawn_host`); `ActorProcess` holds what the
worker knows of it. The worker (`_worker`) drives them; this module only starts one,
turns one into the records it reports to the master (`record`, `stats`), measures its memory
(`tree_rss`), and paces the warm processes' preloading (`PreloadPacer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from parl_remote.wire._transport import AsyncConnection
from parl_remote.wire.protocol import messages as m
from parl_remote.worker import _priority

__all__ = ["ActorProcess", "PreloadPacer", "spawn_host", "tree_rss"]

logger = logging.getLogger(__name__)

_BUSY_AFTER_S = 2.5  # an actor process silent this long is inside a synchronous method


@dataclass(eq=False)
class ActorProcess:
    """One actor process: warm (no actor yet) or running an actor."""

    proc: asyncio.subprocess.Process
    death_w: int
    ready: asyncio.Future[Any]
    ctl: AsyncConnection | None = None
    port: int = 0
    actor_id: str | None = None
    client_id: str = ""
    class_name: str = ""
    gpus: list[str] = field(default_factory=list)
    max_memory_mb: float = 0.0
    started_at: float = 0.0
    workdir: str = ""
    exit_reason: str | None = None
    assigned: asyncio.Future[Any] | None = None
    calls: int = 0
    errors: int = 0
    busy: bool = False
    last_stats: float = field(default_factory=time.monotonic)
    ps: psutil.Process | None = None
    readers: list[asyncio.Task[Any]] = field(default_factory=list)
    ready_at: float = 0.0
    """When it said `HostReady` (monotonic)."""
    preload_sent: int = 0
    """Module names the worker sent it to preload."""
    preload_done: int = 0
    """How many of them it has gone through (`Preloaded`)."""
    built: bool = False
    """Whether its actor's constructor has returned (`ActorInitialized`)."""
    preload_paused: bool = False
    """Whether the worker told it to hold its preloading (`PausePreload`)."""
    in_worker_session: bool = False
    """Whether its actor runs in the worker's session (`keeps_session`)."""
    nice: int = 0
    """The autogroup nice value its worker gave its session (`set_nice`): above 0 while warm
    and preloading at a low CPU share, 0 again before it takes an actor."""

    @property
    def warm(self) -> bool:
        """Ready for an actor, and not running one."""
        return self.actor_id is None and self.ready.done() and self.exit_reason is None

    @property
    def preloading(self) -> bool:
        """Warm, with names it was sent to import and has not gone through (or holds)."""
        return self.warm and self.preload_done < self.preload_sent

    def tell(self, msg: Any) -> None:
        """Send it `msg` on its control socket, if it still has one."""
        if self.ctl is not None:
            with contextlib.suppress(ConnectionError):
                self.ctl.send(msg)

    def set_nice(self, nice: int) -> bool:
        """Give its session the autogroup nice value `nice` (`_priority`); whether it took."""
        if _priority.set_nice(self.proc.pid, nice):
            self.nice = nice
            return True
        return False

    def keeps_session(self, hosts: Iterable[ActorProcess]) -> bool:
        """Whether this process, just assigned, stays in its worker's session (the client's).

        Only while it is the worker's one actor: a blocking call to it then waits for one
        session's turn on a busy machine, not two. With a second actor, every actor takes a
        session of its own (autogroup shares CPU between sessions; one in a method leaves once
        the method returns).
        """
        others = [h for h in hosts if h.actor_id and h.exit_reason is None and h is not self]
        for other in others:
            if other.in_worker_session:
                other.tell(m.LeaveSession())
                other.in_worker_session = False
        self.in_worker_session = not others
        return self.in_worker_session

    def warmth(self) -> tuple[bool, int, float]:
        """Sorts the warm processes best first: the most preloaded, then the longest warm.

        One importing comes last whatever it has: its actor may meet the import in flight.
        """
        return self.preload_done < self.preload_sent, -self.preload_done, self.ready_at

    def record(self) -> m.ActorRecord:
        """The actor it runs, as the worker re-registers it with a master."""
        return m.ActorRecord(
            actor_id=self.actor_id or "",
            client_id=self.client_id,
            class_name=self.class_name,
            port=self.port,
            pid=self.proc.pid,
            gpus=self.gpus,
            max_memory_mb=self.max_memory_mb,
            started_at=self.started_at,
        )

    def stats(self) -> m.ActorStats | None:
        """Its actor's load for the worker's heartbeat; None without an actor or a process."""
        if self.actor_id is None or self.ps is None:
            return None
        try:
            cpu = self.ps.cpu_percent(None)
            rss = tree_rss(self.ps)
        except psutil.Error:
            return None
        # A host reports every second unless a synchronous method holds its loop.
        busy = self.busy or time.monotonic() - self.last_stats > _BUSY_AFTER_S
        return m.ActorStats(self.actor_id, cpu, rss, self.calls, self.errors, busy)


class PreloadPacer:
    """Has one warm process at a time import the preload set, while the actors let it.

    One at a time: the other warm processes stay free of imports in flight, for actors that
    need none of them, and preloading takes one CPU at most. The set goes out in chunks of
    `CHUNK` names, each to the warm process that has had the fewest (then the longest warm):
    what the first actors imported reaches every warm process before what later ones did.
    With `nice` above 0 (where a session's autogroup shares the CPUs, `_priority`), while the
    worker's actors keep the CPUs busy the process importing has its session's autogroup at
    that nice value: it imports on at a low CPU share, and is ready when one of them dies
    (while they are quiet, it has the normal share); its worker sets the value back to 0
    before the process takes an actor. With `nice` 0 (no autogroup here), the process
    importing holds at its next module while the actors are busy, and no other starts. Busy:
    in the last sample (`sample`) the actors used more than all the CPUs but one and a half
    (at least half a CPU); it stays busy until `quiet_s`
    seconds without such a sample, so that preloading does not come back between two bursts
    of the actors' work. Only built actors count: one still in its constructor imports what a
    preload would, and holding preloads for it would keep every later actor importing for
    itself.

    It also picks the warm process for an actor (`pick`). It remembers, for each class name,
    how much of the preload set (in order) its actors imported for themselves (`note`): an actor
    of a class known to need the first `n` names gets the least preloaded process that has gone
    through them (a class that needs nothing leaves the preloaded processes to those that do);
    any other gets the most preloaded process not importing.
    """

    CHUNK = 64
    MAX_CLASSES = 1024

    def __init__(self, cpus: int, *, quiet_s: float = 1.0, nice: int = 0) -> None:
        self.limit = max(0.5, cpus - 1.5)
        self.nice = nice
        """The autogroup nice value of a process importing (0: held while the actors are busy)."""
        self.quiet_s = quiet_s
        self._cpu: dict[int, float] = {}  # pid -> its CPU seconds at the last sample
        self._at = time.monotonic()
        self._busy_at = -quiet_s
        self.position: dict[str, int] = {}
        """Each name of the worker's preload set: its place in the order they are sent."""
        self.needs: dict[str, int] = {}
        """Class name -> how many names of the preload set (in order) its actors need."""

    def number(self, news: Iterable[str]) -> None:
        """Names just added to the end of the preload set."""
        for name in news:
            self.position.setdefault(name, len(self.position))

    def note(self, class_name: str, imports: Iterable[str]) -> None:
        """An actor of `class_name` was built, importing `imports` for itself."""
        need = max((self.position[n] + 1 for n in imports if n in self.position), default=0)
        self.needs[class_name] = max(need, self.needs.pop(class_name, 0))  # now the newest
        if len(self.needs) > self.MAX_CLASSES:
            del self.needs[next(iter(self.needs))]

    def pick(self, hosts: Iterable[ActorProcess], class_name: str) -> ActorProcess | None:
        """The warm process for a new actor of `class_name`, or None if none is warm."""
        warm = [h for h in hosts if h.warm]
        need = self.needs.get(class_name)
        if need is not None:
            fits = [h for h in warm if h.preload_done >= max(need, h.preload_sent)]
            if fits:
                return min(fits, key=lambda h: (h.preload_done, h.ready_at))
        return min(warm, key=ActorProcess.warmth, default=None)

    def sample(self, hosts: Iterable[ActorProcess]) -> None:
        """Take the CPU time the actors among `hosts` used since the last sample."""
        now, cpu, used = time.monotonic(), {}, 0.0
        for host in hosts:
            if not host.built or host.ps is None:
                continue
            with contextlib.suppress(psutil.Error):
                times = host.ps.cpu_times()
                cpu[host.ps.pid] = times.user + times.system
                used += cpu[host.ps.pid] - self._cpu.get(host.ps.pid, cpu[host.ps.pid])
        if now > self._at and used / (now - self._at) > self.limit:
            self._busy_at = now
        self._cpu, self._at = cpu, now

    @property
    def busy(self) -> bool:
        """Whether the actors were busy within the last `quiet_s` seconds."""
        return time.monotonic() - self._busy_at < self.quiet_s

    @staticmethod
    def pending(hosts: Iterable[ActorProcess], known: int) -> bool:
        """Whether a warm process among `hosts` has not gone through all `known` names."""
        return any(h.warm and h.preload_done < known for h in hosts)

    def pace(self, hosts: Iterable[ActorProcess], names: list[str]) -> None:
        """Lower, hold or release the process importing; start the next one if none is.

        With `nice`, the process importing has its session lowered while the actors are busy
        and its normal share while they are quiet; a change the kernel refused for now (it
        takes one a tenth of a second) is made at a later call, as is a start that waits on one.
        """
        busy = self.busy
        warm = [h for h in hosts if h.warm and h.ctl is not None]
        for host in warm:
            if not host.preloading:
                continue
            if self.nice:
                self._share(host, self.nice if busy else 0)
            elif host.preload_paused != busy:
                host.tell(m.PausePreload(busy))
                host.preload_paused = busy
        todo = [h for h in warm if h.preload_sent < len(names)]
        if todo and (self.nice or not busy) and not any(h.preloading for h in warm):
            host = min(todo, key=lambda h: (h.preload_sent, h.ready_at))
            if self.nice and not self._share(host, self.nice if busy else 0):
                return
            chunk = names[host.preload_sent : host.preload_sent + self.CHUNK]
            host.tell(m.Preload(chunk))
            host.preload_sent += len(chunk)

    def _share(self, host: ActorProcess, nice: int) -> bool:
        """Give `host`'s session the autogroup nice value `nice`; whether it has it now.

        A refusal other than for the kernel's rate (EPERM, say) turns the lowering off for
        good: the importing process is then held while the actors are busy (and has it now).
        """
        try:
            return host.nice == nice or host.set_nice(nice)
        except OSError as exc:
            logger.warning(
                "preloading held while the actors are busy instead: the kernel refused a warm "
                "process's autogroup nice value (%s)",
                exc,
            )
            self.nice = 0
            return True


async def spawn_host(
    *, host: str, token: bytes | None, run_dir: str, own_session: bool = True
) -> tuple[ActorProcess, socket.socket]:
    """Start a warm actor process; return it and the worker's end of its control socket.

    With `own_session` False it starts in the worker's session (and process group), and
    leaves it when its `Assign` says so (`ActorProcess.keeps_session`).
    """
    loop = asyncio.get_running_loop()
    parent, child = socket.socketpair()
    death_r, death_w = os.pipe()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if token is not None:
        env["PARL_CLUSTER_TOKEN"] = token.decode()
    started = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "parl_remote.actor._host",
            "--ctl-fd",
            str(child.fileno()),
            "--death-fd",
            str(death_r),
            "--host",
            host,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(child.fileno(), death_r),
            env=env,
            cwd=run_dir,
            limit=1 << 20,
            # Its own session: the kernel shares CPU fairly between sessions (autogroup),
            # and actors sharing the worker's would share one process's worth between them.
            start_new_session=own_session,
        )
        started = ActorProcess(proc=proc, death_w=death_w, ready=loop.create_future())
    finally:
        child.close()
        os.close(death_r)
        if started is None:
            parent.close()
            os.close(death_w)
    return started, parent


def tree_rss(proc: psutil.Process) -> int:
    """Resident memory of a process and all its descendants, bytes."""
    rss: int = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rss += child.memory_info().rss
    return rss
