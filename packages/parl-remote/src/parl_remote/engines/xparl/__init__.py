"""The xparl engine: the client's link to an xparl master, its actors' calls, its clusters.

`_client` is the process's `Client` (its link to the master, actor creation, fates, kills: the
`Engine` of `client/_engine.py`); `_actor_ref` is the reference every handle of one actor
shares, and `_drivers` its two mirror-image drivers over `client/_call_core` (blocking and
pipelined) that move the bytes straight to the actor's process; `_cluster` starts and stops
masters and workers as background processes (`xparl start`, the local cluster of
`parl.connect()`).
"""

from __future__ import annotations

from parl_remote.engines.xparl._client import Client

__all__ = ["Client"]
