"""The actor process: a warm process that a worker started becomes one actor and serves it.

`_host` is the process itself (its start-up, its `Assign`, its link to the worker and its
listening socket); `_calls` runs the clients' calls in the order they arrive; `_shadow` tracks
which methods the instance's attributes hide; `_preload` imports what earlier actors of the
cluster needed, before this process is assigned. Nothing here runs in a client or a worker
except `_preload.learn`, the rule by which the worker and the master merge what was learned.
"""

from __future__ import annotations

__all__: list[str] = []
