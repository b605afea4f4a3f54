"""Joining a TLS cluster from another machine with only its token (`_tls_join`).

A client or worker whose `PARL_HOME` is empty (as on another machine: the cluster CA lives in
the master's) fetches the CA from the master, checks its tag with the token, and verifies every
server of the cluster against it; a worker there gets a certificate the CA signed. A wrong
token, a forged CA and oversized requests are refused. Every exchange runs inside TLS (a
ClientHello asking for the join by ALPN). Real processes on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading

import pytest

from parl_remote._exceptions import AuthenticationError, ClusterError
from parl_remote.security import _tls_context, _tls_join
from parl_remote.security._tls_certs import make_ca, make_cluster_files
from tests.remote.conftest import make_cluster, run_client_script, wait_until

CLIENT = """
    import os, ssl, sys
    import parl_remote
    from parl_remote.security import _tls

    @parl_remote.remote_class
    class Echo:
        def where(self):
            return os.environ.get("PARL_TLS_CERT", "the master's files")

    parl_remote.connect(sys.argv[1] if len(sys.argv) > 1 else os.environ["ADDRESS"])
    echo = Echo()
    assert _tls.client_context().verify_mode == ssl.CERT_REQUIRED  # the chain is checked
    print("served with", echo.where())
"""


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    cluster = make_cluster(tmp_path_factory.mktemp("join"), workers=(), PARL_TLS="1")
    yield cluster
    cluster.stop()


def _host_port(cluster) -> tuple[str, int]:
    host, port = cluster.address.split(":")
    return host, int(port)


def _token(cluster) -> bytes:
    return cluster.env["PARL_CLUSTER_TOKEN"].encode()


def _master_ca(cluster) -> bytes:
    with open(os.path.join(cluster.env["PARL_HOME"], "tls", "ca.pem"), "rb") as f:
        return f.read()


def _join_socket(host: str, port: int) -> ssl.SSLSocket:
    """A connection that asks the server for a join exchange, as `_tls_join` opens one."""
    return _tls_context.join_context().wrap_socket(socket.create_connection((host, port), 10))


def _serve_answers(tmp_path, answers: list[bytes]) -> tuple[int, threading.Thread]:
    """A TLS server that takes join requests and sends `answers`, one a connection."""
    make_cluster_files(tmp_path / "server", ["127.0.0.1"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server" / "cert.pem", tmp_path / "server" / "key.pem")
    ctx.set_alpn_protocols([_tls_context.JOIN_ALPN])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        with listener:
            for reply in answers:
                conn, _ = listener.accept()
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(64)
                    tls.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def test_a_worker_and_a_client_on_other_machines_join_with_only_the_token(
    tls_cluster, tmp_path, monkeypatch
):
    elsewhere = tmp_path / "worker-machine"
    tls_cluster.add_worker(1, extra_env={"PARL_HOME": str(elsewhere)})
    monkeypatch.setenv("PARL_TLS", "1")
    wait_until(lambda: tls_cluster.status()["totals"]["workers"] == 1, what="the worker joins")
    (joined,) = (elsewhere / "tls" / "joined").iterdir()
    assert (joined / "ca.pem").read_bytes() == _master_ca(tls_cluster)
    assert not (elsewhere / "tls" / "ca-key.pem").exists()  # the CA's key stayed home
    # Its certificate was signed by the cluster CA, for a key made there.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(joined / "cert.pem", joined / "key.pem")
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((joined / "cert.pem").read_bytes())
    ca = x509.load_pem_x509_certificate(_master_ca(tls_cluster))
    cert.verify_directly_issued_by(ca)
    # A client with an empty PARL_HOME reaches an actor on that worker.
    client_home = tmp_path / "client-machine"
    env = {"PARL_HOME": str(client_home), "ADDRESS": tls_cluster.address}
    done = run_client_script(CLIENT, tls_cluster, env=env)
    assert done.returncode == 0, done.stderr
    assert f"served with {joined / 'cert.pem'}" in done.stdout
    assert not (client_home / "tls").exists()  # it trusts the CA in memory; wrote nothing


def test_parl_tls_ca_overrides_the_fetch(tls_cluster, tmp_path, monkeypatch):
    make_ca(tmp_path / "mine")
    monkeypatch.setenv("PARL_TLS", "1")
    monkeypatch.setenv("PARL_TLS_CA", str(tmp_path / "mine" / "ca.pem"))
    with socket.socket() as unused:  # nothing listens there: nothing is fetched
        unused.bind(("127.0.0.1", 0))
        assert _tls_join.trust("127.0.0.1", unused.getsockname()[1], b"x") is None


def test_the_ca_answer_is_the_public_certificate_only(tls_cluster):
    ca = _tls_join.fetch_ca(*_host_port(tls_cluster), _token(tls_cluster))
    assert ca == _master_ca(tls_cluster)
    assert b"PRIVATE" not in ca


def test_a_wrong_token_trusts_nothing_and_gets_no_certificate(tls_cluster):
    host, port = _host_port(tls_cluster)
    with pytest.raises(AuthenticationError, match="token is wrong.*nothing was trusted"):
        _tls_join.fetch_ca(host, port, b"not the token")
    with pytest.raises(ClusterError, match="not tagged with this cluster's token"):
        _tls_join.request_certificate(host, port, b"not the token", b"\x30" * 64)
    wait_until(
        lambda: "refused a certificate request" in tls_cluster.log(), what="the master's log"
    )
    done = run_client_script(
        CLIENT, tls_cluster, env={"ADDRESS": tls_cluster.address, "PARL_CLUSTER_TOKEN": "wrong"}
    )
    assert done.returncode != 0
    assert "nothing was trusted" in done.stderr


def test_a_forged_ca_is_refused(tmp_path):
    """A server that answers with another CA (tagged without the token, or re-tagged over
    changed bytes) is not trusted."""
    token = b"the real token"
    other = make_ca(tmp_path / "forged")[0]
    from cryptography.hazmat.primitives import serialization

    forged = other.public_bytes(serialization.Encoding.PEM)
    answers = [
        _tls_join._HEAD.pack(_tls_join.MAGIC, b"+", len(forged))
        + forged
        + _tls_join._tag(b"a guessed token", b"ca", forged),
        _tls_join._HEAD.pack(_tls_join.MAGIC, b"+", len(forged))
        + forged.replace(b"A", b"B", 1)
        + _tls_join._tag(token, b"ca", forged),
    ]
    port, thread = _serve_answers(tmp_path, answers)
    for _ in answers:
        with pytest.raises(AuthenticationError, match="nothing was trusted"):
            _tls_join.fetch_ca("127.0.0.1", port, token)
    thread.join(10)


def test_join_requests_and_answers_are_bounded(tls_cluster, tmp_path):
    host, port = _host_port(tls_cluster)
    huge = _tls_join._HEAD.pack(_tls_join.MAGIC, b"S", 1 << 30)
    with _join_socket(host, port) as sock:
        sock.sendall(huge)  # declares 1 GB: refused at once, nothing more is read
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(_tls_join.MAGIC + b"-")
    assert b"at most" in answer
    # A server that declares an answer over the limit is not read either.
    over = _tls_join._HEAD.pack(_tls_join.MAGIC, b"+", _tls_join.MAX_ANSWER + 1)
    port, thread = _serve_answers(tmp_path, [over])
    with pytest.raises(ClusterError, match="does not answer as the master"):
        _tls_join.fetch_ca("127.0.0.1", port, b"t")
    thread.join(10)


def test_a_plaintext_cluster_is_named_as_such(tmp_path):
    cluster = make_cluster(tmp_path, workers=())
    try:
        with pytest.raises(ClusterError, match="plaintext cluster"):
            _tls_join.fetch_ca(*_host_port(cluster), _token(cluster))
    finally:
        cluster.stop()


def test_xparl_with_tls_from_another_machine(tmp_path):
    """`xparl start --tls` here; `xparl connect --tls` and `xparl status/stop --tls` from a
    home with nothing but the token."""
    from tests.remote.conftest import free_port
    from tests.remote.test_cluster import xparl

    home, elsewhere = tmp_path / "master-machine", tmp_path / "worker-machine"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARL_TLS", "PARL_CLUS"))}
    port = free_port()
    address = f"127.0.0.1:{port}"
    here = dict(env, PARL_HOME=str(home))
    started = xparl("start", "--tls", "--port", str(port), "--cpu_num", "1", env=here)
    try:
        assert started.returncode == 0, started.stderr
        there = dict(env, PARL_HOME=str(elsewhere))
        there["PARL_CLUSTER_TOKEN"] = (home / "token").read_text().strip()
        joined = xparl("connect", "--address", address, "--tls", "--cpu_num", "1", env=there)
        assert joined.returncode == 0, joined.stderr
        assert list((elsewhere / "tls" / "joined").glob("*/cert.pem"))
        shown = xparl("status", "--address", address, "--tls", env=there)
        assert shown.returncode == 0, shown.stderr
        assert "workers: 2 " in shown.stdout
        stopped = xparl("stop", "--address", address, "--tls", env=there)
        assert stopped.returncode == 0, stopped.stderr
        assert f"asked the master at {address} to stop the cluster" in stopped.stdout
    finally:
        xparl("stop", "--port", str(port), env=here)
