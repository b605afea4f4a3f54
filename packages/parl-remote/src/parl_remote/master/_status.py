"""Read-only records of the cluster: what `Registry.snapshot()` and its other readers return.

They are frozen copies, taken at one moment: a reader (the dashboard, `xparl status`, a
master app of your own) can keep them, pass them around or serialize them without touching the
registry the master keeps changing. `as_dict()` gives the plain data of a `StatusReply` (what
`parl_remote.connect(...).status()` returns) and of the dashboard's JSON API.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from parl_remote.wire.protocol.messages import ActorStateName

__all__ = [
    "ActorPage",
    "ActorStatus",
    "ClientStatus",
    "ClusterStatus",
    "ClusterTotals",
    "LogPage",
    "MasterStatus",
    "WorkerStatus",
]


def _plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class _Record:
    def as_dict(self) -> dict[str, Any]:
        """Plain data, tuples as lists: the `StatusReply` and JSON form.

        The fields are immutable (numbers, strings, tuples, records), so nothing is copied
        but the tuples, which become lists.
        """
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class MasterStatus(_Record):
    """Where the master listens, and for how long it has."""

    host: str
    """The address it binds."""
    port: int
    """Its control port."""
    pid: int
    """Its process id."""
    uptime_s: float
    """Seconds since it started."""


@dataclass(frozen=True)
class WorkerStatus(_Record):
    """A worker, its slots and its machine's load."""

    worker_id: str
    """Its id, new each time it starts."""
    hostname: str
    """Its machine's name."""
    host: str
    """The address its actors listen on."""
    pid: int
    """Its process id."""
    cpu_num: int
    """CPU slots it offers."""
    cpu_used: int
    """Slots running an actor."""
    cpu_vacant: int
    """Slots free."""
    gpus: tuple[str, ...]
    """GPU ids it offers."""
    free_gpus: tuple[str, ...]
    """GPU ids no actor holds."""
    cpu_percent: float
    """Its machine's CPU use at the last heartbeat (100 is one core)."""
    mem_used: int
    """Its machine's memory in use, bytes."""
    mem_total: int
    """Its machine's memory, bytes."""
    load_avg: float
    """Its machine's one-minute load average."""
    uptime_s: float
    """Seconds since it registered."""


@dataclass(frozen=True)
class ClientStatus(_Record):
    """A connected client process."""

    client_id: str
    """Its id."""
    hostname: str
    """Its machine's name."""
    pid: int
    """Its process id."""
    actors: int
    """How many live actors it owns."""
    connected_at: float
    """When it connected (Unix time)."""
    restarts: int = 0
    """Its actors placed as replacements of its dead ones (see `parl_remote.replacing`)."""


@dataclass(frozen=True)
class ActorStatus(_Record):
    """An actor, live or recently ended."""

    actor_id: str
    """Its id."""
    class_name: str
    """The name of its class."""
    client_id: str
    """The client that owns it."""
    worker_id: str
    """The worker whose process runs it."""
    state: ActorStateName
    """starting, idle, busy or dead."""
    reason: str
    """Why it ended (or is ending); empty while it lives."""
    host: str
    """The address it listens on."""
    port: int
    """Its port (0 until its process took it)."""
    pid: int
    """Its process id (0 until its process took it)."""
    gpus: tuple[str, ...]
    """GPU ids it holds."""
    calls: int
    """Calls it has served."""
    errors: int
    """Calls that raised."""
    cpu_percent: float
    """Its process's CPU use at the last heartbeat (100 is one core)."""
    rss_bytes: int
    """Its process tree's resident memory, bytes."""
    created_at: float
    """When it was placed (Unix time)."""
    ended_at: float | None
    """When it ended (Unix time); None while it lives."""
    uptime_s: float
    """Seconds it has lived (or lived)."""
    replaces: str = ""
    """The id of the dead actor it replaces ("": none; see `parl_remote.replacing`)."""
    replaced_reason: str = ""
    """Why the actor it replaces ended."""


@dataclass(frozen=True)
class ActorPage(_Record):
    """A page of the actors that match a filter, with how many match in all."""

    actors: tuple[ActorStatus, ...]
    """The page: live actors first (oldest first), then recently ended ones (latest first)."""
    live: int
    """Live actors that match."""
    ended: int
    """Recently ended actors that match."""


@dataclass(frozen=True)
class ClusterTotals(_Record):
    """Sums over the cluster."""

    workers: int
    """Registered workers."""
    cpu_total: int
    """CPU slots offered."""
    cpu_used: int
    """Slots running an actor."""
    cpu_vacant: int
    """Slots free."""
    actors: int
    """Live actors."""
    clients: int
    """Connected clients."""
    mem_used: int
    """Memory in use, bytes, each machine counted once."""
    mem_total: int
    """Memory, bytes, each machine counted once."""
    ended_actors: int
    """Recently ended actors the registry still keeps."""


@dataclass(frozen=True)
class ClusterStatus(_Record):
    """The whole cluster at one moment (what `xparl status` prints)."""

    cluster_id: str
    """The master's id, new each time it starts."""
    master: MasterStatus
    """The master."""
    totals: ClusterTotals
    """Sums over the cluster."""
    workers: tuple[WorkerStatus, ...]
    """Registered workers (a page of them when `limit` is set), in the order they registered."""
    clients: tuple[ClientStatus, ...]
    """Connected clients (a page of them when `limit` is set)."""
    actors: tuple[ActorStatus, ...]
    """Live actors (a page of them when `limit` is set), oldest first."""
    ended_actors: tuple[ActorStatus, ...]
    """The most recently ended actors (as many as asked for), oldest first."""
    offset: int = 0
    """How many records of each list the page skipped."""
    limit: int | None = None
    """How many records each list holds at most; None: every one (`totals` counts them all)."""


@dataclass(frozen=True)
class LogPage(_Record):
    """An actor's retained output after a given line."""

    actor_id: str
    """Whose output."""
    first: int
    """The number of the oldest line still retained (`last + 1` when none is)."""
    last: int
    """The number of the newest line; read on with `offset=last`."""
    retained: int
    """How many lines are retained (older ones were dropped over the per-actor limit)."""
    lines: tuple[tuple[int, float, str, str], ...]
    """`(number, time, stream, text)` of each line after the offset asked for."""
