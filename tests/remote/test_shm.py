"""Large arrays through shared memory between a client and an actor of one host (real clusters).

A received array that came through a segment is backed by a private mapping of it
(`via_segment`); one that came through the socket is not. `/dev/shm` is listed before and
after, filtered by the cluster's prefix, to prove that nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import parl
import parl_remote
from parl_remote import _shm
from parl_remote.protocol import messages as m
from parl_remote.protocol.connection import SHM_FLAG
from tests.remote.conftest import client_env, make_cluster, wait_until

MIN = 65536


def via_segment(array) -> bool:
    """Whether `array`'s memory is a mapped segment (not a socket buffer)."""
    obj = array
    while obj is not None:
        if isinstance(obj, mmap.mmap):
            return True
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
    return False


class ArrayMethods:
    def __init__(self):
        self.kept = None

    def echo(self, x):
        return x

    def seen(self, x):
        """Whether the argument arrived through a segment, and its sum."""
        return via_segment(x), float(np.asarray(x).sum())

    def make(self, n, dtype="float32"):
        return np.arange(n, dtype=dtype)

    def fail(self, x):
        raise ValueError(f"refused {x.nbytes} bytes")

    def sleep_then(self, x, seconds):
        import time

        time.sleep(seconds)
        return x

    def pid(self):
        return os.getpid()


@parl.remote_class
class Arrays(ArrayMethods):
    pass


@parl.remote_class(wait=False)
class FutureArrays(ArrayMethods):
    pass


def segments(tag: str) -> list[str]:
    return sorted(n for n in os.listdir(_shm.SHM_DIR) if n.startswith(f"parl-{tag}-"))


@pytest.fixture(scope="module")
def shm_cluster(tmp_path_factory):
    cluster = make_cluster(tmp_path_factory.mktemp("shm"), workers=(3,))
    yield cluster
    cluster.stop()


@pytest.fixture
def client(shm_cluster):
    """A client of the module's cluster; the test fails if it leaves a segment behind."""
    tag = _shm.cluster_tag(shm_cluster.env["PARL_CLUSTER_TOKEN"].encode())
    with client_env(shm_cluster):
        parl_remote.connect(shm_cluster.address)
        yield tag
    wait_until(lambda: not segments(tag), timeout=10, what="no segment left in /dev/shm")


