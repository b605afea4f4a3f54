"""The sans-I/O decoder under property-based fuzzing: only the protocol's own errors, ever.

Whatever bytes arrive -- random, truncated, huge declared lengths, well-formed frames of a type
that is wrong for the connection's state -- `Connection` either waits for more data, delivers
messages, or raises `ProtocolError` / `AuthenticationError`; and it never allocates more than
its frame limit.
"""

from __future__ import annotations

import struct
import tracemalloc

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parl_remote._exceptions import AuthenticationError, ProtocolError
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import NEED_DATA, Connection

pytestmark = pytest.mark.xparl_only  # xparl's wire protocol

LIMIT = 1 << 20
OURS = (ProtocolError, AuthenticationError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _server(authenticated: bool) -> Connection:
    if authenticated:
        return Connection(
            "actor", is_server=True, token=None, trusted=True, max_message_bytes=LIMIT
        )
    conn = Connection("actor", is_server=True, token=b"k" * 32, max_message_bytes=LIMIT)
    conn.initiate()
    return conn


def _feed(conn: Connection, data: bytes, chunk: int) -> list:
    events = []
    try:
        for i in range(0, len(data), chunk):
            conn.receive_data(data[i : i + chunk])
            while (event := conn.next_event()) is not NEED_DATA:
                events.append(event)
    except OURS:
        pass  # the only acceptable failure; anything else fails the test
    return events


@FUZZ
@given(data=st.binary(max_size=4096), authenticated=st.booleans(), chunk=st.integers(1, 512))
def test_arbitrary_bytes(data, authenticated, chunk):
    _feed(_server(authenticated), data, chunk)


@FUZZ
@given(
    env_len=st.integers(0, 2**32 - 1),
    nbuf=st.integers(0, 2**32 - 1),
    lengths=st.lists(st.integers(0, 2**64 - 1), max_size=4),
    tail=st.binary(max_size=256),
    authenticated=st.booleans(),
)
def test_huge_declared_lengths_allocate_nothing_big(env_len, nbuf, lengths, tail, authenticated):
    header = struct.pack("<II", env_len, nbuf) + b"".join(struct.pack("<Q", n) for n in lengths)
    conn = _server(authenticated)
    tracemalloc.start()
    try:
        _feed(conn, header + tail, 64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < LIMIT + (1 << 19)  # the frame limit, plus the fixed scratch area


def _messages():
    """Well-formed envelopes of every type, with arbitrary field values."""
    special = {m.StatusReply: {"status": st.dictionaries(st.text(max_size=8), st.integers())}}
    return st.one_of(*[st.builds(cls, **special.get(cls, {})) for cls in m.Message.__args__])


@FUZZ
@given(msg=_messages(), authenticated=st.booleans(), cut=st.integers(0, 64))
def test_valid_frames_in_any_state_and_truncated(msg, authenticated, cut):
    try:
        envelope = m.encoder.encode(msg)
    except OverflowError:  # an int beyond 64 bits: no peer can send it
        assume(False)
    frame = struct.pack("<II", len(envelope), 0) + envelope
    conn = _server(authenticated)
    # A truncated frame is just incomplete: nothing happens until the rest arrives.
    assert _feed(conn, frame[: max(len(frame) - 1 - cut, 0)], 7) == []
    events = _feed(conn, frame[max(len(frame) - 1 - cut, 0) :], 7)
    handshake = isinstance(msg, m.Challenge | m.Hello | m.Welcome | m.Refused)
    if authenticated and not handshake:
        # Compared as bytes: a float field may be NaN, which equals nothing, not even itself.
        assert len(events) == 1 and events[0][1] == ()
        assert m.encoder.encode(events[0][0]) == envelope
    else:
        assert events == []  # wrong for the state: refused with our own error


@FUZZ
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
    chunk=st.integers(1, 4096),
)
def test_buffers_round_trip_through_get_buffer(payloads, chunk):
    sender = Connection("c", is_server=False, token=None, trusted=True)
    receiver = _server(authenticated=True)
    msg = m.Result(id=1, payload=b"p")
    wire = b"".join(bytes(f) for f in sender.send(msg, [bytearray(p) for p in payloads]))
    pos = 0
    while pos < len(wire):
        buf = receiver.get_buffer()
        n = min(len(buf), chunk, len(wire) - pos)
        buf[:n] = wire[pos : pos + n]
        receiver.buffer_updated(n)
        pos += n
    got, buffers = receiver.next_event()
    assert got == msg and [bytes(b) for b in buffers] == payloads


def test_the_strategies_cover_every_message_type():
    assert len(m.Message.__args__) >= 30
    for cls in m.Message.__args__:
        assert msgspec.structs.fields(cls) is not None
