"""The wire: what travels between the cluster's processes, and how.

`protocol/` is the sans-I/O core (the envelopes, the framing, the handshake); `_transport` holds
its two I/O shells (blocking sockets and asyncio); `_serialize` pickles arguments and results
with out-of-band buffers; `_shm` and `_shm_link` carry large buffers through shared memory
between processes of one host, in the segments of `_segment` (memfds, mapped by reference);
`_signal` and `_flags` wake the other side of a turn-taking exchange over shared memory (what
`parl_remote.shm` makes public); `_link` keeps a process's link to the master alive.
"""

from __future__ import annotations

__all__: list[str] = []
