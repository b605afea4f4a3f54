"""Encrypted clusters: every connection TLS 1.3, plaintext refused, certificates checked.

Real processes on 127.0.0.1: a master and a worker started with `PARL_TLS=1` (what
`xparl start --tls` sets), the test process as their client, and recording relays in between
to read what crosses the wire: a TLS client's first bytes are its ClientHello, and a TLS
master sends a plaintext peer TLS records only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import ssl
import threading

import pytest

import parl_remote
from parl_remote._exceptions import AuthenticationError, ClusterError
from parl_remote.security import _tls_context, _tls_join
from parl_remote.security._tls import ALERT
from parl_remote.security._tls_certs import make_ca
from parl_remote.wire._transport import SyncConnection, serve_async
from parl_remote.wire.protocol import messages as m
from tests.remote.conftest import (
    CuttableProxy,
    WireTap,
    client_env,
    make_cluster,
    tls_records,
    wait_until,
)
from tests.remote.test_cluster import xparl

pytestmark = pytest.mark.xparl_only  # xparl's TLS

MARKER = "QuokkaPayloadMarker7c1f"


@parl_remote.remote_class
class QuokkaPayloadMarker7c1f:  # its name crosses the master link in CreateActor
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)

    def echo(self, value):
        return value


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    cluster = make_cluster(
        tmp_path_factory.mktemp("tls"), workers=(2,), dashboard=True, PARL_TLS="1"
    )
    yield cluster
    cluster.stop()


def _home(cluster) -> str:
    return cluster.env["PARL_HOME"]


@contextlib.contextmanager
def _plain_env(**env):
    """This process without TLS settings, plus `env` (restored afterwards)."""
    keys = ("PARL_TLS", "PARL_TLS_CA", "PARL_TLS_CERT", "PARL_TLS_KEY", *env)
    old = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _open(cluster, port: int | None = None, **env) -> SyncConnection:
    """A client's connection to the master (or to `port` on this host), with `env`."""
    host, master_port = cluster.address.split(":")
    token = cluster.env["PARL_CLUSTER_TOKEN"].encode()
    with _plain_env(**env):
        return SyncConnection.open(
            host, port or int(master_port), token=token, role="client", expect="master", timeout=10
        )


class _Recording:
    """A socket whose received bytes are kept (what a tap on the wire sees)."""

    def __init__(self, sock: socket.socket, seen: list[bytes]) -> None:
        self.sock, self.seen = sock, seen

    def recv(self, n: int) -> bytes:
        data = self.sock.recv(n)
        self.seen.append(data)
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)


class RecordingProxy(CuttableProxy):
    """A loopback relay that keeps every byte it forwards, both ways."""

    def __init__(self, target_port: int) -> None:
        self.seen: list[bytes] = []
        super().__init__(target_port)

    def _pump(self, src, dst) -> None:
        super()._pump(_Recording(src, self.seen), dst)

    def wire(self) -> bytes:
        return b"".join(self.seen)


