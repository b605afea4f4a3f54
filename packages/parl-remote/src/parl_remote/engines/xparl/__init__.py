"""The xparl engine: the client's link to an xparl master, and the clusters it starts.

`_client` is the process's `Client` (its link to the master, actor creation, fates, kills);
`_cluster` starts and stops masters and workers as background processes (`xparl start`, the
local cluster of `parl.connect()`).
"""

from __future__ import annotations

__all__: list[str] = []
