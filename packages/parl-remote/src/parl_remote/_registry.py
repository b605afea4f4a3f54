"""The master's registry: the one source of truth about workers, clients and actors.

The master changes it as messages arrive, only through its methods (`add_worker`,
`end_actor`, ...), each of which tells the listeners registered with `subscribe` (without
arguments) that something changed, so that live views update at once and no caller has to
remember to. `xparl status` and the dashboard read it (through `snapshot()` and the per-actor
log buffers).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parl_remote.protocol import messages as m

__all__ = ["ActorInfo", "ClientInfo", "HISTORY_S", "Registry", "WorkerInfo"]

HISTORY_S = 600.0  # each worker's load samples cover the last 10 minutes
_ENDED = 1000  # recently ended actors kept for the dashboard


@dataclass(eq=False)
class WorkerInfo:
    """A worker and its slots."""

    worker_id: str
    hostname: str
    host: str
    pid: int
    cpu_num: int
    gpus: list[str]
    mem_total: int
    conn: Any = None
    registered_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    free_gpus: list[str] = field(default_factory=list)
    actors: set[str] = field(default_factory=set)
    cpu_percent: float = 0.0
    mem_used: int = 0
    load_avg: float = 0.0
    history: deque = field(default_factory=deque)

    def record_load(self, when: float) -> None:
        """Add a load sample; drop those older than `HISTORY_S`."""
        self.history.append((when, self.cpu_percent, self.mem_used))
        while self.history and self.history[0][0] < when - HISTORY_S:
            self.history.popleft()

    @property
    def vacant(self) -> int:
        """CPU slots without an actor."""
        return self.cpu_num - len(self.actors)


@dataclass(eq=False)
class ClientInfo:
    """A connected client process."""

    client_id: str
    hostname: str
    pid: int
    log_to_driver: bool
    conn: Any = None
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    actors: set[str] = field(default_factory=set)


@dataclass(eq=False)
class ActorInfo:
    """An actor, live or recently ended."""

    actor_id: str
    class_name: str
    client_id: str
    worker_id: str
    state: str = "starting"  # starting, idle, busy, dead
    reason: str = ""
    host: str = ""
    port: int = 0
    pid: int = 0
    gpus: list[str] = field(default_factory=list)
    max_memory_mb: float = 0.0
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    calls: int = 0
    errors: int = 0
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    released: bool = False

    def as_dict(self, now: float) -> dict[str, Any]:
        """Plain data for the status reply and the dashboard's API."""
        end = self.ended_at or now
        return {
            "actor_id": self.actor_id,
            "class_name": self.class_name,
            "client_id": self.client_id,
            "worker_id": self.worker_id,
            "state": self.state,
            "reason": self.reason,
            "host": self.host,
            "port": self.port,
            "pid": self.pid,
            "gpus": list(self.gpus),
            "calls": self.calls,
            "errors": self.errors,
            "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "uptime_s": max(end - self.created_at, 0.0),
        }


