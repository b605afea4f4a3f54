"""The sans-I/O protocol: bytes in, messages out; messages in, bytes out. No sockets, no clocks.

A frame is::

    u32 envelope length | u32 buffer count n | n x u64 buffer lengths | envelope | buffers...

(little-endian). When the buffer count has its top bit (`SHM_FLAG`) set, the one buffer that
follows is a reference to a shared-memory segment that holds the real buffers (`_shm.py`);
when it is `RETURN_FLAG`, the frame has no buffers and its envelope hands segments back. Both
are accepted only on an authenticated connection between a client and an actor of one host.
The envelope is a msgpack-encoded `Message`; the buffers are the out-of-band
pickle-5 buffers of its payload (numpy arrays), sent as they are and received straight into
memory of their exact size: a large buffer is never copied into a bigger bytes object. (That
memory is a plain `bytearray`: the allocator reuses warm pages, which made 1-16 MB round trips
two to five times faster than fresh anonymous mappings, page faults and all.)

Every TCP connection starts with a mutual HMAC challenge-response on the cluster token
(`Challenge` / `Hello` / `Welcome`); until it completes only those messages, each at most
`HANDSHAKE_LIMIT` bytes and without buffers, are accepted, so a peer without the token never
gets past a few hundred bytes of msgpack and never reaches unpickling. After it, a frame may be
at most `max_message_bytes`. Any violation raises `ProtocolError` (or `AuthenticationError`),
and the connection is finished: the I/O shell closes it.

Both shells drive the same object: `receive_data(bytes)` or, for zero-copy reads,
`get_buffer()` / `buffer_updated(n)`; then `next_event()` until it returns `NEED_DATA`;
`send(msg, buffers)` returns the list of buffers to write; `data_to_send()` returns handshake
replies that receiving produced.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import struct
from collections import deque
from typing import Any, cast

import msgspec

from parl_remote import _shm
from parl_remote._exceptions import AuthenticationError, ProtocolError
from parl_remote.protocol import messages as m

__all__ = [
    "AUTHENTICATED",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HANDSHAKE_LIMIT",
    "NEED_DATA",
    "RETURN_FLAG",
    "SHM_FLAG",
    "Connection",
]

_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<Q")
HANDSHAKE_LIMIT = 1024
DEFAULT_MAX_MESSAGE_BYTES = 8 << 30
_MAX_BUFFERS = 1 << 16
_DIRECT_READ_MIN = 64 << 10  # read a payload buffer in place when this much of it remains
_SCRATCH = 256 << 10
_HANDSHAKE_TYPES = (m.Challenge, m.Hello, m.Welcome, m.Refused)
_HANDSHAKE_SET = frozenset(_HANDSHAKE_TYPES)
SHM_FLAG = 1 << 31
RETURN_FLAG = 1 << 30
_SHM_ROLES = frozenset(("client", "actor"))


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Any = _Sentinel("NEED_DATA")
"""`next_event()` has nothing more until more bytes arrive."""
AUTHENTICATED: Any = _Sentinel("AUTHENTICATED")
"""`next_event()` reports, once, that the handshake completed."""

# receive states
_HEAD, _LENGTHS, _ENVELOPE, _BUFFERS = range(4)
# handshake states
_AWAIT_CHALLENGE, _AWAIT_HELLO, _AWAIT_WELCOME, _OPEN, _FAILED = range(5)


def _digest(
    token: bytes, label: bytes, role: str, server_nonce: bytes, client_nonce: bytes
) -> bytes:
    data = b"|".join((b"parl", label, role.encode(), server_nonce, client_nonce))
    return hmac.new(token, data, hashlib.sha256).digest()


class Connection:
    """One end of one connection: framing, size limits and the handshake state machine.

    Args:
        role: what this end is ("master", "worker", "actor", "client", ...); told to the peer.
        is_server: the accepting end sends the challenge.
        token: the cluster token; None with `trusted=True` only.
        trusted: skip the handshake (a private socket pair between a worker and its child).
        max_message_bytes: the largest frame accepted once authenticated, buffers included.
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
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
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
        self.max_message_bytes = max_message_bytes
        self._token = cast(bytes, token)  # None only when trusted: no handshake reads it
        self._nonce = os.urandom(32)
        self._peer_nonce = b""
        self._peer_host = ""
        self._hs = _OPEN if trusted else (_AWAIT_HELLO if is_server else _AWAIT_CHALLENGE)
        self._error: Exception | None = None
        self._outgoing: list[bytes] = []
        self._events: deque[Any] = deque()
        # receive state
        self._state = _HEAD
        self._need = _HEADER.size
        self._in = bytearray()
        self._env_len = 0
        self._nbuf = 0
        self._lengths: tuple[int, ...] = ()
        self._buffers: list[Any] = []
        self._cur: Any = None  # a memoryview while a buffer fills
        self._filled = 0
        self._scratch = memoryview(bytearray(_SCRATCH))
        self._direct = False
        self._store = store
        self._host = host if store is not None else ""
        self.shm: Any = None  # a `_shm.SharedLink`, once the peer is known to share this host
        self._flagged = self._returning = False

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

    @property
    def has_output(self) -> bool:
        """True when receiving produced handshake frames that `data_to_send` will return."""
        return bool(self._outgoing)

    def data_to_send(self) -> list[bytes]:
        """Return (and forget) frames that processing received data produced."""
        out, self._outgoing = self._outgoing, []
        return out

    # -- sending ---------------------------------------------------------------------------
    def send(self, msg: m.Message, buffers: list[Any] | tuple[Any, ...] = ()) -> list[Any]:
        """Return the buffers to write for `msg` and its out-of-band `buffers` (not copied)."""
        if self._hs != _OPEN:
            raise ProtocolError(f"cannot send {type(msg).__name__} before the handshake completed")
        envelope = m.encoder.encode(msg)
        pre = b"" if self.shm is None else self.shm.returns(RETURN_FLAG)  # segments handed back
        if not buffers:
            if len(envelope) > self.max_message_bytes:
                raise ProtocolError(self._too_large(len(envelope)))
            return [pre + _HEADER.pack(len(envelope), 0) + envelope]
        raws: list[Any] = [
            b.raw() if isinstance(b, pickle.PickleBuffer) else memoryview(b).cast("B")
            for b in buffers
        ]
        lengths = [r.nbytes for r in raws]
        total = len(envelope) + sum(lengths)
        if total > self.max_message_bytes:
            raise ProtocolError(self._too_large(total))
        if self.shm is not None and total - len(envelope) >= self.shm.threshold:
            name = self.shm.place(raws, lengths)
            if name is not None:
                ref = _shm.encode_ref(name, lengths)
                head = _HEADER.pack(len(envelope), 1 | SHM_FLAG) + _LENGTH.pack(len(ref))
                return [pre + head + envelope, ref]
            # Over the cap: the socket carries them, copied, as a caller that skipped its own
            # copy for shared memory may change its arrays once this returns.
            raws = [bytes(r) for r in raws]
        head = _HEADER.pack(len(envelope), len(raws)) + struct.pack(f"<{len(raws)}Q", *lengths)
        return [pre + head + envelope, *raws]

    def _frame(self, msg: m.Message) -> bytes:
        envelope = m.encoder.encode(msg)
        return _HEADER.pack(len(envelope), 0) + envelope

    def _too_large(self, size: int) -> str:
        return (
            f"a message of {size} bytes exceeds the limit of {self.max_message_bytes} bytes; "
            "raise PARL_MAX_MESSAGE_BYTES on both ends, or send less at once"
        )

    # -- receiving -------------------------------------------------------------------------
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Return memory to read into: the payload buffer in progress, or a scratch area."""
        if (
            self._state == _BUFFERS
            and self._cur is not None
            and len(self._cur) - self._filled >= _DIRECT_READ_MIN
        ):
            self._direct = True
            view: memoryview = self._cur[self._filled :]
            return view
        self._direct = False
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        """Account for `nbytes` read into the memory `get_buffer` returned."""
        if self._direct:
            self._filled += nbytes
            if self._filled == len(self._cur):
                self._finish_buffer()
        else:
            self.receive_data(self._scratch[:nbytes])

    def receive_data(self, data: bytes | memoryview) -> None:
        """Feed received bytes; complete messages become available from `next_event()`."""
        if self._error is not None:
            raise self._error
        try:
            self._receive(memoryview(data))
        except (ProtocolError, AuthenticationError) as exc:
            self._fail(exc)
            raise

    def take_events(self) -> list[Any]:
        """Return (and forget) every event available now, in one list.

        The same events `next_event` would return, one by one, until `NEED_DATA`.
        """
        events = list(self._events)
        self._events.clear()
        return events

    def next_event(self) -> Any:
        """Return the next `(message, buffers)` pair, `AUTHENTICATED`, or `NEED_DATA`."""
        if self._events:
            return self._events.popleft()
        if self._error is not None:
            raise self._error
        return NEED_DATA

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        self._hs = _FAILED

    def _receive(self, mv: memoryview) -> None:
        pos, end = 0, len(mv)
        while pos < end:
            if self._error is not None:
                raise self._error
            if self._state == _BUFFERS:
                take = min(end - pos, len(self._cur) - self._filled)
                self._cur[self._filled : self._filled + take] = mv[pos : pos + take]
                self._filled += take
                pos += take
                if self._filled == len(self._cur):
                    self._finish_buffer()
                continue
            if self._state == _HEAD and not self._in and end - pos >= _HEADER.size:
                # Fast path: a whole buffer-less frame in hand, decoded without copying.
                env_len, nbuf = _HEADER.unpack_from(mv, pos)
                if nbuf == 0 and end - pos - _HEADER.size >= env_len:
                    start = pos + _HEADER.size
                    if self._hs == _OPEN and 0 < env_len <= self.max_message_bytes:
                        # The common case, inlined: an authenticated connection's small message.
                        try:
                            msg = m.decoder.decode(mv[start : start + env_len])
                        except Exception:
                            msg = self._decode(mv[start : start + env_len])  # raises ours
                        if type(msg) in _HANDSHAKE_SET:
                            raise ProtocolError(
                                f"an unexpected {type(msg).__name__} after the handshake"
                            )
                        self._events.append((msg, ()))
                    else:
                        self._check_header(env_len, nbuf)
                        self._deliver(self._decode(mv[start : start + env_len]), ())
                    pos = start + env_len
                    continue
            take = min(end - pos, self._need - len(self._in))
            self._in += mv[pos : pos + take]
            pos += take
            if len(self._in) == self._need:
                self._advance()

    def _check_header(self, env_len: int, nbuf: int) -> None:
        if self._hs != _OPEN:
            if nbuf or env_len > HANDSHAKE_LIMIT:
                raise ProtocolError(
                    f"a frame of {env_len} bytes with {nbuf} buffers before the handshake "
                    f"completed (at most {HANDSHAKE_LIMIT} bytes, no buffers)"
                )
        elif env_len > self.max_message_bytes or nbuf > _MAX_BUFFERS:
            raise ProtocolError(
                f"a frame declares {env_len} bytes and {nbuf} buffers; the limits are "
                f"{self.max_message_bytes} bytes and {_MAX_BUFFERS} buffers"
            )
        if env_len == 0:
            raise ProtocolError("a frame with an empty envelope")

    def _check_shm_header(self) -> None:
        if self.shm is None or self._hs != _OPEN:
            raise ProtocolError("a shared-memory frame from a peer not known to share this host")
        if self._nbuf == RETURN_FLAG and self._env_len <= _shm.MAX_REF:
            self._returning, self._nbuf = True, 0  # a hand-back of segments, at most MAX_REF
        elif self._nbuf == 1 | SHM_FLAG:
            self._nbuf = 1
        else:  # a reference must come alone
            raise ProtocolError(f"a shared-memory frame of {self._env_len} bytes, {self._nbuf:#x}")

    def _advance(self) -> None:
        data = self._in
        if self._state == _HEAD:
            self._env_len, self._nbuf = _HEADER.unpack(data)
            self._flagged = bool(self._nbuf & SHM_FLAG)
            if self._flagged or self._nbuf == RETURN_FLAG:
                self._check_shm_header()
            self._check_header(self._env_len, self._nbuf)
            self._in = bytearray()
            if self._nbuf:
                self._state, self._need = _LENGTHS, _LENGTH.size * self._nbuf
            else:
                self._state, self._need = _ENVELOPE, self._env_len
        elif self._state == _LENGTHS:
            self._lengths = struct.unpack(f"<{self._nbuf}Q", data)
            if self._flagged and self._lengths[0] > _shm.MAX_REF:
                raise ProtocolError(
                    f"a shared-memory reference of {self._lengths[0]} bytes "
                    f"(at most {_shm.MAX_REF})"
                )
            total = self._env_len + sum(self._lengths)
            if total > self.max_message_bytes:
                raise ProtocolError(
                    f"a frame declares {total} bytes in all; the limit is {self.max_message_bytes}"
                )
            self._in = bytearray()
            self._state, self._need = _ENVELOPE, self._env_len
        elif self._state == _ENVELOPE and self._returning:
            self._returning = False
            self.shm.returned(_shm.decode_returns(data, self.shm.store.pattern))
            self._in = bytearray()
            self._reset()
        elif self._state == _ENVELOPE:
            self._pending: Any = self._decode(data)
            self._in = bytearray()
            if self._nbuf:
                self._buffers = []
                self._state = _BUFFERS
                self._start_buffer()
            else:
                self._reset()
                self._deliver(self._pending, ())

    def _start_buffer(self) -> None:
        while len(self._buffers) < self._nbuf:
            n = self._lengths[len(self._buffers)]
            if n:
                self._raw: bytearray | None = bytearray(n)
                self._cur = memoryview(self._raw)
                self._filled = 0
                return
            self._buffers.append(bytearray())
        self._complete_buffers()

    def _finish_buffer(self) -> None:
        self._cur = None
        self._buffers.append(self._raw)
        self._raw = None
        self._start_buffer()

    def _complete_buffers(self) -> None:
        msg, buffers = self._pending, tuple(self._buffers)
        self._pending, self._buffers = None, []
        self._reset()
        if self._flagged:
            self._flagged = False
            buffers = self.shm.take(buffers[0], self.max_message_bytes, _MAX_BUFFERS)
        self._deliver(msg, buffers)

    def _reset(self) -> None:
        self._state, self._need = _HEAD, _HEADER.size
        self._cur = None
        self._direct = False

    def _decode(self, data: bytes | bytearray | memoryview) -> m.Message:
        try:
            return m.decoder.decode(data)
        except msgspec.MsgspecError as exc:
            raise ProtocolError(f"an undecodable frame: {exc}") from None
        except Exception as exc:  # msgspec may raise others on adversarial input
            raise ProtocolError(f"an undecodable frame: {type(exc).__name__}: {exc}") from None

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
            self._outgoing.append(
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
                self._outgoing.append(self._frame(m.Refused(reason)))
                raise ProtocolError(f"refused a {msg.role!r} peer: {reason}")
            if not hmac.compare_digest(expected, msg.digest):
                self._outgoing.append(self._frame(m.Refused("wrong cluster token")))
                raise AuthenticationError(
                    f"refused a {msg.role!r} peer that does not know the cluster token"
                )
            self.peer_role = msg.role
            self._peer_nonce = msg.nonce
            self._share_if_local(msg.host)
            proof = _digest(self._token, b"welcome", self.role, self._nonce, msg.nonce)
            self._outgoing.append(self._frame(m.Welcome(proof)))
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
            self.shm = self._store.link()

    def release_segments(self) -> None:
        """Remove this end's segments and forget the peer's (on close)."""
        if self.shm is not None:
            self.shm.close()

    def _check_version(self, version: int) -> None:
        if version != m.PROTOCOL_VERSION:
            raise ProtocolError(
                f"the peer speaks protocol version {version}, this end {m.PROTOCOL_VERSION}; "
                "install the same parl-remote version on both ends"
            )