@pytest.mark.parametrize("nbytes", [MIN - 4, MIN, MIN + 4, 1 << 22])
def test_sizes_around_the_threshold_both_ways(client, nbytes):
    a = Arrays()
    x = np.arange(nbytes // 4, dtype=np.float32)
    big = nbytes >= MIN
    assert a.seen(x) == (big, float(x.sum()))
    y = a.echo(x)
    np.testing.assert_array_equal(x, y)
    assert via_segment(y) is big and y.flags.writeable
    y[:] = 7  # ours to write; the actor's copy is untouched
    z = a.make(nbytes // 4)
    assert via_segment(z) is big and z[-1] == nbytes // 4 - 1


@pytest.mark.parametrize(
    "x",
    [
        np.ones((300, 300), dtype=np.float64),
        np.arange(1 << 17, dtype=np.int16),
        np.zeros(1 << 17, dtype=np.complex64),
        np.ones((512, 512), dtype=np.uint8)[::2, ::3],  # not contiguous: pickled in-band
        np.asfortranarray(np.ones((256, 256), dtype=np.float32)),
        np.array([True, False] * (1 << 16)),
    ],
    ids=["f64", "i16", "c64", "strided", "fortran", "bool"],
)
def test_dtypes_and_layouts(client, x):
    y = Arrays().echo({"x": x, "n": 3})
    assert y["n"] == 3 and y["x"].dtype == x.dtype and y["x"].shape == x.shape
    np.testing.assert_array_equal(x, y["x"])


def test_awaitable_and_future_handles(client):
    x = np.arange(1 << 18, dtype=np.float32)

    async def use():
        a = await Arrays.aio()
        assert await a.aio.seen(x) == (True, float(x.sum()))
        y = await a.aio.echo(x)
        assert via_segment(y)
        mine = x.copy()
        pending = a.aio.seen(mine)  # sent now, through a segment: no copy of ours is needed
        mine[:] = 0
        assert await pending == (True, float(x.sum()))
        return y

    np.testing.assert_array_equal(asyncio.run(use()), x)
    f = FutureArrays()
    futures = [f.echo(x + i) for i in range(8)]
    for i, fut in enumerate(futures):
        y = fut.get()
        assert via_segment(y)
        np.testing.assert_array_equal(y, x + i)
    assert f.seen(x).get() == (True, float(x.sum()))


def test_torch_cpu_tensors(client):
    torch = pytest.importorskip("torch")
    from parl_remote import _serialize

    a = Arrays()
    t = torch.arange(1 << 18, dtype=torch.float32)
    _, buffers = _serialize.dumps(t)
    assert len(buffers) == 1  # out of band, so through a segment like an array
    assert a.seen(t)[1] == float(t.sum())
    back = a.echo(t)
    assert isinstance(back, torch.Tensor) and torch.equal(back, t)
    back += 1  # writable
    small = a.echo(torch.ones(3, dtype=torch.int64))
    assert torch.equal(small, torch.ones(3, dtype=torch.int64))
    odd = a.echo(torch.ones(1 << 16, dtype=torch.bfloat16))  # no numpy dtype: torch's pickle
    assert odd.dtype == torch.bfloat16 and float(odd.sum()) == 1 << 16


def test_arrays_outlive_the_actor(client):
    a = Arrays()
    ys = [a.make(1 << 18) for _ in range(3)]
    del a
    import gc

    gc.collect()
    for y in ys:
        assert via_segment(y) and y[12345] == 12345
        y += 1
        assert y[12345] == 12346


def test_exception_in_the_method_leaves_nothing(client):
    a = Arrays()
    with pytest.raises(ValueError, match="refused"):
        a.fail(np.ones(1 << 18))
    assert a.echo(3) == 3


def test_actor_killed_mid_call_leaves_nothing(client):
    f = FutureArrays()
    pid = f.pid().get()
    x = np.ones(1 << 20, dtype=np.float32)
    pending = [f.sleep_then(x, 30), f.echo(x), f.echo(x)]
    os.kill(pid, signal.SIGKILL)
    for fut in pending:
        with pytest.raises(parl_remote.RemoteError):
            fut.get()


def test_client_killed_mid_call_leaves_nothing(shm_cluster, client):
    tag = client
    code = f"""
        import os, signal, threading, numpy as np, parl, parl_remote
        parl_remote.connect({shm_cluster.address!r})

        @parl.remote_class
        class Slow:
            def run(self, x, seconds):
                import time
                time.sleep(seconds)
                return x * 2

        s = Slow()
        print("ready", flush=True)
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        s.run(np.ones(1 << 20), 3)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=shm_cluster.env,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # The actor's result has nobody to go to; the master releases the actor; nothing stays.
    wait_until(lambda: not segments(tag), timeout=20, what="the dead client's segments gone")


def test_cap_falls_back_to_the_socket(tmp_path):
    cluster = make_cluster(tmp_path, workers=(2,), PARL_SHM_MAX_BYTES=100_000)
    try:
        with client_env(cluster, PARL_SHM_MAX_BYTES=100_000):
            parl_remote.connect(cluster.address)
            a = Arrays()
            x = np.arange(1 << 16, dtype=np.float32)  # 256 KB: over the cap
            assert a.seen(x) == (False, float(x.sum()))
            assert not via_segment(a.echo(x))
            small = np.arange(20_000, dtype=np.float32)  # 80 KB: within it
            assert a.seen(small)[0] is True and via_segment(a.echo(small))

            async def use():
                b = await Arrays.aio()
                await b.aio.seen(small)  # the connection is open
                mine = x.copy()
                pending = b.aio.seen(mine)  # over the cap: the socket, with a copy of ours
                mine[:] = 0
                assert await pending == (False, float(x.sum()))

            asyncio.run(use())
    finally:
        cluster.stop()


def test_sharing_turned_off_and_across_hosts(tmp_path):
    cluster = make_cluster(tmp_path, workers=(1,), PARL_HOST_ID="cluster-host")
    try:
        x = np.arange(1 << 18, dtype=np.float32)
        with client_env(cluster, PARL_HOST_ID="client-host"):
            parl_remote.connect(cluster.address)
            a = Arrays()
            assert a.seen(x) == (False, float(x.sum()))
            y = a.echo(x)
            assert not via_segment(y)
            np.testing.assert_array_equal(x, y)
        with client_env(cluster, PARL_HOST_ID="cluster-host", PARL_SHM_MIN_BYTES=0):
            parl_remote.connect(cluster.address)
            assert Arrays().seen(x)[0] is False
        with client_env(cluster, PARL_HOST_ID="cluster-host"):
            parl_remote.connect(cluster.address)
            assert Arrays().seen(x)[0] is True
    finally:
        cluster.stop()


def _forged_frame(ref: bytes) -> bytes:
    envelope = m.encoder.encode(m.Call(1, "echo", b"", m.CallKind.METHOD))
    head = struct.pack("<II", len(envelope), 1 | SHM_FLAG) + struct.pack("<Q", len(ref))
    return head + envelope + ref


@pytest.mark.parametrize(
    "ref",
    [
        _shm.encode_ref("../../etc/passwd", [4]),
        _shm.encode_ref("parl-000000000000-1-1", [4]),
        b"\x92\xa3abc",  # truncated
        None,  # a well-formed name of ours, longer than the file
    ],
    ids=["traversal", "other-cluster", "truncated", "wrong-length"],
)
def test_forged_reference_closes_only_that_connection(client, ref):
    from parl_remote._transport import SyncConnection

    a = Arrays()
    host, port = _actor_address(a)
    token = os.environ["PARL_CLUSTER_TOKEN"].encode()
    if ref is None:
        name = _shm.segment_name(client, os.getpid(), 10**9)
        path = os.path.join(_shm.SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, b"1234")
        os.close(fd)
        ref = _shm.encode_ref(name, [1 << 20])
    conn = SyncConnection.open(host, port, token=token, role="client", expect="actor")
    assert conn.proto.shm is not None  # same host: references are taken
    conn.sock.sendall(_forged_frame(ref))
    conn.sock.settimeout(10)
    assert conn.sock.recv(1) == b""  # the actor closed this connection
    conn.close()
    x = np.ones(1 << 18)
    assert a.seen(x) == (True, float(x.sum()))  # and serves the others


def _actor_address(handle) -> tuple[str, int]:
    core = object.__getattribute__(handle, "_parl_ref").core
    return core.host, core.port


def test_unauthenticated_peer_gets_nowhere(client):
    a = Arrays()
    host, port = _actor_address(a)
    with socket.create_connection((host, port), timeout=10) as s:
        s.settimeout(10)
        s.sendall(_forged_frame(_shm.encode_ref("parl-x-1-1", [4])))
        with contextlib.suppress(ConnectionResetError):
            while s.recv(4096):  # the challenge, then the end
                pass
    assert a.seen(np.ones(1 << 18))[0] is True


# -- the protocol alone (no cluster) -------------------------------------------------------------
def _pair(client_host: str, actor_host: str, store) -> tuple:
    from parl_remote.protocol.connection import AUTHENTICATED, Connection

    token = b"t" * 32
    actor = Connection("actor", is_server=True, token=token, store=store, host=actor_host)
    client = Connection("client", is_server=False, token=token, store=store, host=client_host)
    for frame in actor.initiate():
        client.receive_data(frame)
    while actor.has_output or client.has_output:
        for frame in client.data_to_send():
            actor.receive_data(frame)
        for frame in actor.data_to_send():
            client.receive_data(frame)
    assert actor.next_event() is AUTHENTICATED and client.next_event() is AUTHENTICATED
    return client, actor


def test_the_handshake_decides_and_the_reference_carries(tmp_path):
    store = _shm.SegmentStore(_shm.cluster_tag(os.urandom(8)), MIN, 1 << 30)
    client, actor = _pair("h", "h", store)
    assert client.shm is store and actor.shm is store
    x = np.arange(1 << 16, dtype=np.float64)
    frames = client.send(m.Call(1, "echo", b"p"), [pickle_buffer(x)])
    assert sum(len(memoryview(f).cast("B")) for f in frames) < 200  # a reference, not the bytes
    for frame in frames:
        actor.receive_data(frame)
    msg, buffers = actor.next_event()
    assert msg.name == "echo" and not segments(store.tag)  # mapped, then unlinked
    y = np.frombuffer(buffers[0], dtype=np.float64)
    np.testing.assert_array_equal(x, y)
    far_client, far_actor = _pair("h", "elsewhere", store)
    assert far_client.shm is None and far_actor.shm is None
    frames = far_client.send(m.Call(1, "echo", b"p"), [pickle_buffer(x)])
    assert sum(len(memoryview(f).cast("B")) for f in frames) > x.nbytes


def pickle_buffer(x):
    import pickle

    return pickle.PickleBuffer(x)


@pytest.mark.parametrize(
    "ref",
    [b"", b"\xc1", _shm.encode_ref("parl-abc-1-1/../../x", [1]), _shm.encode_ref("x", [1])],
)
def test_hostile_references_are_protocol_errors(ref):
    from parl_remote._exceptions import ProtocolError

    with pytest.raises(ProtocolError):
        _shm.decode_ref(ref, _shm.name_pattern("abc"), 1 << 30, 16)


def test_reference_limits():
    from parl_remote._exceptions import ProtocolError

    pattern = _shm.name_pattern("abc")
    assert _shm.decode_ref(_shm.encode_ref("parl-abc-1-2", [5, 7]), pattern, 100, 4) == (
        "parl-abc-1-2",
        [5, 7],
    )
    for lengths in ([-1], [], [1] * 5, [101]):
        with pytest.raises(ProtocolError):
            _shm.decode_ref(_shm.encode_ref("parl-abc-1-2", lengths), pattern, 100, 4)
    assert _shm.layout([1, 64, 65]) == ([0, 64, 128], 256)
    assert not _shm.wants_segment([MIN], 0) and _shm.wants_segment([MIN - 1, 1], MIN)


def test_sweep_removes_only_the_named_process_or_cluster():
    tag, other = _shm.cluster_tag(os.urandom(8)), _shm.cluster_tag(os.urandom(8))
    names = [_shm.segment_name(tag, 11, 1), _shm.segment_name(tag, 12, 1)]
    names.append(_shm.segment_name(other, 11, 1))
    for name in names:
        os.close(os.open(os.path.join(_shm.SHM_DIR, name), os.O_CREAT | os.O_EXCL, 0o600))
    try:
        assert _shm.sweep(tag, 11) == 1 and segments(tag) == [names[1]]
        assert _shm.sweep(tag) == 1 and segments(tag) == [] and segments(other) == [names[2]]
    finally:
        _shm.sweep(other)
    assert segments(other) == []
