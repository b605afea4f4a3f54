"""The dashboard's aiohttp application: pages, the JSON API, live updates, and who may see them.

`create_app(registry)` builds an application that reads the master's live registry (through
the public, read-only side of `parl_remote.Registry`). The master finds `master_app` through
the entry-point group `parl_remote.master_apps` and serves it from its own event loop (an
`AppRunner` and a `TCPSite` on `--monitor_port`), so the dashboard, the API and `xparl status`
share one source of truth. Routes:

    GET /?page=N                    the cluster: totals, a page of workers, load charts
    GET /actors?client=&state=&page=N       a page of live and recently ended actors
    GET /clients?page=N             a page of connected clients
    GET /actors/{id}/logs           an actor's output, live
    GET /live?view=...              the WebSocket of a page's live updates
    GET /api/cluster?page=N         JSON: totals, master, a page of workers with load history
    GET /api/actors?client=&state=&page=N   JSON: a page of actors, with the counts
    GET /api/clients?page=N         JSON: a page of clients
    GET /api/actors/{id}/logs?offset=N      JSON: output lines after line N
    GET /api/actors/{id}/logs.txt   the whole retained output, as a download
    GET, POST /login                the token form (dashboards beyond loopback only)

Tables are paged on the server (`_data.PER_PAGE` rows): a page of a cluster of 10,000 workers
sends and renders 50 of them, with links to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import WSCloseCode, web

from parl_dashboard import _html
from parl_dashboard._auth import Guard, is_loopback
from parl_dashboard._data import (
    actor_data,
    actors_data,
    client_ids,
    clients_data,
    cluster_data,
    log_data,
)
from parl_dashboard._live import Live, View
from parl_remote import Registry

__all__ = [
    "create_app",
    "guard_key",
    "live_key",
    "master_app",
    "registry_key",
    "routes",
    "websockets_key",
]

registry_key = web.AppKey("registry_key", Registry)
guard_key = web.AppKey("guard_key", Guard)
live_key = web.AppKey("live_key", Live)
websockets_key = web.AppKey("websockets_key", weakref.WeakSet[web.WebSocketResponse])

STATIC_DIR = Path(__file__).with_name("static")
_PAGE_LINES = 2000  # a log page shows this many lines at first; the download has them all
_CSP = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

routes = web.RouteTableDef()


def create_app(registry: Registry, *, token: bytes | None = None) -> web.Application:
    """The dashboard of the cluster whose registry is `registry`.

    Args:
        registry: the master's registry, read live.
        token: the cluster token, for a dashboard that listens beyond loopback: every page
            and API call then needs it (see the module `_auth`). None for a loopback-only
            dashboard, which answers only requests that name a loopback host.
    """
    app = web.Application(middlewares=[_guard])
    app[registry_key] = registry
    app[guard_key] = Guard(token)
    app[live_key] = Live(registry)
    app[websockets_key] = weakref.WeakSet()
    app.add_routes(routes)
    app.router.add_static("/static/", STATIC_DIR)
    app.cleanup_ctx.append(_live_updates)
    app.on_shutdown.append(_close_websockets)
    app.on_response_prepare.append(_security_headers)
    return app


def master_app(registry: Registry, *, host: str, token: bytes | None) -> web.Application:
    """The dashboard as the master serves it: its `parl_remote.master_apps` entry point.

    Args:
        registry: the master's registry, read live.
        host: the address the master binds: beyond loopback, the dashboard asks for the token.
        token: the cluster token.
    """
    return create_app(registry, token=None if is_loopback(host) else token)


async def _live_updates(app: web.Application) -> AsyncIterator[None]:
    live = app[live_key]
    unsubscribe = app[registry_key].subscribe(live.changed)
    task = asyncio.get_running_loop().create_task(live.run())
    yield
    unsubscribe()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _close_websockets(app: web.Application) -> None:
    for ws in set(app[websockets_key]):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"the master is stopping")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    if not request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-store")


def _is_api(request: web.Request) -> bool:
    return request.path.startswith("/api/") or request.path == "/live"


@web.middleware
async def _guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
    guard = request.app[guard_key]
    if not guard.required:
        if not is_loopback(request.url.host):
            raise web.HTTPForbidden(
                text="this dashboard listens on loopback and answers only to a loopback name "
                "such as 127.0.0.1 or localhost\n"
            )
        return await handler(request)
    if request.path.startswith("/static/") or request.path == "/login" or guard.allows(request):
        return await handler(request)
    given = request.query.get("token")
    if given is not None and guard.token_ok(given):
        if _is_api(request):
            response = await handler(request)
            if not response.prepared:  # a WebSocket has answered already
                guard.grant(response)
            return response
        query = {k: v for k, v in request.query.items() if k != "token"}
        target = request.path + (f"?{urlencode(query)}" if query else "")
        redirect = web.HTTPSeeOther(target)
        guard.grant(redirect)
        raise redirect
    problem = "that is not this cluster's token" if given is not None else ""
    if _is_api(request):
        raise web.HTTPUnauthorized(
            text='{"error": "this dashboard needs the cluster token: send Authorization: Bearer '
            'TOKEN, or add ?token=TOKEN once"}',
            content_type="application/json",
        )
    return _page(_html.login_page(request.path_qs, problem), status=401)


def _page(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def _view(request: web.Request, **extra: str) -> View:
    try:
        return View.from_query({**request.query, **extra})
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{exc}\n") from None


# -- pages ----------------------------------------------------------------------------------------
@routes.get("/")
async def _cluster_page(request: web.Request) -> web.Response:
    """The cluster: totals, the master, one row per worker with its load chart."""
    view = _view(request, view="cluster")
    return _live_page(
        view, "Cluster", _html.cluster_body(view.fragments(request.app[registry_key]))
    )


@routes.get("/actors")
async def _actors_page(request: web.Request) -> web.Response:
    """Live and recently ended actors, filtered by client and state."""
    view = _view(request, view="actors")
    registry = request.app[registry_key]
    filters = _html.actor_filters(client_ids(registry), view.client, view.state)
    return _live_page(view, "Actors", _html.actors_body(view.fragments(registry), filters))


@routes.get("/clients")
async def _clients_page(request: web.Request) -> web.Response:
    """Connected clients."""
    view = _view(request, view="clients")
    return _live_page(
        view, "Clients", _html.clients_body(view.fragments(request.app[registry_key]))
    )


def _live_page(view: View, title: str, body: str) -> web.Response:
    return _page(_html.page(title, view.kind, body, live=view.query()))


@routes.get("/actors/{actor_id}/logs")
async def _log_page(request: web.Request) -> web.Response:
    """An actor's output, followed live."""
    actor_id = request.match_info["actor_id"]
    registry = request.app[registry_key]
    data = log_data(registry, actor_id)
    if data is None:
        return _page(
            _html.message_page("Unknown actor", f"The master knows no actor {actor_id}."), 404
        )
    view = View("log", actor_id=actor_id)
    lines = data["lines"]
    gap = ""
    if data["first"] > 1:
        gap = f"{data['first'] - 1} earlier lines are no longer retained"
    if len(lines) > _PAGE_LINES:
        gap = f"{len(lines) - _PAGE_LINES} earlier lines are in the download"
        lines = lines[-_PAGE_LINES:]
    actor = actor_data(registry, actor_id)
    title = f"{actor['class_name']} {actor_id}" if actor else actor_id
    body = (
        f'<h1>Logs of <span class="cls">{_html.esc(title)}</span></h1>'
        f'<div id="actor-head">{view.fragments(registry)["actor-head"]}</div>'
        f'<div id="log" class="log">{_html.log_lines(lines, gap=gap)}</div>'
    )
    return _page(_html.page(f"Logs of {title}", "actors", body, live=view.query(data["last"])))


