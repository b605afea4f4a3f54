"""Live updates: what changed in the registry reaches every open page within a second.

Each open page keeps one WebSocket to `/live`, whose query says what the page shows (a `View`).
The registry calls `Live.changed` after every change; the hub wakes, sends each page the
fragments of its view that differ from what that page already has, then rests for a moment so
that a burst of changes (a heartbeat a second from every worker, a flood of log lines) costs at
most two pushes a second. A log view gets only the lines after the last one it has. With
nothing changing, views are refreshed every few seconds so that uptimes move.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from parl_dashboard import _html
from parl_dashboard._data import (
    STATES,
    actor_data,
    actors_data,
    clients_data,
    cluster_data,
    log_data,
)
from parl_remote import Registry

__all__ = ["Live", "View", "Viewer"]

_KINDS = ("cluster", "actors", "clients", "log")


@dataclass(frozen=True)
class View:
    """What one page shows: a kind, and its filters or its actor."""

    kind: str
    client: str = ""
    state: str = ""
    actor_id: str = ""
    page: int = 1
    """Which page of its table (workers, actors, clients) it shows."""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> View:
        """Read a view from a query string; ValueError says what was wrong."""
        kind = query.get("view", "")
        if kind not in _KINDS:
            raise ValueError(f"view={kind!r} is not one of {', '.join(_KINDS)}")
        state = query.get("state", "")
        if state and state not in ("live", *STATES):
            raise ValueError(f"state={state!r} is not one of live, {', '.join(STATES)}")
        actor_id = query.get("actor", "")
        if kind == "log" and not actor_id:
            raise ValueError("a log view needs actor=ID")
        page = query.get("page", "1")
        if not (page.isdigit() and 0 < int(page) < 1 << 31):
            raise ValueError(f"page={page!r} is not a page number (1, 2, ...)")
        return cls(kind, query.get("client", ""), state, actor_id, int(page))

    def query(self, offset: int | None = None) -> dict[str, str]:
        """The query string of this view, for a page's `data-live` attribute."""
        out = {"view": self.kind}
        for key, value in (("client", self.client), ("state", self.state)):
            if value:
                out[key] = value
        if self.page > 1:
            out["page"] = str(self.page)
        if self.kind == "log":
            out["actor"] = self.actor_id
            out["offset"] = str(offset or 0)
        return out

    def fragments(self, registry: Registry) -> dict[str, str]:
        """The view's fragments, by element id (a log view's lines are sent apart)."""
        if self.kind == "cluster":
            return _html.cluster_fragments(cluster_data(registry, self.page))
        if self.kind == "actors":
            data = actors_data(
                registry, client=self.client or None, state=self.state or None, page=self.page
            )
            return _html.actor_fragments(data, self.client, self.state)
        if self.kind == "clients":
            return _html.clients_fragments(clients_data(registry, self.page))
        actor = actor_data(registry, self.actor_id)
        page = registry.read_log(self.actor_id, limit=0)
        retained = page.retained if page is not None else 0
        return {"actor-head": _html.log_head_fragment(actor, self.actor_id, retained)}


@dataclass(eq=False)
class Viewer:
    """One open page: its socket, its view, and what it has been sent."""

    ws: web.WebSocketResponse
    view: View
    offset: int = 0
    sent: dict[str, str] = field(default_factory=dict)


class Live:
    """The hub between the registry's change notifications and the open pages.

    Args:
        registry: the master's registry.
        rest_s: the pause after each push, bounding pushes to a few a second.
        refresh_s: how often views are refreshed when nothing changes.
    """

    def __init__(self, registry: Registry, *, rest_s: float = 0.4, refresh_s: float = 5.0) -> None:
        self.registry = registry
        self.viewers: set[Viewer] = set()
        self.rest_s, self.refresh_s = rest_s, refresh_s
        self._dirty = asyncio.Event()

    def changed(self) -> None:
        """The registry's listener: something changed."""
        if self.viewers:
            self._dirty.set()

    async def run(self) -> None:
        """Push changes until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.refresh_s)
            self._dirty.clear()
            await self.push_all()
            await asyncio.sleep(self.rest_s)

    async def attach(self, ws: web.WebSocketResponse, view: View, offset: int) -> Viewer:
        """Start serving a page, sending at once whatever it lacks."""
        viewer = Viewer(ws, view, offset)
        self.viewers.add(viewer)
        await self._push(viewer, {})
        return viewer

    def detach(self, viewer: Viewer) -> None:
        """Stop serving a page."""
        self.viewers.discard(viewer)

    async def push_all(self) -> None:
        """Send every page what changed in its view."""
        cache: dict[View, dict[str, str]] = {}
        await asyncio.gather(*(self._push(v, cache) for v in list(self.viewers)))

    def update(self, viewer: Viewer, cache: dict[View, dict[str, str]]) -> dict[str, Any]:
        """What `viewer` lacks: fragments to replace, and for a log view lines to append."""
        fragments = cache.get(viewer.view)
        if fragments is None:
            fragments = cache[viewer.view] = viewer.view.fragments(self.registry)
        replace = {k: v for k, v in fragments.items() if viewer.sent.get(k) != v}
        viewer.sent.update(replace)
        message: dict[str, Any] = {"replace": replace} if replace else {}
        if viewer.view.kind == "log":
            data = log_data(self.registry, viewer.view.actor_id, viewer.offset)
            if data is not None and data["lines"]:
                dropped = data["lines"][0]["n"] - viewer.offset - 1
                gap = f"{dropped} lines were dropped here (over the limit)" if dropped > 0 else ""
                message["append"] = {"log": _html.log_lines(data["lines"], gap=gap)}
                viewer.offset = message["offset"] = data["last"]
        return message

    async def _push(self, viewer: Viewer, cache: dict[View, dict[str, str]]) -> None:
        if viewer.ws.closed:
            return
        message = self.update(viewer, cache)
        if message:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await viewer.ws.send_str(json.dumps(message))
