"""The master: the cluster's control plane and its one source of truth.

`_master` is the process (its connections, its timers, the apps it serves); `_registry` holds
what it knows about workers, clients and actors, and `_status` the frozen records read from it;
`_placement` decides, without sockets or clocks, where each actor runs; `_apps` finds and serves
the web applications other distributions register (the dashboard).
"""

from __future__ import annotations

__all__: list[str] = []