@routes.get("/login")
async def _login_form(request: web.Request) -> web.Response:
    """The token form."""
    return _page(_html.login_page(_safe_next(request.query.get("next", "/"))))


@routes.post("/login")
async def _login(request: web.Request) -> web.StreamResponse:
    """Check the token; on success set the session cookie and go where the user was going."""
    form = await request.post()
    guard = request.app[guard_key]
    target = _safe_next(str(form.get("next", "/")))
    if not guard.required:
        raise web.HTTPSeeOther(target)
    if not guard.token_ok(str(form.get("token", ""))):
        return _page(_html.login_page(target, "That is not this cluster's token."), 401)
    redirect = web.HTTPSeeOther(target)
    guard.grant(redirect)
    raise redirect


def _safe_next(target: str) -> str:
    """A path on this dashboard to go to after logging in (never another site)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# -- live updates ---------------------------------------------------------------------------------
@routes.get("/live")
async def _live(request: web.Request) -> web.StreamResponse:
    """A page's WebSocket: it receives `{"replace": {id: html}, "append": {id: html}}` updates."""
    if not Guard.same_origin(request):
        raise web.HTTPForbidden(text="a page of another site may not follow this dashboard\n")
    view = _view(request)
    try:
        offset = int(request.query.get("offset", "0"))
    except ValueError:
        raise web.HTTPBadRequest(text="offset must be a line number\n") from None
    ws = web.WebSocketResponse(heartbeat=30.0)
    await ws.prepare(request)
    request.app[websockets_key].add(ws)
    hub = request.app[live_key]
    viewer = await hub.attach(ws, view, offset)
    try:
        async for _ in ws:  # pages send nothing; this waits for the close
            pass
    finally:
        hub.detach(viewer)
    return ws


