"""The client side, whichever engine runs the actors: what a user process holds of them.

`_remote_class` makes `@parl.remote_class` and its handles from a class's `_spec`; `_engine` is
the seam the handles ask (an engine places actors and makes the reference every handle of one
actor shares), found by name; `_connect` keeps this process's one engine (`parl.connect`);
`_call_core` decides everything about a call, without I/O, for every engine's drivers; a
future-mode call's result is a `_future.RemoteFuture`; `_bundle` zips the user's own modules for
the actor processes.
"""

from __future__ import annotations

__all__: list[str] = []