def test_a_tls_cluster_works_end_to_end(tls_cluster):
    with client_env(tls_cluster, PARL_TLS=1):
        parl_remote.connect(tls_cluster.address)
        actor = QuokkaPayloadMarker7c1f()
        assert actor.add("a") == 1
        assert actor.echo(b"x" * (1 << 20)) == b"x" * (1 << 20)

        async def both():
            return await actor.aio.add("b"), await actor.aio.echo([1, 2])

        assert asyncio.run(both()) == (2, [1, 2])
        status = tls_cluster.status()
        assert status["totals"]["actors"] == 1
    # xparl speaks TLS to it with --tls; without, it is refused and says why.
    env = dict(tls_cluster.env)
    env.pop("PARL_TLS")
    shown = xparl("status", "--address", tls_cluster.address, "--tls", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "CPU slots" in shown.stdout
    refused = xparl("status", "--address", tls_cluster.address, env=env)
    assert refused.returncode == 1
    assert "requires TLS" in refused.stderr


def test_the_dashboard_is_served_over_https(tls_cluster):
    url = tls_cluster.master.ready["dashboard"]
    assert url.startswith("https://")
    ctx = ssl.create_default_context(cafile=os.path.join(_home(tls_cluster), "tls", "ca.pem"))
    ctx.check_hostname = False
    raw = socket.create_connection(("127.0.0.1", tls_cluster.dashboard_port), timeout=10)
    with ctx.wrap_socket(raw) as tls:
        assert tls.version() == "TLSv1.3"
        tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert tls.recv(64).startswith(b"HTTP/1.1 ")


def test_a_plaintext_client_is_refused_and_told_why(tls_cluster):
    with pytest.raises(AuthenticationError, match="requires TLS"):
        _open(tls_cluster)
    wait_until(lambda: "refused a plaintext peer" in tls_cluster.log(), what="the master's log")


def test_a_tls_client_never_falls_back_to_plaintext(tmp_path):
    cluster = make_cluster(tmp_path, workers=())
    try:
        with pytest.raises(ClusterError, match="does not speak TLS"):
            _open(cluster, PARL_TLS="1")
    finally:
        cluster.stop()


def test_certificates_are_checked_against_parl_tls_ca(tls_cluster, tmp_path):
    make_ca(tmp_path / "other", name="another CA")
    with pytest.raises(ClusterError, match="certificate verify failed"):
        _open(tls_cluster, PARL_TLS="1", PARL_TLS_CA=str(tmp_path / "other" / "ca.pem"))
    own_ca = os.path.join(_home(tls_cluster), "tls", "ca.pem")
    _open(tls_cluster, PARL_TLS="1", PARL_TLS_CA=own_ca).close()


def test_a_relay_with_its_own_certificate_cannot_pass(tls_cluster, tmp_path):
    """The token handshake is bound to the certificate the client saw: a TLS relay that
    presents another certificate (even with the right token) does not get through."""
    from parl_remote.security._tls_certs import make_cluster_files

    make_cluster_files(tmp_path / "mitm", ["127.0.0.1"])
    host, port = tls_cluster.address.split(":")
    token = tls_cluster.env["PARL_CLUSTER_TOKEN"].encode()
    outer = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    outer.load_cert_chain(tmp_path / "mitm" / "cert.pem", tmp_path / "mitm" / "key.pem")
    inner = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    inner.check_hostname, inner.verify_mode = False, ssl.CERT_NONE
    listener = socket.create_server(("127.0.0.1", 0))
    relay_port = listener.getsockname()[1]

    def relay():
        conn, _ = listener.accept()
        with outer.wrap_socket(conn, server_side=True) as down:
            up = inner.wrap_socket(socket.create_connection((host, int(port))))
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=_copy, args=(src, dst), daemon=True).start()
            threading.Event().wait(5)
            up.close()

    threading.Thread(target=relay, daemon=True).start()
    with _plain_env(PARL_TLS="1"), pytest.raises(AuthenticationError, match="token"):
        SyncConnection.open("127.0.0.1", relay_port, token=token, role="client", timeout=10)
    listener.close()


def _copy(src, dst) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)


def test_bad_bytes_close_only_their_connection(tls_cluster):
    host, port = tls_cluster.address.split(":")
    good = _open(tls_cluster, PARL_TLS="1")
    try:
        # Plaintext garbage: refused before any TLS.
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert _read_all(raw) == ALERT
        # A malformed frame inside TLS: that connection closes.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10)) as tls:
            tls.sendall(b"\xff" * 64)
            _read_all(tls)  # returns once the master closed it
        # The authenticated connection and new ones still work.
        good.send(m.StatusRequest(7))
        reply, _ = good.receive()
        assert reply.request_id == 7
        with _plain_env(PARL_TLS="1"):
            assert tls_cluster.status()["totals"]["workers"] == 1
    finally:
        good.close()