# -- JSON API -------------------------------------------------------------------------------------
@routes.get("/api/cluster")
async def _api_cluster(request: web.Request) -> web.Response:
    """Totals, the master, and a page of the workers with their load history; `?page=N`."""
    view = _view(request, view="cluster")
    return web.json_response(cluster_data(request.app[registry_key], view.page))


@routes.get("/api/actors")
async def _api_actors(request: web.Request) -> web.Response:
    """A page of the actors, live then recently ended; `?client=ID`, `?state=...`, `?page=N`."""
    view = _view(request, view="actors")
    data = actors_data(
        request.app[registry_key],
        client=view.client or None,
        state=view.state or None,
        page=view.page,
    )
    return web.json_response(data)


@routes.get("/api/clients")
async def _api_clients(request: web.Request) -> web.Response:
    """A page of the connected clients; `?page=N`."""
    view = _view(request, view="clients")
    return web.json_response(clients_data(request.app[registry_key], view.page))


@routes.get("/api/actors/{actor_id}/logs")
async def _api_logs(request: web.Request) -> web.Response:
    """An actor's output lines numbered above `?offset=` (0: every retained line)."""
    try:
        offset = int(request.query.get("offset", "0"))
    except ValueError:
        raise web.HTTPBadRequest(text="offset must be a line number\n") from None
    data = log_data(request.app[registry_key], request.match_info["actor_id"], offset)
    if data is None:
        return _unknown_actor(request)
    return web.json_response(data)


@routes.get("/api/actors/{actor_id}/logs.txt")
async def _api_log_download(request: web.Request) -> web.Response:
    """The whole retained output of an actor, one line each: time, stream, text."""
    actor_id = request.match_info["actor_id"]
    data = log_data(request.app[registry_key], actor_id)
    if data is None:
        return _unknown_actor(request)
    text = "".join(
        f"{_stamp(line['time'])} [{line['stream']}] {line['text']}\n" for line in data["lines"]
    )
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", actor_id)
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"Content-Disposition": f'attachment; filename="actor-{safe}.log"'},
    )


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def _unknown_actor(request: web.Request) -> web.Response:
    body: dict[str, Any] = {"error": f"the master knows no actor {request.match_info['actor_id']}"}
    return web.json_response(body, status=404)
