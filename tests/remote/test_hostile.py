"""Hostile bytes against live processes: they keep serving, never unpickle, bound idlers."""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import socket
import struct
import threading
import time

import psutil
import pytest

import parl
from parl_remote.wire._transport import SyncConnection
from parl_remote.wire.protocol import messages as m
from tests.remote.conftest import client_env, make_cluster, wait_until

pytestmark = pytest.mark.xparl_only  # hostile bytes to xparl's ports


@parl.remote_class
class Service:
    def add(self, a, b):
        return a + b

    def pid(self):
        return os.getpid()


class _CreatesFile:
    """Unpickling this object creates a file: proof of whether a payload was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _frame(msg) -> bytes:
    envelope = m.encoder.encode(msg)
    return struct.pack("<II", len(envelope), 0) + envelope


def _send_raw(port: int, data: bytes, wait_reply: float = 0.3) -> bytes:
    """Connect, send `data` without any handshake, return what came back before the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with contextlib.suppress(OSError):  # the server may close while we write
            s.sendall(data)
        s.settimeout(wait_reply)
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return received


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = make_cluster(
        tmp_path_factory.mktemp("hostile"),
        workers=(3,),
        dashboard=True,
        PARL_CONNECT_TIMEOUT_S=2,
        PARL_IDLE_TIMEOUT_S=3,
    )
    yield cluster
    cluster.stop()


@pytest.fixture
def client(cluster):
    with client_env(cluster):
        parl.connect(cluster.address)
        yield cluster


def test_no_unpickling_without_the_token(client, tmp_path):
    service = Service()
    actor_port = service._parl_ref.port
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(((_CreatesFile(str(marker)),), {}))
    evil_call = _frame(m.Call(1, "add", payload))
    evil_init = _frame(m.Init(service._parl_ref.actor_id, payload))
    wrong_hello = _frame(m.Hello(m.PROTOCOL_VERSION, "client", b"n" * 32, b"d" * 32))
    for port in (actor_port, client.port):
        for attempt in (evil_call, evil_init, wrong_hello + evil_call, evil_call * 50):
            _send_raw(port, attempt)
    time.sleep(0.5)
    assert not marker.exists(), "a payload was unpickled without authentication"
    assert service.add(1, 2) == 3

    # The control: with the token the same bytes *are* unpickled -- the check above can fail.
    conn = SyncConnection.open(
        "127.0.0.1", actor_port, token=client.env["PARL_CLUSTER_TOKEN"].encode(), role="client"
    )
    try:
        conn.send(m.Call(1, "add", payload))
        reply, _ = conn.receive()
    finally:
        conn.close()
    assert isinstance(reply, m.Error) and marker.exists()


def _hostile_payloads(rng: random.Random, token: bytes):
    """A bounded mix of everything a confused or malicious peer might send."""
    envelope = m.encoder.encode(m.Call(1, "add", b"x" * 10))
    good = struct.pack("<II", len(envelope), 0) + envelope
    yield rng.randbytes(rng.randint(1, 8192))
    yield struct.pack("<II", 2**32 - 1, 2**32 - 1) + rng.randbytes(64)
    yield struct.pack("<II", 900, 0) + rng.randbytes(900)  # a plausible but undecodable frame
    yield good[: rng.randint(1, len(good) - 1)]  # truncated, then the peer hangs up
    yield _frame(m.Hello(m.PROTOCOL_VERSION, "client", rng.randbytes(32), rng.randbytes(32)))
    yield _frame(m.Hello(99, "client", b"", b""))
    yield b"\x00" * 8  # an empty envelope
    yield _frame(m.Refused("go away")) + rng.randbytes(100)


def _http_garbage(rng: random.Random):
    """Malformed and oversized HTTP for the dashboard's port."""
    yield rng.randbytes(rng.randint(1, 4096))
    yield b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"  # an over-long request line
    yield b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"b" * 20000 + b"\r\n\r\n"
    yield b"POST /api/cluster HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\nxx"
    yield b"GET /api/actors/%00%ff<script>/logs?offset=-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    yield (
        b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\n\r\n"  # an upgrade without its key
    )


