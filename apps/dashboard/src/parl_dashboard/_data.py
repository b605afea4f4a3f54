"""What the dashboard shows, as plain data read from the master's registry.

The JSON API returns these dictionaries as they are, and the HTML pages render them, so a page
and the API never disagree. Everything comes from the
registry's public, read-only side (`parl_remote.Registry`): its frozen `snapshot()` (the data
`xparl status` prints), its actors and clients, worker load histories and log pages. Tables
are paged here, `PER_PAGE` rows at a time, so that what a page sends and renders stays the
same however large the cluster grows.
"""

from __future__ import annotations

from typing import Any, get_args

from parl_remote import ActorStatus, Registry
from parl_remote.wire.protocol.messages import ActorStateName

__all__ = [
    "PER_PAGE",
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

PER_PAGE = 50
"""Rows in one page of a table (workers, actors, clients): the server sends one page at a time."""


def _page(page: int, total: int) -> dict[str, int]:
    """Which page this is, of how many, and how many rows there are in all."""
    pages = max(1, -(-total // PER_PAGE))
    return {"page": page, "per_page": PER_PAGE, "pages": pages, "total": total}


def _offset(page: int) -> int:
    return (max(page, 1) - 1) * PER_PAGE


def cluster_data(registry: Registry, page: int = 1) -> dict[str, Any]:
    """Totals, the master, and a page of the workers, each with its load history.

    A worker's `history` holds `[time, cpu_percent, mem_used]` samples of the last 10
    minutes, oldest first, one a heartbeat but no closer than 2 s apart. `page` says
    which of the workers are listed (`PER_PAGE` of them, in the order they registered).
    """
    snapshot = registry.snapshot(ended=0, offset=_offset(page), limit=PER_PAGE).as_dict()
    for worker in snapshot["workers"]:  # JSON writes the samples' tuples as arrays
        worker["history"] = registry.worker_history(worker["worker_id"])
    data = {key: snapshot[key] for key in ("cluster_id", "master", "totals", "workers")}
    data["page"] = _page(page, snapshot["totals"]["workers"])
    return data


def actors_data(
    registry: Registry, *, client: str | None = None, state: str | None = None, page: int = 1
) -> dict[str, Any]:
    """A page of the actors: live ones (oldest first), then recently ended ones (latest first).

    Args:
        registry: the master's registry.
        client: keep only the actors of this client id.
        state: keep only actors in this state; "live" keeps every state but dead.
        page: which `PER_PAGE` of the matching actors to list; `live` and `ended` count them all.
    """
    found = registry.actor_page(
        offset=_offset(page), limit=PER_PAGE, client=client or None, state=state or None
    )
    return {
        "actors": [_actor_row(registry, a) for a in found.actors],
        "live": found.live,
        "ended": found.ended,
        "page": _page(page, found.live + found.ended),
    }


def actor_data(registry: Registry, actor_id: str) -> dict[str, Any] | None:
    """One live or recently ended actor, as `actors_data` lists it; None if unknown."""
    actor = registry.actor_status(actor_id)
    return None if actor is None else _actor_row(registry, actor)


def _actor_row(registry: Registry, actor: ActorStatus) -> dict[str, Any]:
    row = actor.as_dict()
    row["worker_hostname"] = registry.worker_hostname(actor.worker_id)
    return row


def client_ids(registry: Registry) -> list[str]:
    """Every client id that owns a live or recently ended actor, or is connected, sorted."""
    return registry.client_ids()


def clients_data(registry: Registry, page: int = 1) -> dict[str, Any]:
    """A page of the connected clients (host, pid, live actors, when it connected)."""
    clients = registry.client_statuses()
    start = _offset(page)
    return {
        "clients": [client.as_dict() for client in clients[start : start + PER_PAGE]],
        "page": _page(page, len(clients)),
    }


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
