"""The handshake half of the sans-I/O protocol: who the peer is, and that it knows the token.

Every TCP connection starts with a mutual HMAC challenge-response on the cluster token: the
server's `Challenge` (its role and a fresh nonce), the client's `Hello` (its role, its nonce
and a digest of both under the token), the server's `Welcome` (its own digest back) or
`Refused`. `Handshake` holds that state machine and what it learns (the peer's role, whether
it shares this host's memory); `connection.Connection` builds the framing on it. Nothing here
touches sockets or clocks.

A plaintext client of a TLS cluster gets no frame of this protocol: the server answers with a
TLS record (an alert) and closes. The client knows it by its first bytes, which no challenge
can begin with, and says that the cluster requires TLS (`TLS_REQUIRED`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections import deque
from typing import Any, cast

from parl_remote._exceptions import AuthenticationError, ProtocolError
from parl_remote.wire._shm_link import SharedLink
from parl_remote.wire.protocol import messages as m

__all__ = [
    "AUTHENTICATED",
    "HANDSHAKE_LIMIT",
    "Handshake",
    "NEED_DATA",
    "TLS_REQUIRED",
]

HANDSHAKE_LIMIT = 1024
_HANDSHAKE_TYPES = (m.Challenge, m.Hello, m.Welcome, m.Refused)
_HANDSHAKE_SET = frozenset(_HANDSHAKE_TYPES)
_SHM_ROLES = frozenset(("client", "actor"))
_FRAME_HEAD = struct.Struct("<II")  # as in connection.py: envelope length, no buffers
_TLS_CONTENT_TYPES = frozenset(range(0x14, 0x18))  # change_cipher_spec, alert, handshake, data
TLS_REQUIRED = (
    "this PARL cluster requires TLS: connect with parl.connect(address, tls=True) or "
    "PARL_TLS=1 (xparl: --tls)"
)
"""What a plaintext client of a TLS cluster is told."""


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Any = _Sentinel("NEED_DATA")
"""`next_event()` has nothing more until more bytes arrive."""
AUTHENTICATED: Any = _Sentinel("AUTHENTICATED")
"""`next_event()` reports, once, that the handshake completed."""

# states
_AWAIT_CHALLENGE, _AWAIT_HELLO, _AWAIT_WELCOME, _OPEN, _FAILED = range(5)


def _digest(
    token: bytes, label: bytes, role: str, server_nonce: bytes, client_nonce: bytes
) -> bytes:
    data = b"|".join((b"parl", label, role.encode(), server_nonce, client_nonce))
    return hmac.new(token, data, hashlib.sha256).digest()


class Handshake:
    """The handshake state of one end of a connection (see the module docstring).

    Args:
        role: what this end is ("master", "worker", "actor", "client", ...); told to the peer.
        is_server: the accepting end sends the challenge.
        token: the cluster token; None with `trusted=True` only.
        trusted: skip the handshake (a private socket pair between a worker and its child).
        store: a `_shm.SegmentStore`: large buffers travel through shared memory when the peer
            proves (in the handshake) to be a client or actor on this same host.
        host: this host's id (`_shm.host_id()`), told to the peer with `store`.
    """

    def __init__(
        self,
        role: str,
        *,
        is_server: bool,
        token: bytes | None,
        trusted: bool = False,
        store: Any = None,
        host: str = "",
    ) -> None:
        if token is None and not trusted:
            raise AuthenticationError(
                "no cluster token: set PARL_CLUSTER_TOKEN, or run on a machine where "
                "`xparl start` created the token file"
            )
        self.role = role
        self.peer_role: str | None = None
        self.is_server = is_server
        self._token = cast(bytes, token)  # None only when trusted: no handshake reads it
        self._nonce = os.urandom(32)
        self._peer_nonce = b""
        self._peer_host = ""
        self._hs = _OPEN if trusted else (_AWAIT_HELLO if is_server else _AWAIT_CHALLENGE)
        self._error: Exception | None = None
        self._outgoing: list[bytes] = []
        self.has_output = False
        """True when receiving produced handshake frames that `data_to_send` will return."""
        self._events: deque[Any] = deque()
        self._store = store
        self._host = host if store is not None else ""
        self.shm: Any = None  # a `SharedLink`, once the peer is known to share this host

    # -- state -----------------------------------------------------------------------------
    @property
    def authenticated(self) -> bool:
        """True once the handshake completed (immediately for trusted connections)."""
        return self._hs == _OPEN

    def initiate(self) -> list[bytes]:
        """Return the server's opening `Challenge` frame (nothing on the client side)."""
        if self.is_server and self._hs == _AWAIT_HELLO:
            challenge = m.Challenge(m.PROTOCOL_VERSION, self.role, self._nonce, self._host)
            return [self._frame(challenge)]
        return []

    def data_to_send(self) -> list[bytes]:
        """Return (and forget) frames that processing received data produced."""
        out, self._outgoing = self._outgoing, []
        self.has_output = False
        return out

    def _emit(self, frame: bytes) -> None:
        self._outgoing.append(frame)
        self.has_output = True

    def _frame(self, msg: m.Message) -> bytes:
        envelope = m.encoder.encode(msg)
        return _FRAME_HEAD.pack(len(envelope), 0) + envelope

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        self._hs = _FAILED

    # -- the handshake ---------------------------------------------------------------------
    def _deliver(self, msg: m.Message, buffers: tuple[Any, ...]) -> None:
        if self._hs == _OPEN:
            if isinstance(msg, _HANDSHAKE_TYPES):
                raise ProtocolError(f"an unexpected {type(msg).__name__} after the handshake")
            self._events.append((msg, buffers))
            return
        if self._hs == _AWAIT_CHALLENGE and isinstance(msg, m.Challenge):
            self._check_version(msg.version)
            self.peer_role = msg.role
            self._peer_nonce = msg.nonce
            digest = _digest(self._token, b"hello", self.role, msg.nonce, self._nonce)
            self._emit(
                self._frame(m.Hello(m.PROTOCOL_VERSION, self.role, self._nonce, digest, self._host))
            )
            self._peer_host = msg.host
            self._hs = _AWAIT_WELCOME
        elif self._hs == _AWAIT_HELLO and isinstance(msg, m.Hello):
            expected = _digest(self._token, b"hello", msg.role, self._nonce, msg.nonce)
            if msg.version != m.PROTOCOL_VERSION:
                reason = (
                    f"protocol version {msg.version} is not {m.PROTOCOL_VERSION}; "
                    "install the same parl-remote version on both ends"
                )
                self._emit(self._frame(m.Refused(reason)))
                raise ProtocolError(f"refused a {msg.role!r} peer: {reason}")
            if not hmac.compare_digest(expected, msg.digest):
                self._emit(self._frame(m.Refused("wrong cluster token")))
                raise AuthenticationError(
                    f"refused a {msg.role!r} peer that does not know the cluster token"
                )
            self.peer_role = msg.role
            self._peer_nonce = msg.nonce
            self._share_if_local(msg.host)
            proof = _digest(self._token, b"welcome", self.role, self._nonce, msg.nonce)
            self._emit(self._frame(m.Welcome(proof)))
            self._hs = _OPEN
            self._events.append(AUTHENTICATED)
        elif self._hs == _AWAIT_WELCOME and isinstance(msg, m.Welcome):
            expected = _digest(
                self._token, b"welcome", self.peer_role or "", self._peer_nonce, self._nonce
            )
            if not hmac.compare_digest(expected, msg.digest):
                raise AuthenticationError(
                    f"the {self.peer_role} did not prove it knows the cluster token; "
                    "check PARL_CLUSTER_TOKEN on both machines"
                )
            self._share_if_local(self._peer_host)
            self._hs = _OPEN
            self._events.append(AUTHENTICATED)
        elif isinstance(msg, m.Refused):
            raise AuthenticationError(
                f"the {self.peer_role or 'server'} refused this connection: {msg.reason}"
                + (
                    " (check PARL_CLUSTER_TOKEN / the token file on both machines)"
                    if "token" in msg.reason
                    else ""
                )
            )
        else:
            raise ProtocolError(f"an unexpected {type(msg).__name__} during the handshake")

    def _share_if_local(self, peer_host: str) -> None:
        if self._host and peer_host == self._host and {self.role, self.peer_role} == _SHM_ROLES:
            self.shm = SharedLink(self._store)

    def release_segments(self) -> None:
        """Remove this end's segments and forget the peer's (on close)."""
        if self.shm is not None:
            self.shm.close()

    def _check_not_tls(self, head: bytes) -> None:
        """Raise if the server's first bytes are a TLS record: the cluster requires TLS.

        A record opens with its content type and a 3.x version (3.1 to 3.4): read as a frame
        header, that declares an envelope of over 64 KiB, which no challenge is.
        """
        if len(head) >= 3 and head[0] in _TLS_CONTENT_TYPES and head[1] == 3 and 1 <= head[2] <= 4:
            raise AuthenticationError(f"the server answered in TLS: {TLS_REQUIRED}")

    def _check_version(self, version: int) -> None:
        if version != m.PROTOCOL_VERSION:
            raise ProtocolError(
                f"the peer speaks protocol version {version}, this end {m.PROTOCOL_VERSION}; "
                "install the same parl-remote version on both ends"
            )
