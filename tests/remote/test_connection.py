"""The sans-I/O protocol, tested with bytes only: framing, limits, and the handshake."""

from __future__ import annotations

import pickle
import random
import struct

import pytest

from parl_remote._exceptions import AuthenticationError, ProtocolError
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import (
    AUTHENTICATED,
    HANDSHAKE_LIMIT,
    NEED_DATA,
    Connection,
)

pytestmark = pytest.mark.xparl_only  # xparl's wire protocol

TOKEN = b"t" * 32


def _pump(src: Connection, dst: Connection, frames=None) -> list:
    """Move bytes from src to dst; return every event dst produced."""
    data = b"".join(bytes(b) for b in (frames if frames is not None else src.data_to_send()))
    dst.receive_data(data)
    events = []
    while (event := dst.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def _pair(server_token=TOKEN, client_token=TOKEN, **kwargs):
    server = Connection("actor", is_server=True, token=server_token, **kwargs)
    client = Connection("client", is_server=False, token=client_token, **kwargs)
    return server, client


def _handshake(server: Connection, client: Connection) -> None:
    assert _pump(server, client, server.initiate()) == []
    assert _pump(client, server) == [AUTHENTICATED]
    assert _pump(server, client) == [AUTHENTICATED]
    assert server.authenticated and client.authenticated
    assert server.peer_role == "client" and client.peer_role == "actor"


def test_handshake_then_messages_both_ways():
    server, client = _pair()
    _handshake(server, client)
    call = m.Call(id=1, name="add", payload=pickle.dumps((1, 2)))
    assert _pump(client, server, client.send(call)) == [(call, ())]
    result = m.Result(id=1, payload=pickle.dumps(3))
    assert _pump(server, client, server.send(result)) == [(result, ())]


def test_wrong_token_is_refused_on_both_ends():
    server, client = _pair(client_token=b"x" * 32)
    _pump(server, client, server.initiate())
    with pytest.raises(AuthenticationError, match="does not know the cluster token"):
        _pump(client, server)
    refusal = server.data_to_send()
    with pytest.raises(AuthenticationError, match="refused this connection: wrong cluster token"):
        _pump(server, client, refusal)
    assert not server.authenticated and not client.authenticated
    with pytest.raises(AuthenticationError):  # the connection stays failed
        server.receive_data(b"\x00")


def test_a_server_without_the_token_is_caught_by_the_client():
    server, client = _pair(server_token=b"y" * 32)
    _pump(server, client, server.initiate())
    # The server cannot verify the client (different token); pretend it is an impostor that
    # answers Welcome anyway, with a digest it cannot compute correctly.
    with pytest.raises(AuthenticationError):
        _pump(client, server)
    impostor_welcome = Connection("actor", is_server=True, token=None, trusted=True)._frame(
        m.Welcome(b"\x00" * 32)
    )
    with pytest.raises(AuthenticationError, match="did not prove it knows the cluster token"):
        _pump(server, client, [impostor_welcome])


ALERT = bytes((0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0A))  # what a TLS server sends
SERVER_HELLO = bytes((0x16, 0x03, 0x03, 0x00, 0x7A, 0x02))  # and what it answers a ClientHello


@pytest.mark.parametrize("answer", [ALERT, SERVER_HELLO], ids=["alert", "server-hello"])
@pytest.mark.parametrize("step", [len(ALERT), 1], ids=["whole", "byte-by-byte"])
def test_a_plaintext_client_reads_a_tls_answer_as_tls_required(answer, step):
    client = Connection("client", is_server=False, token=TOKEN)
    with pytest.raises(AuthenticationError, match="answered in TLS: .* requires TLS"):
        for i in range(0, len(answer), step):
            client.receive_data(answer[i : i + step])
    with pytest.raises(AuthenticationError):  # and the connection is finished
        client.next_event()


def test_a_challenge_is_never_taken_for_tls():
    """Challenges of every length a handshake allows still open one, those whose first two
    bytes are a TLS record's among them (the check refuses only what no challenge begins
    with)."""
    lengths = set()
    for n in range(0, 960):
        server = Connection("master", is_server=True, token=TOKEN, store=object(), host="h" * n)
        (frame,) = server.initiate()
        lengths.add(frame[:2])
        client = Connection("client", is_server=False, token=TOKEN)
        assert _pump(server, client, [frame]) == []
        assert client.data_to_send()  # its Hello
    assert ALERT[:2] in lengths and SERVER_HELLO[:2] in lengths


def test_nothing_but_the_handshake_before_authentication():
    server, _ = _pair()
    server.initiate()
    frame = Connection("c", is_server=False, token=None, trusted=True).send(m.Call(1, "x", b""))
    with pytest.raises(ProtocolError, match="unexpected Call during the handshake"):
        server.receive_data(frame[0])


def test_oversized_frame_before_authentication_is_rejected_before_reading_it():
    server, _ = _pair()
    server.initiate()
    with pytest.raises(ProtocolError, match="before the handshake completed"):
        server.receive_data(struct.pack("<II", HANDSHAKE_LIMIT + 1, 0))
    server2, _ = _pair()
    with pytest.raises(ProtocolError, match="with 1 buffers before the handshake"):
        server2.receive_data(struct.pack("<II", 10, 1))


def test_limits_after_authentication():
    server, client = _pair(max_message_bytes=1000)
    _handshake(server, client)
    with pytest.raises(ProtocolError, match="exceeds the limit of 1000 bytes"):
        client.send(m.Call(1, "x", b"a" * 2000))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        client.send(m.Call(1, "x", b""), [bytearray(5000)])
    with pytest.raises(ProtocolError, match="declares 10 bytes and 70000 buffers"):
        server.receive_data(struct.pack("<II", 10, 70000))
    server2, client2 = _pair(max_message_bytes=1000)
    _handshake(server2, client2)
    with pytest.raises(ProtocolError, match="declares 2010 bytes in all"):
        server2.receive_data(struct.pack("<IIQ", 10, 1, 2000))


def test_garbage_and_handshake_replays_after_authentication():
    server, client = _pair()
    _handshake(server, client)
    with pytest.raises(ProtocolError, match="undecodable frame"):
        server.receive_data(struct.pack("<II", 3, 0) + b"\xc1\xc1\xc1")
    server, client = _pair()
    _handshake(server, client)
    replay = Connection("c", is_server=False, token=None, trusted=True)._frame(
        m.Hello(1, "client", b"", b"")
    )
    with pytest.raises(ProtocolError, match="unexpected Hello after the handshake"):
        server.receive_data(replay)


def test_protocol_version_mismatch():
    _, client = _pair()
    challenge = Connection("a", is_server=True, token=None, trusted=True)._frame(
        m.Challenge(99, "actor", b"n")
    )
    with pytest.raises(ProtocolError, match="protocol version 99"):
        client.receive_data(challenge)


def test_out_of_band_buffers_arrive_intact_in_any_chunking():
    server, client = _pair()
    _handshake(server, client)
    rng = random.Random(0)
    big = bytes(rng.getrandbits(8) for _ in range(300_000))
    small = b"abc"
    msg = m.Result(id=7, payload=b"pickle-stream")
    frames = client.send(msg, [big, small, b""])
    wire = b"".join(bytes(f) for f in frames) * 3  # three frames back to back
    cuts = sorted(rng.sample(range(1, len(wire)), 40))
    events = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        server.receive_data(wire[a:b])
        while (event := server.next_event()) is not NEED_DATA:
            events.append(event)
    assert len(events) == 3
    for got, buffers in events:
        assert got == msg
        assert [bytes(b) for b in buffers] == [big, small, b""]


def test_zero_copy_reads_through_get_buffer():
    server, client = _pair()
    _handshake(server, client)
    payload = bytes(range(256)) * 4096 * 4  # 4 MiB: read in place
    wire = b"".join(bytes(f) for f in client.send(m.Result(id=1, payload=b""), [payload]))
    pos, direct_reads = 0, 0
    while pos < len(wire):
        buf = server.get_buffer()
        if len(buf) > 256 * 1024:
            direct_reads += 1
        n = min(len(buf), 100_000, len(wire) - pos)
        buf[:n] = wire[pos : pos + n]
        server.buffer_updated(n)
        pos += n
    (_, buffers) = server.next_event()
    assert bytes(buffers[0]) == payload
    assert direct_reads > 10


def test_send_does_not_copy_buffers():
    _, client = (
        Connection("a", is_server=True, token=None, trusted=True),
        Connection("c", is_server=False, token=None, trusted=True),
    )
    data = bytearray(b"x" * 1000)
    frames = client.send(m.Result(1, b""), [pickle.PickleBuffer(data)])
    data[0] = ord("y")
    assert bytes(frames[1][:1]) == b"y"  # a view of the caller's memory, not a copy


def _read(conn: Connection, data: bytes) -> list:
    """Read `data` the way the I/O shells do (into `get_buffer`, then `received`)."""
    events = []
    buf = conn.get_buffer()
    buf[: len(data)] = data
    event = conn.received(len(data))
    while event is not NEED_DATA:
        events.append(event)
        event = conn.next_event()
    return events


def test_received_reads_one_small_frame_and_anything_else_as_buffer_updated_does():
    server, client = _pair()
    _handshake(server, client)
    calls = [m.Call(id=i, name="add", payload=pickle.dumps(((i, 1), {}))) for i in range(4)]
    wire = [b"".join(client.send(c)) for c in calls]
    assert _read(server, wire[0]) == [(calls[0], ())]  # one whole frame: the quick case
    assert _read(server, wire[1] + wire[2]) == [(calls[1], ()), (calls[2], ())]
    assert _read(server, wire[3][:5]) == []  # a part: nothing yet
    assert _read(server, wire[3][5:]) == [(calls[3], ())]
    result = m.Result(id=9, payload=b"r")
    frames = server.send(result, [b"buffer"])
    assert _read(client, b"".join(bytes(f) for f in frames)) == [(result, (bytearray(b"buffer"),))]


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack("<II", 3, 0) + b"\xc1\xc1\xc1",  # undecodable
        struct.pack("<II", 4, 0) + b"\x91\xa4Ping",  # not a message
        b"".join(Connection("x", is_server=True, token=TOKEN).initiate()),  # a second Challenge
    ],
    ids=["undecodable", "not-a-message", "handshake"],
)
def test_received_rejects_what_buffer_updated_rejects(frame):
    server, client = _pair()
    _handshake(server, client)
    with pytest.raises(ProtocolError):
        _read(server, frame)
    with pytest.raises(ProtocolError):  # the connection stays failed
        server.received(0)


