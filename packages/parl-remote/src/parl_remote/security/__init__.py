"""Security: who may speak to the cluster, and over what.

Every connection proves it knows the cluster token by the handshake of `wire/protocol`; with
`--tls` it speaks TLS 1.3 first. `_tls` holds the settings and sockets, `_tls_context` this
process's contexts, `_tls_certs` makes a cluster's own CA and certificates, and `_tls_join`
lets a client or worker join a TLS cluster with nothing but its token.
"""

from __future__ import annotations

__all__: list[str] = []