def _read_all(sock) -> bytes:
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_tls_client_speaks_tls_from_its_first_byte(tls_cluster):
    """The CA fetched from the master and the client's link: each connection through the tap
    opens with the client's ClientHello, and each way carries TLS records only."""
    with WireTap(tls_cluster.port) as tap, client_env(tls_cluster, PARL_TLS=1):
        _tls_context.forget()
        parl_remote.connect(f"127.0.0.1:{tap.port}")
        assert QuokkaPayloadMarker7c1f().add("x") == 1
        assert _tls_context.trusted() == _tls_join.fetch_ca(
            "127.0.0.1", tap.port, tls_cluster.env["PARL_CLUSTER_TOKEN"].encode()
        )
    assert len(tap.conns) == 3  # the CA for connect, the client's link, the CA again here
    for conn in tap.conns:
        assert conn.up[:1] == b"\x16" and conn.up[5:6] == b"\x01", bytes(conn.up[:16])
        assert tls_records(conn.up) and tls_records(conn.down)


@pytest.mark.parametrize(
    "opening",
    [b"", b"GET / HTTP/1.0\r\n\r\n", _tls_join._HEAD.pack(_tls_join.MAGIC, b"C", 0)],
    ids=["silent", "garbage", "a-plaintext-join-request"],
)
def test_a_plaintext_peer_gets_tls_records_only(tls_cluster, opening):
    """A plaintext client waits for the master's challenge; other peers open with bytes of
    their own. The master answers each with a TLS alert and closes: no plaintext frame."""
    with WireTap(tls_cluster.port) as tap:
        if opening:
            with socket.create_connection(("127.0.0.1", tap.port), timeout=10) as raw:
                raw.sendall(opening)
                _read_all(raw)
        else:
            with pytest.raises(AuthenticationError, match="answered in TLS: .*requires TLS"):
                _open(tls_cluster, port=tap.port)
            wait_until(lambda: tap.conns and tap.conns[0].down, what="the master's answer")
    (conn,) = tap.conns
    assert bytes(conn.up) == opening
    assert bytes(conn.down) == ALERT
    assert tls_records(conn.down) == [21]  # one record: an alert


def test_the_wire_carries_no_plaintext(tls_cluster):
    proxy = RecordingProxy(tls_cluster.port)
    try:
        with client_env(tls_cluster, PARL_TLS=1):
            parl_remote.connect(f"127.0.0.1:{proxy.port}")
            assert QuokkaPayloadMarker7c1f().add("x") == 1
        wire = proxy.wire()
        assert len(wire) > 1000  # the relay did carry the client's traffic
        assert MARKER.encode() not in wire
        assert b"CreateActor" not in wire
    finally:
        proxy.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_pickled_payload_is_visible_on_the_wire_only_without_tls(tmp_path, tls):
    """Between a real asyncio server and a blocking client through a relay: the pickled
    marker is on the wire in plaintext (the check can fail) and absent with TLS."""
    env = {"PARL_TLS": "1", "PARL_HOME": str(tmp_path)} if tls else {}
    token = b"t" * 32
    payload = pickle.dumps({"marker": MARKER})
    got: list[bytes] = []
    ready = threading.Event()
    port_box: list[int] = []
    stop = threading.Event()

    def server() -> None:
        async def main() -> None:
            def on_message(conn, msg, buffers):
                got.append(msg.payload)
                conn.send(m.Result(msg.id, msg.payload))

            srv = await serve_async(
                "127.0.0.1", 0, token=token, role="actor", on_message=on_message
            )
            port_box.append(srv.sockets[0].getsockname()[1])
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)
            srv.close()

        asyncio.run(main())

    with _plain_env(**env):
        thread = threading.Thread(target=server, daemon=True)
        thread.start()
        assert ready.wait(10)
        proxy = RecordingProxy(port_box[0])
        try:
            conn = SyncConnection.open(
                "127.0.0.1", proxy.port, token=token, role="client", timeout=10
            )
            conn.send(m.Call(1, "echo", payload))
            reply, _ = conn.receive()
            conn.close()
            assert reply.payload == payload and got == [payload]
            assert (MARKER.encode() in proxy.wire()) is not tls
        finally:
            proxy.close()
            stop.set()
            thread.join(10)
