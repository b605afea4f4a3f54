"""The client side: what a user process holds of its actors.

`_remote_class` makes `@parl.remote_class` and its handles; `_actor_ref` is the shared reference
every handle of one actor holds; `_call_core` decides everything about a call, without I/O, and
`_drivers` are its two mirror-image drivers (blocking and pipelined) that move the bytes;
`_connect` keeps this process's one connection to an engine (`parl.connect`); `_bundle` zips the
user's own modules for the actor processes.
"""

from __future__ import annotations

__all__: list[str] = []
