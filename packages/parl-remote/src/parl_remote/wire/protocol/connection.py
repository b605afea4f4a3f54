"""The sans-I/O protocol: bytes in, messages out; messages in, bytes out. No sockets, no clocks.

A frame is::

    u32 envelope length | u32 buffer count n | n x u64 buffer lengths | envelope | buffers...

(little-endian). When the buffer count has its top bit (`SHM_FLAG`) set, the one buffer that
follows is a reference to a shared-memory segment that holds the real buffers (`wire/_shm.py`);
when it is `RETURN_FLAG`, the frame has no buffers and its envelope hands segments back. Both
are accepted only on an authenticated connection between a client and an actor of one host.
The envelope is a msgpack-encoded `Message`; the buffers are the out-of-band
pickle-5 buffers of its payload (numpy arrays), sent as they are and received straight into
memory of their exact size: a large buffer is never copied into a bigger bytes object. (That
memory is a plain `bytearray`: the allocator reuses warm pages, where fresh anonymous mappings
would fault every page in again on each 1-16 MB round trip.)

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

import pickle
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from parl_remote._exceptions import AuthenticationError, ProtocolError
from parl_remote.wire import _shm
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.handshake import (
    _AWAIT_CHALLENGE,
    _HANDSHAKE_SET,
    _OPEN,
    AUTHENTICATED,
    HANDSHAKE_LIMIT,
    NEED_DATA,
    Handshake,
)

__all__ = [
    "AUTHENTICATED",
    "CONTROL_SCRATCH",
    "Connection",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HANDSHAKE_LIMIT",
    "Held",
    "NEED_DATA",
    "RETURN_FLAG",
    "SHM_FLAG",
    "hold",
]

_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<Q")
DEFAULT_MAX_MESSAGE_BYTES = 8 << 30
_MAX_BUFFERS = 1 << 16
_DIRECT_READ_MIN = 64 << 10  # read a payload buffer in place when this much of it remains
_SCRATCH = 256 << 10
CONTROL_SCRATCH = 16 << 10
"""The read area of a connection of small messages only (the master's): `scratch_bytes`."""
SHM_FLAG = 1 << 31
RETURN_FLAG = 1 << 30


# receive states
_HEAD, _LENGTHS, _ENVELOPE, _BUFFERS = range(4)


class Held:
    """Out-of-band buffers made safe to send later, whatever their caller does meanwhile.

    `hold` makes them, and decides where they go: into a segment that the connection open at
    the time lends its peer, where they are large enough for its shared memory (that
    connection's `send` then copies nothing more: the segment is their one copy), else copied.
    `to(proto)` gives the buffers to send on `proto` (None: no connection open yet): on another
    connection than they were staged for, they are copied out of that segment, which is free
    again at once.
    """

    __slots__ = ("buffers", "link")

    def __init__(self, buffers: list[Any], link: Any) -> None:
        self.buffers = buffers
        self.link = link  # the `SharedLink` they were staged in, or None

    def to(self, proto: Connection | None) -> list[Any]:
        """The buffers to send on `proto` (the connection that carries them; None: queued)."""
        link = self.link
        if link is not None and (proto is None or proto.shm is not link):
            staged = self.buffers
            self.buffers, self.link = [bytes(b) for b in staged], None
            link.unstage(staged)
        return self.buffers


def hold(proto: Connection | None, buffers: list[Any]) -> Held:
    """`buffers` (out of band, views of the caller's memory) made safe to send later (`Held`).

    `proto`: the connection expected to carry them (None: none is open).
    """
    if not buffers:
        return Held(buffers, None)
    if proto is not None and proto.shm is not None and not proto.sends_views(buffers):
        link = proto.shm
        staged = link.stage(buffers)
        if staged is not None:
            return Held(staged, link)
    return Held([bytes(b) for b in buffers], None)


class Connection(Handshake):
    """One end of one connection: framing and size limits, over the handshake (`Handshake`).

    Args:
        role: this end's role, told to the peer (the other arguments but one: `Handshake`'s).
        max_message_bytes: the largest frame accepted once authenticated, buffers included.
        scratch_bytes: the read area small frames land in, 256 KiB by default (zeroed, so
            resident: a server of many connections of small messages gives `CONTROL_SCRATCH`).
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
        scratch_bytes: int | None = None,
    ) -> None:
        super().__init__(
            role, is_server=is_server, token=token, trusted=trusted, store=store, host=host
        )
        self.max_message_bytes = max_message_bytes
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
        self._scratch = memoryview(bytearray(scratch_bytes or _SCRATCH))
        self._direct = False
        self._flagged = self._returning = False

    # -- sending ---------------------------------------------------------------------------
    def send(self, msg: m.Message, buffers: list[Any] | tuple[Any, ...] = ()) -> list[Any]:
        """Return the buffers to write for `msg` and its out-of-band `buffers` (not copied)."""
        if not buffers:
            return [self.frame(msg)]
        if self._hs != _OPEN:
            raise ProtocolError(f"cannot send {type(msg).__name__} before the handshake completed")
        envelope = m.encoder.encode(msg)
        shm = self.shm  # segments are handed back only once nothing can fail the frame
        raws: list[Any] = [
            b.raw() if isinstance(b, pickle.PickleBuffer) else memoryview(b).cast("B")
            for b in buffers
        ]
        lengths = [r.nbytes for r in raws]
        total = len(envelope) + sum(lengths)
        if total > self.max_message_bytes:
            if shm is not None:
                shm.unstage(raws)  # never sent: a segment they were staged in is free again
            raise ProtocolError(self._too_large(total))
        pre = shm.returns(RETURN_FLAG) if shm is not None and shm.owed else b""
        if shm is not None and total - len(envelope) >= shm.threshold:
            ref = shm.place(raws, lengths)
            if ref is not None:
                head = _HEADER.pack(len(envelope), 1 | SHM_FLAG) + _LENGTH.pack(len(ref))
                return [pre + head + envelope, ref]
            # Over the cap: the socket carries them, copied, as a caller that skipped its own
            # copy for shared memory may change its arrays once this returns.
            raws = [bytes(r) for r in raws]
        head = _HEADER.pack(len(envelope), len(raws)) + struct.pack(f"<{len(raws)}Q", *lengths)
        return [pre + head + envelope, *raws]

    def frame(self, msg: m.Message) -> bytes:
        """The bytes to write for `msg`, a message without buffers: `send(msg)`'s one buffer."""
        if self._hs != _OPEN:
            raise ProtocolError(f"cannot send {type(msg).__name__} before the handshake completed")
        envelope = m.encoder.encode(msg)
        if len(envelope) > self.max_message_bytes:
            raise ProtocolError(self._too_large(len(envelope)))
        shm = self.shm  # segments are handed back only once nothing can fail the frame
        frame = _HEADER.pack(len(envelope), 0) + envelope
        return frame if shm is None or not shm.owed else shm.returns(RETURN_FLAG) + frame

    def sends_views(self, buffers: list[Any] | tuple[Any, ...]) -> bool:
        """Whether `send(msg, buffers)` gave frames that point into `buffers` themselves.

        False where they go through shared memory: written into a segment, or copied when
        none was free (`send`), as `hold` decides too; then the caller may change them at once.
        """
        shm = self.shm
        return shm is None or not shm.took(buffers)

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

    def received(self, nbytes: int) -> Any:
        """`buffer_updated(nbytes)`, then `next_event()`: the first event now available."""
        msg = self.whole_message(nbytes)
        if msg is not None:
            return (msg, ())
        self.buffer_updated(nbytes)
        return self.next_event()

    def whole_message(self, nbytes: int) -> Any:
        """The message of a read that is one whole small frame, decoded in place; else None.

        The common case of a small call or its reply -- an authenticated connection, nothing
        received before but not yet taken, and the `nbytes` just read into the scratch area
        exactly one whole frame without buffers -- is decoded there, and nothing else changes:
        the read is consumed. Otherwise (None) nothing is consumed: `received(nbytes)` or
        `buffer_updated(nbytes)` takes the read, and says what is wrong with it if anything is.
        """
        if (
            nbytes > _HEADER.size
            and self._hs == _OPEN
            and self._state == _HEAD
            and not self._direct
            and not self._in
            and not self._events
        ):
            scratch = self._scratch
            env_len, nbuf = _HEADER.unpack_from(scratch)
            if nbuf == 0 and env_len + _HEADER.size == nbytes <= self.max_message_bytes:
                try:
                    msg = m.decoder.decode(scratch[_HEADER.size : nbytes])
                except Exception:
                    return None  # the general path says what is wrong with it
                if type(msg) not in _HANDSHAKE_SET:
                    return msg
        return None

    @property
    def idle(self) -> bool:
        """Nothing received that was not taken: no event waiting, no frame begun."""
        return self._state == _HEAD and not self._in and not self._events

    def exchanger(
        self, sendall: Callable[[bytes], Any], recv_into: Callable[[memoryview], int]
    ) -> Callable[[m.Message], Any]:
        """A blocking caller's round trip of one small message, framed here, in one function.

        The function returned sends `msg` (a message without buffers) with `sendall`, reads
        once with `recv_into`, and returns the reply when that read is one whole frame without
        buffers, decoded where it lies. Otherwise the protocol takes the read and it returns
        None: `next_event()` then has the reply, or more is to be read. A message that cannot
        leave on its own (segments are owed to the peer, or it is too large) goes as `frame`
        makes it. For an authenticated connection that is `idle`, one request at a time: the
        blocking shell's round trip (`SyncConnection.exchange`). The I/O is the caller's.
        """
        limit, shm, head = self.max_message_bytes, self.shm, _HEADER.size
        scratch = self._scratch[: limit + head]  # a read taken whole is never over the limit
        encode, decode = m.encoder.encode, m.decoder.decode
        pack, unpack_from, handshake = _HEADER.pack, _HEADER.unpack_from, _HANDSHAKE_SET

        def exchange(msg: m.Message) -> Any:
            envelope = encode(msg)
            if len(envelope) <= limit and (shm is None or not shm.owed):
                sendall(pack(len(envelope), 0) + envelope)
            else:
                sendall(self.frame(msg))  # segments handed back first; or too large: raises
            n = recv_into(scratch)
            if n > head:
                env_len, nbuf = unpack_from(scratch)
                if nbuf == 0 and env_len + head == n:
                    try:
                        reply = decode(scratch[head:n])
                    except Exception:
                        pass  # the general path says what is wrong with it
                    else:
                        if type(reply) not in handshake:
                            return reply
            elif n == 0:
                raise ConnectionError("the peer closed the connection")
            self.buffer_updated(n)  # the same memory: `get_buffer`'s scratch area
            return None

        return exchange

    def dispatcher(
        self, kind: type, on_message: Callable[[Any], None], on_other: Callable[[int], None]
    ) -> Callable[[int], None]:
        """A `buffer_updated` for a server's small messages, framed here, in one function.

        The function returned hands a read that is one whole frame of a `kind` message
        without buffers, with nothing received before it that was not taken, to
        `on_message(msg)`, decoded in place; it hands every other read to `on_other(nbytes)`,
        which must give it to `buffer_updated` (the actor's lane for small calls,
        `actor/_calls.py`). For an authenticated connection whose events are all taken.
        """
        head, limit = _HEADER.size, self.max_message_bytes
        scratch = self._scratch[: limit + head]  # a read taken whole is never over the limit
        decode, unpack_from = m.decoder.decode, _HEADER.unpack_from

        def dispatch(nbytes: int) -> None:
            if nbytes > head and self._state == _HEAD and not self._in and self._hs == _OPEN:
                env_len, nbuf = unpack_from(scratch)
                if nbuf == 0 and env_len + head == nbytes:
                    try:
                        msg = decode(scratch[head:nbytes])
                    except Exception:
                        pass  # the general path says what is wrong with it
                    else:
                        if type(msg) is kind:
                            on_message(msg)
                            return
            on_other(nbytes)

        return dispatch

    def receive_data(self, data: bytes | memoryview) -> None:
        """Feed received bytes; complete messages become available from `next_event()`."""
        if self._error is not None:
            raise self._error
        try:
            if self._hs == _AWAIT_CHALLENGE and self._state == _HEAD:
                self._check_not_tls(bytes(self._in) + bytes(data[:3]))
            self._receive(memoryview(data))
        except (ProtocolError, AuthenticationError) as exc:
            self._fail(exc)
            raise

    @property
    def has_events(self) -> bool:
        """Whether `next_event` has an event now (`take_events` would return some)."""
        return bool(self._events)

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
