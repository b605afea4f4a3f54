"""The sans-I/O protocol: bytes in, messages out; messages in, bytes out.

`messages` defines every envelope of the cluster's connections (one tagged union, one decoder),
`handshake` the token's challenge-response, and `connection` the framing, size limits and
handshake state of one connection. No sockets, no clocks: the shells live in `wire/_transport`.
"""

from __future__ import annotations

__all__: list[str] = []
