"""What the dashboard shows, as plain data read from the master's registry.

The JSON API returns these dictionaries as they are, and the HTML pages render them, so a page
and the API never disagree. The cluster and client views start from `Registry.snapshot()`, the
data `xparl status` prints; actors come from the registry's live and recently ended actors.
"""

from __future__ import annotations

import time
from typing import Any

from parl_remote._registry import ActorInfo, Registry

__all__ = [
    "STATES",
    "actor_data",
    "actors_data",
    "client_ids",
    "clients_data",
    "cluster_data",
    "log_data",
]

STATES = ("starting", "idle", "busy", "dead")
"""Every state an actor can be in; "live" filters for all but dead."""


def cluster_data(registry: Registry) -> dict[str, Any]:
    """Totals, the master, and one entry per worker with its load history.

    A worker's `history` holds `[time, cpu_percent, mem_used]` samples, one per heartbeat,
    oldest first (the last 10 minutes at the default heartbeat of one second).
    """
    snapshot = registry.snapshot()
    for worker in snapshot["workers"]:
        info = registry.workers.get(worker["worker_id"])
        history = list(info.history) if info is not None else []
        worker["history"] = [[t, cpu, mem] for t, cpu, mem in history]
    snapshot["totals"]["ended_actors"] = len(registry.ended)
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
    now = time.time()
    actors: list[ActorInfo] = [*registry.actors.values(), *reversed(registry.ended)]
    rows = []
    for actor in actors:
        if client and actor.client_id != client:
            continue
        if state and (actor.state == "dead" if state == "live" else actor.state != state):
            continue
        rows.append(_actor_row(registry, actor, now))
    return rows


def actor_data(registry: Registry, actor_id: str) -> dict[str, Any] | None:
    """One live or recently ended actor, as `actors_data` lists it; None if unknown."""
    actor = registry.find_actor(actor_id)
    return None if actor is None else _actor_row(registry, actor, time.time())


def _actor_row(registry: Registry, actor: ActorInfo, now: float) -> dict[str, Any]:
    row = actor.as_dict(now)
    worker = registry.workers.get(actor.worker_id)
    row["worker_hostname"] = worker.hostname if worker is not None else ""
    return row


def client_ids(registry: Registry) -> list[str]:
    """Every client id that owns a live or recently ended actor, or is connected, sorted."""
    ids = {a.client_id for a in registry.actors.values()}
    ids.update(a.client_id for a in registry.ended)
    ids.update(registry.clients)
    return sorted(ids)


def clients_data(registry: Registry) -> list[dict[str, Any]]:
    """One entry per connected client: host, pid, live actors, when it connected."""
    return registry.snapshot()["clients"]


def log_data(registry: Registry, actor_id: str, offset: int = 0) -> dict[str, Any] | None:
    """An actor's retained output after line `offset`; None for an actor nobody knows.

    Lines are numbered from 1 in the order the master received them. `first` is the number
    of the oldest line still retained (older ones were dropped over the per-actor limit) and
    `last` the number of the newest, so a reader continues with `offset=last`. An entry of
    stream "exception" is the traceback of an exception the actor raised, several lines in
    one entry.
    """
    actor = registry.find_actor(actor_id)
    if actor is None and actor_id not in registry.logs:
        return None
    lines, last = registry.read_log(actor_id, max(offset, 0))
    buf = registry.logs.get(actor_id)
    first = buf[0][0] if buf else last + 1
    return {
        "actor_id": actor_id,
        "first": first,
        "last": last,
        "lines": [
            {"n": n, "time": t, "stream": stream, "text": text} for n, t, stream, text in lines
        ],
    }
