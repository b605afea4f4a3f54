"""Master apps: web applications that other distributions register for the master to serve.

A distribution declares a factory under the entry-point group `parl_remote.master_apps` in its
`pyproject.toml` (parl-dashboard does so):

    [project.entry-points."parl_remote.master_apps"]
    dashboard = "parl_dashboard:master_app"

`factory(registry, *, host, token)` returns an `aiohttp.web.Application` over the master's
`parl_remote.Registry` (which it reads through its public, read-only side); `host` is the
address the master binds and `token` the cluster token, for an app that must ask for it beyond
loopback. A master started with a monitor port serves the first app by name from its own event
loop on that port. parl-remote never imports any app by name, and runs fine with none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from parl_remote._config import settings
from parl_remote._util import outward_ip
from parl_remote.master._registry import Registry
from parl_remote.security import _tls

__all__ = ["GROUP", "ServedApp", "serve_master_app"]

logger = logging.getLogger(__name__)

GROUP = "parl_remote.master_apps"


@dataclass(frozen=True)
class ServedApp:
    """A master app being served."""

    name: str
    """Its entry point's name."""
    url: str
    """Where a browser reaches it."""
    runner: Any
    """Its `aiohttp.web.AppRunner`; `await runner.cleanup()` stops it."""


async def serve_master_app(
    registry: Registry, host: str, port: int, token: bytes | None, *, group: str = GROUP
) -> ServedApp | None:
    """Serve the first app registered under `group` on `host:port`; None if none could be.

    What went wrong (nothing registered, an app that does not import, a port taken) is logged,
    and the master serves on without an app.
    """
    found = sorted(entry_points(group=group), key=lambda ep: ep.name)
    if not found:
        logger.info(
            "no dashboard: parl-dashboard is not installed (nothing is registered under the "
            "entry-point group %s)",
            group,
        )
        return None
    entry = found[0]
    for other in found[1:]:
        logger.warning(
            "master app %s (%s) is not served: the monitor port serves %s",
            other.name,
            other.value,
            entry.name,
        )
    try:
        factory = entry.load()
        from aiohttp import web
    except ImportError as exc:
        owner = entry.dist.name if entry.dist is not None else entry.value
        logger.info("no dashboard: %s is not installed (%s)", owner, exc)
        return None
    app = factory(registry, host=host, token=token)
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=1.0, keepalive_timeout=settings.idle_timeout_s
    )
    await runner.setup()
    try:
        ssl_context = _tls.server_context()[0] if _tls.enabled() else None  # HTTPS
        await web.TCPSite(runner, host or None, port, ssl_context=ssl_context).start()
    except OSError as exc:
        await runner.cleanup()
        logger.warning("no dashboard: it could not listen on %s:%d: %s", host, port, exc)
        return None
    shown = outward_ip() if host in ("", "0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    scheme = "https" if _tls.enabled() else "http"
    served = ServedApp(entry.name, f"{scheme}://{shown}:{runner.addresses[0][1]}/", runner)
    logger.info("%s at %s", entry.name, served.url)
    return served
