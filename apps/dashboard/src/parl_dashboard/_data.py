"""What the dashboard shows, as plain data read from the master's registry.

The JSON API returns these dictionaries as they are, and the HTML pages render them, so a page
and the API never disagree. Everything comes from the
registry's public, read-only side (`parl_remote.Registry`): its frozen `snapshot()` (the data
`xparl status` prints, with the live and recently ended actors), worker load histories and
log pages.
"""

from __future__ import annotations

from typing import Any, get_args

from parl_remote import ActorStatus, ClusterStatus, Registry
from parl_remote.wire.protocol.messages import ActorStateName

__all__ = [
    "STATES",
    "actor_data",
    "actors_data",
    "client_ids",
    "clients_data",
    "cluster_data",
    "log_data",
]

STATES = get_args(ActorStateName)
"""Every state an actor can be in; "live" filters for all but dead."""


def cluster_data(registry: Registry) -> dict[str, Any]:
    """Totals, the master, and one entry per worker with its load history.

    A worker's `history` holds `[time, cpu_percent, mem_used]` samples, one per heartbeat,
    oldest first (the last 10 minutes at the default heartbeat of one second).
    """
    snapshot = registry.snapshot(ended=0).as_dict()
    for worker in snapshot["workers"]:
        history = registry.worker_history(worker["worker_id"])
        worker["history"] = [[t, cpu, mem] for t, cpu, mem in history]
    return {key: snapshot[key] for key in ("cluster_id", "master", "totals", "workers")}


def actors_data(
    registry: Registry, *, client: str | None = None, state: str | None = None
) -> list[dict[str, Any]]:
    """Live actors (oldest first), then recently ended ones (most recent first).

    Args:
        registry: the master's registry.
        client: keep only the actors of this client id.
        state: keep only actors in this state; "live" keeps every state but dead.
    """
    snapshot = registry.snapshot(ended=None)
    rows = []
    for actor in [*snapshot.actors, *reversed(snapshot.ended_actors)]:
        if client and actor.client_id != client:
            continue
        if state and (actor.state == "dead" if state == "live" else actor.state != state):
            continue
        rows.append(_actor_row(snapshot, actor))
    return rows


def actor_data(registry: Registry, actor_id: str) -> dict[str, Any] | None:
    """One live or recently ended actor, as `actors_data` lists it; None if unknown."""
    actor = registry.actor_status(actor_id)
    return None if actor is None else _actor_row(registry.snapshot(ended=0), actor)


def _actor_row(snapshot: ClusterStatus, actor: ActorStatus) -> dict[str, Any]:
    row = actor.as_dict()
    hostnames = (w.hostname for w in snapshot.workers if w.worker_id == actor.worker_id)
    row["worker_hostname"] = next(hostnames, "")
    return row


def client_ids(registry: Registry) -> list[str]:
    """Every client id that owns a live or recently ended actor, or is connected, sorted."""
    snapshot = registry.snapshot(ended=None)
    ids = {a.client_id for a in (*snapshot.actors, *snapshot.ended_actors)}
    ids.update(c.client_id for c in snapshot.clients)
    return sorted(ids)


def clients_data(registry: Registry) -> list[dict[str, Any]]:
    """One entry per connected client: host, pid, live actors, when it connected."""
    return [client.as_dict() for client in registry.snapshot(ended=0).clients]


def log_data(registry: Registry, actor_id: str, offset: int = 0) -> dict[str, Any] | None:
    """An actor's retained output after line `offset`; None for an actor nobody knows.

    Lines are numbered from 1 in the order the master received them. `first` is the number
    of the oldest line still retained (older ones were dropped over the per-actor limit) and
    `last` the number of the newest, so a reader continues with `offset=last`. An entry of
    stream "exception" is the traceback of an exception the actor raised, several lines in
    one entry.
    """
    page = registry.read_log(actor_id, max(offset, 0))
    if page is None:
        if registry.actor_status(actor_id) is None:
            return None
        return {"actor_id": actor_id, "first": 1, "last": 0, "lines": []}
    return {
        "actor_id": actor_id,
        "first": page.first,
        "last": page.last,
        "lines": [
            {"n": n, "time": t, "stream": stream, "text": text} for n, t, stream, text in page.lines
        ],
    }
