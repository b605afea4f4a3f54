"""The master's registry: the one source of truth about workers, clients and actors.

The master changes it as messages arrive, only through its methods (`add_worker`,
`end_actor`, ...), each of which tells the listeners registered with `subscribe` (without
arguments) that something changed, so that live views update at once and no caller has to
remember to. Readers (`xparl status`, the dashboard, any master app) use `subscribe` and the
methods that return frozen records (`snapshot`, `actor_status`, `worker_history`,
`read_log`): `Registry` is public as `parl_remote.Registry` for that reading side, while its
changing side and its mutable records (`WorkerInfo`, ...) are the master's own.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from parl_remote.master._status import (
    ActorPage,
    ActorStatus,
    ClientStatus,
    ClusterStatus,
    ClusterTotals,
    LogPage,
    MasterStatus,
    WorkerStatus,
)
from parl_remote.master._vacancy import VacancyIndex
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.messages import ActorStateName

__all__ = ["ActorInfo", "ClientInfo", "HISTORY_S", "HISTORY_STEP_S", "Registry", "WorkerInfo"]

HISTORY_S = 600.0  # each worker's load samples cover the last 10 minutes
HISTORY_STEP_S = 2.0  # at one sample every 2 s at most: 300, a pixel each of the dashboard's chart
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
    told_at: float = 0.0
    """When the master last sent it a message (monotonic): a ping is due a while after."""
    free_gpus: list[str] = field(default_factory=list)
    actors: set[str] = field(default_factory=set)
    cpu_percent: float = 0.0
    mem_used: int = 0
    load_avg: float = 0.0
    history: deque[Any] = field(default_factory=deque)

    def record_load(self, when: float) -> None:
        """Add a load sample, unless the last is under `HISTORY_STEP_S` old; drop the old ones.

        Samples older than `HISTORY_S` go. A heartbeat a second from 10,000 workers would
        otherwise keep six million samples.
        """
        if self.history and when - self.history[-1][0] < HISTORY_STEP_S:
            return
        self.history.append((when, self.cpu_percent, self.mem_used))
        while self.history and self.history[0][0] < when - HISTORY_S:
            self.history.popleft()

    @property
    def vacant(self) -> int:
        """CPU slots without an actor."""
        return self.cpu_num - len(self.actors)

    def status(self, now: float) -> WorkerStatus:
        """A frozen copy, as readers see it."""
        return WorkerStatus(
            worker_id=self.worker_id,
            hostname=self.hostname,
            host=self.host,
            pid=self.pid,
            cpu_num=self.cpu_num,
            cpu_used=len(self.actors),
            cpu_vacant=self.vacant,
            gpus=tuple(self.gpus),
            free_gpus=tuple(self.free_gpus),
            cpu_percent=self.cpu_percent,
            mem_used=self.mem_used,
            mem_total=self.mem_total,
            load_avg=self.load_avg,
            uptime_s=now - self.registered_at,
        )


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
    told_at: float = 0.0
    """When the master last sent it a message (monotonic): a ping is due a while after."""
    actors: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    """Actors of other clients that this one holds handles of."""
    restarts: int = 0
    """Its actors placed as replacements of its dead ones (`CreateActor.replaces`)."""

    def status(self) -> ClientStatus:
        """A frozen copy, as readers see it."""
        return ClientStatus(
            self.client_id,
            self.hostname,
            self.pid,
            len(self.actors),
            self.connected_at,
            self.restarts,
        )


@dataclass(eq=False)
class ActorInfo:
    """An actor, live or recently ended."""

    actor_id: str
    class_name: str
    client_id: str
    worker_id: str
    state: ActorStateName = "starting"
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
    holders: set[str] = field(default_factory=set)
    """Clients other than its creator that hold handles of it: it lives while any does."""
    let_go: bool = False
    """Its creator dropped its last handle; it ends when the last holder does."""
    replaces: str = ""
    """The dead actor it replaces ("": none)."""
    replaced: ActorInfo | None = None
    """That actor, while it is the newest of its line (its reason may come after)."""
    replaced_reason: str = ""
    """Why that actor ended, once a newer replacement let it go."""

    @classmethod
    def adopted(cls, record: m.ActorRecord, worker: WorkerInfo) -> ActorInfo:
        """An actor that `worker` kept running while it was away from this master."""
        return cls(
            actor_id=record.actor_id,
            class_name=record.class_name,
            client_id=record.client_id,
            worker_id=worker.worker_id,
            state="idle",
            host=worker.host,
            port=record.port,
            pid=record.pid,
            gpus=list(record.gpus),
            max_memory_mb=record.max_memory_mb,
            created_at=record.started_at or time.time(),
        )

    def status(self, now: float) -> ActorStatus:
        """A frozen copy, as readers see it."""
        end = self.ended_at or now
        return ActorStatus(
            actor_id=self.actor_id,
            class_name=self.class_name,
            client_id=self.client_id,
            worker_id=self.worker_id,
            state=self.state,
            reason=self.reason,
            host=self.host,
            port=self.port,
            pid=self.pid,
            gpus=tuple(self.gpus),
            calls=self.calls,
            errors=self.errors,
            cpu_percent=self.cpu_percent,
            rss_bytes=self.rss_bytes,
            created_at=self.created_at,
            ended_at=self.ended_at,
            uptime_s=max(end - self.created_at, 0.0),
            replaces=self.replaces,
            replaced_reason=self.replaced_reason if self.replaced is None else self.replaced.reason,
        )


class _Totals:
    """The cluster's sums, kept up to date so that a status costs no pass over every worker.

    They change as workers come and go, actors take and free slots and hosts report their
    memory. Several workers on one machine report the same memory: each host counts once, with what
    the latest report from any of its workers said.
    """

    def __init__(self) -> None:
        self.cpu_total = self.cpu_used = self.mem_used = self.mem_total = 0
        self._hosts: dict[str, list[int]] = {}  # hostname -> [workers, mem_used, mem_total]

    def worker_added(self, worker: WorkerInfo) -> None:
        self.cpu_total += worker.cpu_num
        self.cpu_used += len(worker.actors)
        host = self._hosts.setdefault(worker.hostname, [0, 0, 0])
        host[0] += 1
        self.memory(worker)

    def worker_removed(self, worker: WorkerInfo) -> None:
        self.cpu_total -= worker.cpu_num
        self.cpu_used -= len(worker.actors)
        host = self._hosts[worker.hostname]
        host[0] -= 1
        if not host[0]:
            self.mem_used -= host[1]
            self.mem_total -= host[2]
            del self._hosts[worker.hostname]

    def memory(self, worker: WorkerInfo) -> None:
        """`worker` reported its machine's memory."""
        host = self._hosts[worker.hostname]
        self.mem_used += worker.mem_used - host[1]
        self.mem_total += worker.mem_total - host[2]
        host[1], host[2] = worker.mem_used, worker.mem_total