def test_received_honours_a_limit_below_the_read_size():
    server, client = _pair(max_message_bytes=100)
    _handshake(server, client)
    big = m.Result(id=1, payload=b"x" * 200)
    envelope = m.encoder.encode(big)
    with pytest.raises(ProtocolError, match="200|bytes"):
        _read(server, struct.pack("<II", len(envelope), 0) + envelope)


def test_a_small_read_area_takes_frames_larger_than_itself():
    """The master's connections read into `CONTROL_SCRATCH` bytes (`wire/_transport.py`): a
    frame several times that size arrives whole through reads of at most that size."""
    from parl_remote.wire._transport import _connection
    from parl_remote.wire.protocol.connection import CONTROL_SCRATCH

    server = _connection("master", True, TOKEN)
    assert server.get_buffer().nbytes == CONTROL_SCRATCH < 256 << 10
    client = Connection("client", is_server=False, token=TOKEN)
    assert _pump(server, client, server.initiate()) == []
    assert _pump(client, server) == [AUTHENTICATED]
    assert _pump(server, client) == [AUTHENTICATED]
    msg = m.LogLines([("a1", "stdout", "x" * (5 * CONTROL_SCRATCH))])
    data = b"".join(bytes(b) for b in client.send(msg))
    events, pos = [], 0
    while pos < len(data):
        area = server.get_buffer()
        n = min(area.nbytes, len(data) - pos)
        area[:n] = data[pos : pos + n]
        pos += n
        event = server.received(n)
        while event is not NEED_DATA:
            events.append(event)
            event = server.next_event()
    assert events == [(msg, ())]