class Registry:
    """Workers, clients, live and recently ended actors, and each actor's retained output."""

    def __init__(self, cluster_id: str, log_lines_per_actor: int = 10_000) -> None:
        self.cluster_id = cluster_id
        self.started_at = time.time()
        self.workers: dict[str, WorkerInfo] = {}
        self.clients: dict[str, ClientInfo] = {}
        self.actors: dict[str, ActorInfo] = {}
        self.ended: deque[ActorInfo] = deque(maxlen=_ENDED)
        self.ended_ids: set[str] = set()
        self.logs: dict[str, deque] = {}
        self.log_counts: dict[str, int] = {}
        self._log_lines = log_lines_per_actor
        self._listeners: set[Callable[[], None]] = set()
        self.master_info: dict[str, Any] = {}

    # -- change notification ---------------------------------------------------------------
    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` after every change; returns a function that unsubscribes."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def set_master_info(self, **info: Any) -> None:
        """Record where the master listens (host, port, pid)."""
        self.master_info = dict(info)
        self._changed()

    # -- clients ---------------------------------------------------------------------------
    def add_client(self, client: ClientInfo) -> None:
        """Register a connected client; one reconnecting under its id keeps its actors."""
        old = self.clients.get(client.client_id)
        if old is not None:
            client.actors = old.actors
        for actor in self.actors.values():
            if actor.client_id == client.client_id:
                client.actors.add(actor.actor_id)
        self.clients[client.client_id] = client
        self._changed()

    def remove_client(self, client: ClientInfo) -> None:
        """Forget a client (its actors are ended apart, as their processes exit)."""
        self.clients.pop(client.client_id, None)
        self._changed()

    # -- workers ---------------------------------------------------------------------------
    def add_worker(self, worker: WorkerInfo) -> None:
        """Register a worker with all its slots free (`add_actor` fills those it kept)."""
        self.workers[worker.worker_id] = worker
        self._changed()

    def remove_worker(self, worker: WorkerInfo) -> None:
        """Forget a worker (its actors are ended apart, with the reason)."""
        self.workers.pop(worker.worker_id, None)
        self._changed()

    def worker_heartbeat(self, worker: WorkerInfo, beat: m.WorkerHeartbeat) -> None:
        """Record a worker's load and its actors' statistics."""
        worker.cpu_percent, worker.mem_used = beat.cpu_percent, beat.mem_used
        worker.mem_total, worker.load_avg = beat.mem_total, beat.load_avg
        worker.record_load(time.time())
        for stats in beat.actors:
            actor = self.actors.get(stats.actor_id)
            if actor is not None:
                actor.cpu_percent, actor.rss_bytes = stats.cpu_percent, stats.rss_bytes
                actor.calls, actor.errors = stats.calls, stats.errors
                if actor.state in ("idle", "busy"):
                    actor.state = "busy" if stats.busy else "idle"
        self._changed()

    # -- actors ----------------------------------------------------------------------------
    def add_actor(self, actor: ActorInfo) -> None:
        """Record a live actor: it takes a slot and its GPUs on its worker, and joins its client."""
        self.actors[actor.actor_id] = actor
        worker = self.workers.get(actor.worker_id)
        if worker is not None:
            worker.actors.add(actor.actor_id)
            worker.free_gpus = [g for g in worker.free_gpus if g not in actor.gpus]
        client = self.clients.get(actor.client_id)
        if client is not None:
            client.actors.add(actor.actor_id)
        self._changed()

    def actor_started(self, actor: ActorInfo, port: int, pid: int) -> None:
        """Its process took the actor and listens on `port`."""
        actor.port, actor.pid = port, pid
        self._changed()

    def actor_initialized(self, actor: ActorInfo) -> None:
        """Its constructor returned: the actor is idle."""
        actor.state = "idle"
        self._changed()

    def release_actor(self, actor: ActorInfo, reason: str) -> None:
        """Its owner let it go (its process is being stopped); the first reason given stays."""
        actor.released = True
        if not actor.reason:
            actor.reason = reason
        self._changed()

    def end_actor(self, actor: ActorInfo, reason: str) -> None:
        """Move a live actor to the recently ended list, with why it ended."""
        if actor.state == "dead":
            return
        actor.state, actor.reason, actor.ended_at = "dead", reason, time.time()
        self.actors.pop(actor.actor_id, None)
        if len(self.ended) == self.ended.maxlen:
            old = self.ended[0]
            self.logs.pop(old.actor_id, None)
            self.log_counts.pop(old.actor_id, None)
        self.ended.append(actor)
        self.ended_ids.add(actor.actor_id)
        worker = self.workers.get(actor.worker_id)
        if worker is not None:
            worker.actors.discard(actor.actor_id)
            free = set(worker.free_gpus) | set(actor.gpus)
            worker.free_gpus = [g for g in worker.gpus if g in free]  # in declared order
        client = self.clients.get(actor.client_id)
        if client is not None:
            client.actors.discard(actor.actor_id)
        self._changed()

    def find_actor(self, actor_id: str) -> ActorInfo | None:
        """A live actor, or a recently ended one."""
        actor = self.actors.get(actor_id)
        if actor is not None:
            return actor
        for ended in reversed(self.ended):
            if ended.actor_id == actor_id:
                return ended
        return None

    # -- logs ------------------------------------------------------------------------------
    def add_logs(self, entries: list[tuple[str, str, str]]) -> None:
        """Keep output lines `(actor_id, stream, line)` (each actor's oldest go over the limit)."""
        now = time.time()
        for actor_id, stream, line in entries:
            buf = self.logs.get(actor_id)
            if buf is None:
                buf = self.logs[actor_id] = deque(maxlen=self._log_lines)
                self.log_counts[actor_id] = 0
            self.log_counts[actor_id] += 1
            buf.append((self.log_counts[actor_id], now, stream, line))
        self._changed()

    def read_log(
        self, actor_id: str, offset: int = 0
    ) -> tuple[list[tuple[int, float, str, str]], int]:
        """Lines numbered above `offset` (still retained), and the number of the last line."""
        buf = self.logs.get(actor_id)
        if not buf:
            return [], self.log_counts.get(actor_id, 0)
        first = buf[0][0]
        start = max(offset - first + 1, 0)
        lines = list(itertools.islice(buf, start, None))
        return lines, self.log_counts[actor_id]

    # -- views -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The whole cluster as plain data (what `xparl status` prints)."""
        now = time.time()
        workers = [
            {
                "worker_id": w.worker_id,
                "hostname": w.hostname,
                "host": w.host,
                "pid": w.pid,
                "cpu_num": w.cpu_num,
                "cpu_used": len(w.actors),
                "cpu_vacant": w.vacant,
                "gpus": list(w.gpus),
                "free_gpus": list(w.free_gpus),
                "cpu_percent": w.cpu_percent,
                "mem_used": w.mem_used,
                "mem_total": w.mem_total,
                "load_avg": w.load_avg,
                "uptime_s": now - w.registered_at,
            }
            for w in self.workers.values()
        ]
        clients = [
            {
                "client_id": c.client_id,
                "hostname": c.hostname,
                "pid": c.pid,
                "actors": len(c.actors),
                "connected_at": c.connected_at,
            }
            for c in self.clients.values()
        ]
        cpu_total = sum(w.cpu_num for w in self.workers.values())
        cpu_used = sum(len(w.actors) for w in self.workers.values())
        return {
            "cluster_id": self.cluster_id,
            "master": dict(self.master_info, uptime_s=now - self.started_at),
            "totals": {
                "workers": len(self.workers),
                "cpu_total": cpu_total,
                "cpu_used": cpu_used,
                "cpu_vacant": cpu_total - cpu_used,
                "actors": len(self.actors),
                "clients": len(self.clients),
                # several workers on one machine report the same memory: count each host once
                "mem_used": sum({w.hostname: w.mem_used for w in self.workers.values()}.values()),
                "mem_total": sum({w.hostname: w.mem_total for w in self.workers.values()}.values()),
            },
            "workers": workers,
            "clients": clients,
            "actors": [a.as_dict(now) for a in self.actors.values()],
            "ended_actors": [a.as_dict(now) for a in list(self.ended)[-100:]],
        }
