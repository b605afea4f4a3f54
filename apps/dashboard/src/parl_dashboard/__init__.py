"""parl_dashboard: the cluster's resources, actors and logs in the browser.

`create_app(registry)` is an aiohttp application over a master's live registry (a
`parl_remote.Registry`). The master (`xparl start`, or the local cluster of `parl.connect()`)
finds `master_app` through the entry-point group `parl_remote.master_apps` and serves it from
its own event loop on its monitor port when this package is installed; see the README's
Dashboard section for the pages and the JSON API.
"""

from __future__ import annotations

from parl_dashboard._app import create_app, master_app
from parl_dashboard._auth import is_loopback

__all__ = ["create_app", "is_loopback", "master_app"]