class Registry:
    """Workers, clients, live and recently ended actors, and each actor's retained output.

    The master owns it and changes it; readers get frozen records from `snapshot()`,
    `actor_status()`, `worker_history()` and `read_log()`, and subscribe to be told of changes.

    Args:
        cluster_id: the id of the master, new each time it starts.
        log_lines_per_actor: how many of each actor's output lines are retained.
        lost_for_s: how long the ids of actors that ended away from their worker (it was lost,
            or cut off) are kept in `lost_ids`: as long as such a worker may come back with
            them (`PARL_MASTER_GRACE_S`, and the silence that declared it lost).
    """

    def __init__(
        self, cluster_id: str, log_lines_per_actor: int = 10_000, *, lost_for_s: float = 310.0
    ) -> None:
        self.cluster_id = cluster_id
        self.started_at = time.time()
        self.workers: dict[str, WorkerInfo] = {}
        self.vacancy: VacancyIndex[WorkerInfo] = VacancyIndex()
        """The workers by vacant slots, for placement (kept by the methods that change them)."""
        self._totals = _Totals()
        """The cluster's sums, kept by the methods that change what they sum."""
        self.clients: dict[str, ClientInfo] = {}
        self.actors: dict[str, ActorInfo] = {}
        self.ended: deque[ActorInfo] = deque(maxlen=_ENDED)
        self._ended_by_id: dict[str, ActorInfo] = {}  # the same actors, found without a scan
        self.lost_ids: dict[str, float] = {}
        """Actors that ended while their worker was not registered -> when (monotonic), oldest
        first: a worker that comes back with one of them is told to stop it."""
        self._lost_for_s = lost_for_s
        self.logs: dict[str, deque[Any]] = {}
        self.log_counts: dict[str, int] = {}
        self._log_lines = log_lines_per_actor
        self._listeners: set[Callable[[], None]] = set()
        self._notify: tuple[Callable[[], None], ...] = ()
        self.master_info: dict[str, Any] = {}
        self._claims: dict[str, set[str]] = {}  # actor id -> clients holding it, not yet known

    # -- change notification ---------------------------------------------------------------
    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` after every change; returns a function that unsubscribes."""
        self._listeners.add(listener)
        self._notify = tuple(self._listeners)

        def unsubscribe() -> None:
            self._listeners.discard(listener)
            self._notify = tuple(self._listeners)

        return unsubscribe

    def _changed(self) -> None:
        for listener in self._notify:  # a copy, made when a listener comes or goes
            listener()

    def set_master_info(self, host: str, port: int, pid: int) -> None:
        """Record where the master listens."""
        self.master_info = {"host": host, "port": port, "pid": pid}
        self._changed()

    # -- clients ---------------------------------------------------------------------------
    def add_client(self, client: ClientInfo, handles: Iterable[str] = ()) -> None:
        """Register a connected client; one reconnecting under its id keeps its actors.

        `handles` are the actors it has handles of: those of other clients it holds (after a
        master restart, this is how holds come back; an actor not known yet, because its worker
        has not re-registered, is held once it is).
        """
        old = self.clients.get(client.client_id)
        if old is not None:
            client.actors, client.held = old.actors, old.held
        for actor in self.actors.values():
            if actor.client_id == client.client_id:
                client.actors.add(actor.actor_id)
        self.clients[client.client_id] = client
        for actor_id in handles:
            known = self.actors.get(actor_id)
            if known is None:
                self._claims.setdefault(actor_id, set()).add(client.client_id)
            elif known.client_id != client.client_id and not known.released:
                known.holders.add(client.client_id)
                client.held.add(actor_id)
        self._changed()

    def remove_client(self, client: ClientInfo) -> None:
        """Forget a client (its actors are ended apart, as their processes exit)."""
        self.clients.pop(client.client_id, None)
        for actor_id, claimants in list(self._claims.items()):
            claimants.discard(client.client_id)
            if not claimants:
                del self._claims[actor_id]
        self._changed()

    # -- workers ---------------------------------------------------------------------------
    def add_worker(self, worker: WorkerInfo) -> None:
        """Register a worker with all its slots free (`add_actor` fills those it kept)."""
        old = self.workers.get(worker.worker_id)
        if old is not None:
            self._totals.worker_removed(old)
        self.workers[worker.worker_id] = worker
        self._totals.worker_added(worker)
        self.vacancy.update(worker)
        self._changed()

    def remove_worker(self, worker: WorkerInfo) -> None:
        """Forget a worker (its actors are ended apart, with the reason)."""
        gone = self.workers.pop(worker.worker_id, None)
        if gone is not None:
            self._totals.worker_removed(gone)
            self.vacancy.remove(gone)
        self._changed()

    def worker_heartbeat(self, worker: WorkerInfo, beat: m.WorkerHeartbeat) -> None:
        """Record a worker's load and its actors' statistics."""
        worker.cpu_percent, worker.mem_used = beat.cpu_percent, beat.mem_used
        worker.mem_total, worker.load_avg = beat.mem_total, beat.load_avg
        if self.workers.get(worker.worker_id) is worker:
            self._totals.memory(worker)
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
            before = len(worker.actors)
            worker.actors.add(actor.actor_id)
            self._totals.cpu_used += len(worker.actors) - before
            worker.free_gpus = [g for g in worker.free_gpus if g not in actor.gpus]
            self.vacancy.update(worker)
        client = self.clients.get(actor.client_id)
        if client is not None:
            client.actors.add(actor.actor_id)
        for client_id in self._claims.pop(actor.actor_id, ()):
            holder = self.clients.get(client_id)
            if holder is not None and client_id != actor.client_id:
                actor.holders.add(client_id)
                holder.held.add(actor.actor_id)
        self._changed()

    def actor_started(self, actor: ActorInfo, port: int, pid: int) -> None:
        """Its process took the actor and listens on `port`."""
        actor.port, actor.pid = port, pid
        self._changed()

    def actor_initialized(self, actor: ActorInfo) -> None:
        """Its constructor returned: the actor is idle."""
        actor.state = "idle"
        self._changed()

    def hold(self, actor: ActorInfo, client: ClientInfo) -> None:
        """`client` holds a handle of `actor` (passed to it by another process)."""
        actor.holders.add(client.client_id)
        client.held.add(actor.actor_id)
        self._changed()

    def unhold(self, actor: ActorInfo, client: ClientInfo) -> bool:
        """`client` let go of `actor`; True when that was the last hold of a let-go actor."""
        actor.holders.discard(client.client_id)
        client.held.discard(actor.actor_id)
        self._changed()
        return actor.let_go and not actor.holders

    def let_go(self, actor: ActorInfo) -> bool:
        """Its creating client let go of `actor`; True when no other process holds it."""
        actor.let_go = True
        self._changed()
        return not actor.holders

    def drop_holders(self, actor: ActorInfo) -> list[ClientInfo]:
        """Forget every holder of `actor` (it is ending); return those still connected."""
        holders = [self.clients[c] for c in actor.holders if c in self.clients]
        for client in holders:
            client.held.discard(actor.actor_id)
        actor.holders.clear()
        self._changed()
        return holders

    def replaced(self, actor: ActorInfo, replaces: str, client: ClientInfo) -> None:
        """`actor`, about to be placed, replaces `replaces`, a dead actor of the same client.

        An id the registry does not know as one of that client's actors is ignored. Only the
        newest of a line of replacements holds the one before it (whose reason may come later
        than the replacement): the line is never a chain in memory.
        """
        old = self.find_actor(replaces) if replaces else None
        if old is None or old.client_id != client.client_id:
            return
        if old.replaced is not None:
            old.replaced_reason, old.replaced = old.replaced.reason, None
        actor.replaces, actor.replaced = old.actor_id, old
        client.restarts += 1

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
            if self._ended_by_id.get(old.actor_id) is old:
                del self._ended_by_id[old.actor_id]
        self.ended.append(actor)
        self._ended_by_id[actor.actor_id] = actor
        worker = self.workers.get(actor.worker_id)
        if worker is None:
            self._lost(actor.actor_id)
        else:
            before = len(worker.actors)
            worker.actors.discard(actor.actor_id)
            self._totals.cpu_used -= before - len(worker.actors)
            free = set(worker.free_gpus) | set(actor.gpus)
            worker.free_gpus = [g for g in worker.gpus if g in free]  # in declared order
            self.vacancy.update(worker)
        client = self.clients.get(actor.client_id)
        if client is not None:
            client.actors.discard(actor.actor_id)
        self._changed()

    def _lost(self, actor_id: str) -> None:
        """Keep the id of an actor ended away from its worker for `lost_for_s` (then forget it).

        The others ended with their worker's word (its process exited, or could not start),
        so their worker never brings them back: keeping every ended id would grow without
        bound on a cluster that places actors all day.
        """
        now = time.monotonic()
        lost = self.lost_ids
        while lost:
            oldest = next(iter(lost))
            if lost[oldest] >= now - self._lost_for_s:
                break
            del lost[oldest]
        lost[actor_id] = now

    def find_actor(self, actor_id: str) -> ActorInfo | None:
        """A live actor, or a recently ended one."""
        actor = self.actors.get(actor_id)
        return actor if actor is not None else self._ended_by_id.get(actor_id)

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

    # -- reading -----------------------------------------------------------------------------
    def read_log(
        self, actor_id: str, offset: int = 0, *, limit: int | None = None
    ) -> LogPage | None:
        """An actor's retained lines numbered above `offset` (at most `limit` of them).

        None if the registry never kept output of that actor (or dropped it with the actor).
        """
        buf = self.logs.get(actor_id)
        if buf is None:
            return None
        last = self.log_counts[actor_id]
        first = buf[0][0] if buf else last + 1
        start = max(offset - first + 1, 0)
        stop = None if limit is None else start + max(limit, 0)
        lines = tuple(itertools.islice(buf, start, stop))
        return LogPage(actor_id, first, last, len(buf), lines)

    def actor_status(self, actor_id: str) -> ActorStatus | None:
        """A live or recently ended actor; None if the registry does not know it."""
        actor = self.find_actor(actor_id)
        return None if actor is None else actor.status(time.time())

    def worker_history(self, worker_id: str) -> tuple[tuple[float, float, int], ...]:
        """A worker's `(time, cpu_percent, mem_used)` samples of the last 10 minutes.

        One a heartbeat, but no closer than `HISTORY_STEP_S` apart.
        """
        worker = self.workers.get(worker_id)
        return () if worker is None else tuple(worker.history)

    def worker_hostname(self, worker_id: str) -> str:
        """The machine name of a registered worker; empty if none has that id."""
        worker = self.workers.get(worker_id)
        return "" if worker is None else worker.hostname

    def client_statuses(self) -> tuple[ClientStatus, ...]:
        """Every connected client, in the order they connected."""
        return tuple(c.status() for c in self.clients.values())

    def actor_statuses(self, *, ended: int | None = None) -> tuple[ActorStatus, ...]:
        """Live actors (oldest first), then the `ended` latest ended ones (oldest first).

        Args:
            ended: how many of the recently ended actors to include; None for all the
                registry keeps.
        """
        now = time.time()
        return tuple(a.status(now) for a in (*self.actors.values(), *self._ended(ended)))

    def actor_page(
        self,
        *,
        offset: int = 0,
        limit: int | None = None,
        client: str | None = None,
        state: str | None = None,
    ) -> ActorPage:
        """A page of the actors that match: live ones (oldest first), then ended (latest first).

        Only the page's records are made, so that a page of a busy cluster costs the same as
        one of a small one; counting what matches a filter is a pass over the actors' states.

        Args:
            offset: how many of the matching actors to skip.
            limit: how many to list at most; None for every one.
            client: keep only the actors of this client id.
            state: keep only actors in this state; "live" keeps every state but dead.
        """
        live: Iterable[ActorInfo] = self.actors.values()  # none of them is dead
        ended: Iterable[ActorInfo] = reversed(self.ended)
        if state is not None and state != "live":
            live = () if state == "dead" else (a for a in live if a.state == state)
        if state is not None and state != "dead":
            ended = ()
        if client is not None:
            live = (a for a in live if a.client_id == client)
            ended = (a for a in ended if a.client_id == client)
        if client is None and state in (None, "live", "dead"):
            n_live = 0 if state == "dead" else len(self.actors)
            n_ended = 0 if state == "live" else len(self.ended)
        else:
            live, ended = list(live), list(ended)
            n_live, n_ended = len(live), len(ended)
        offset = max(offset, 0)
        stop = None if limit is None else offset + max(limit, 0)
        now = time.time()
        page = itertools.islice(itertools.chain(live, ended), offset, stop)
        return ActorPage(tuple(a.status(now) for a in page), n_live, n_ended)

    def client_ids(self) -> list[str]:
        """Every client id that owns a live or recently ended actor, or is connected, sorted."""
        ids = {a.client_id for a in self.actors.values()}
        ids.update(a.client_id for a in self.ended)
        ids.update(self.clients)
        return sorted(ids)

    def _ended(self, ended: int | None) -> list[ActorInfo]:
        kept = len(self.ended) if ended is None else min(max(ended, 0), len(self.ended))
        return list(itertools.islice(self.ended, len(self.ended) - kept, None))

    def snapshot(
        self, *, ended: int | None = 100, offset: int = 0, limit: int | None = None
    ) -> ClusterStatus:
        """The cluster (what `xparl status` prints): its totals and a page of its records.

        The totals always count the whole cluster; the workers, clients and live actors are
        each listed from the `offset`-th on, `limit` of them at most, so that a reader of a
        large cluster gets a summary and a page rather than every record.

        Args:
            ended: how many of the recently ended actors to include, the latest; None for all
                the registry keeps.
            offset: how many records of each list to skip (the order is registration's).
            limit: how many records of each list to give at most; None for every one.
        """
        now = time.time()
        workers, sums = self.workers.values(), self._totals
        totals = ClusterTotals(
            workers=len(workers),
            cpu_total=sums.cpu_total,
            cpu_used=sums.cpu_used,
            cpu_vacant=sums.cpu_total - sums.cpu_used,
            actors=len(self.actors),
            clients=len(self.clients),
            mem_used=sums.mem_used,
            mem_total=sums.mem_total,
            ended_actors=len(self.ended),
        )
        info = self.master_info
        master = MasterStatus(
            info.get("host", ""), info.get("port", 0), info.get("pid", 0), now - self.started_at
        )
        offset = max(offset, 0)
        stop = None if limit is None else offset + max(limit, 0)

        def page(records: Iterable[Any]) -> Iterable[Any]:
            return itertools.islice(records, offset, stop)

        return ClusterStatus(
            cluster_id=self.cluster_id,
            master=master,
            totals=totals,
            workers=tuple(w.status(now) for w in page(workers)),
            clients=tuple(c.status() for c in page(self.clients.values())),
            actors=tuple(a.status(now) for a in page(self.actors.values())),
            ended_actors=tuple(a.status(now) for a in self._ended(ended)),
            offset=offset,
            limit=limit,
        )