def _http_get(port: int, path: str) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _authenticated_garbage(port: int, token: bytes, rng: random.Random) -> None:
    """A peer that knows the token and then sends frames that make no sense."""
    try:
        conn = SyncConnection.open("127.0.0.1", port, token=token, role="client", timeout=5)
    except OSError:
        return
    try:
        for msg in (m.Result(5, b"junk"), m.RegisterWorker("w", "h", "x", 1, 0), m.Ack(1)):
            conn.send(msg)
        conn.sock.sendall(struct.pack("<II", 50, 0) + rng.randbytes(50))
        conn.sock.settimeout(3)
        while conn.sock.recv(65536):
            pass
    except OSError:
        pass
    finally:
        conn.close()


def test_random_and_malformed_frames_to_every_port(client):
    token = client.env["PARL_CLUSTER_TOKEN"].encode()
    service = Service()
    ports = {"master": client.port, "actor": service._parl_ref.port}
    master = psutil.Process(client.master.pid)
    actor = psutil.Process(service.pid())
    errors: list[Exception] = []
    stop = threading.Event()
    served = [0]

    def well_behaved() -> None:
        try:
            while not stop.is_set():
                assert service.add(served[0], 1) == served[0] + 1
                served[0] += 1
                if served[0] % 100 == 0:
                    extra = Service()
                    assert extra.add(1, 1) == 2
                    del extra
        except Exception as exc:
            errors.append(exc)

    def hostile_round(seed: int) -> None:
        rng = random.Random(seed)
        for port in ports.values():
            for data in _hostile_payloads(rng, token):
                _send_raw(port, data, wait_reply=0.05)
            _authenticated_garbage(port, token, rng)
        for data in _http_garbage(rng):
            _send_raw(client.dashboard_port, data, wait_reply=0.05)
        status, body = _http_get(client.dashboard_port, "/api/cluster")
        assert status == 200 and b'"workers"' in body  # the dashboard serves meanwhile

    hostile_round(0)  # warm-up: first-time allocations are not growth
    rss_before = {"master": master.memory_info().rss, "actor": actor.memory_info().rss}
    caller = threading.Thread(target=well_behaved)
    caller.start()
    try:
        for seed in range(1, 31):
            hostile_round(seed)
    finally:
        stop.set()
        caller.join(30)
    assert not errors, errors
    assert served[0] > 50  # the well-behaved caller kept being served throughout
    for name, proc in (("master", master), ("actor", actor)):
        growth = proc.memory_info().rss - rss_before[name]
        assert growth < 16 * 2**20, f"{name} RSS grew by {growth / 2**20:.1f} MiB"
    assert client.status()["totals"]["workers"] == 1
    wait_until(
        lambda: "closing the connection" in client.log(), what="the master to log the refusals"
    )


def test_idle_and_slow_connections_are_bounded_and_timed_out(client):
    service = Service()
    targets = [client.port, service._parl_ref.port, client.dashboard_port]
    idle: list[socket.socket] = []
    try:
        for port in targets:
            for _ in range(150):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        slow = socket.create_connection(("127.0.0.1", client.port), timeout=5)
        idle.append(slow)
        assert service.add(2, 2) == 4  # served while 300 connections sit idle
        start = time.monotonic()
        # Each server closes a connection that has not finished the handshake within the
        # 2 s handshake timeout (PARL_CONNECT_TIMEOUT_S), even one trickling bytes in; the
        # dashboard closes HTTP connections idle for 3 s (PARL_IDLE_TIMEOUT_S).
        for _ in range(8):
            try:
                slow.send(b"\x10")
            except OSError:
                break
            time.sleep(0.5)
        for s in idle:
            s.settimeout(max(10 - (time.monotonic() - start), 0.1))
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
        assert time.monotonic() - start < 10
        assert service.add(3, 3) == 6
    finally:
        for s in idle:
            s.close()
