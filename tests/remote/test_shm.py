"""Large arrays through shared memory between a client and an actor of one host (real clusters).

Each process counts the messages it received through a segment (`_shm.received()`): an actor's
`seen` says whether its argument came that way, `shared` whether a result did. Segments are
memfds: `segments` lists those that the processes of this host hold by their descriptors,
filtered by the cluster's prefix, to prove that nothing is left behind; and `/dev/shm` is
listed before and after a whole cluster is killed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest

import parl
import parl_remote
from parl_remote._exceptions import ProtocolError
from parl_remote.wire import _shm
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import SHM_FLAG
from tests.remote.conftest import client_env, make_cluster, wait_until

pytestmark = pytest.mark.xparl_only  # xparl's shared-memory segments

MIN = 65536


def shared(call):
    """`call()`'s value, and whether it arrived in this process through a segment."""
    before = _shm.received()
    value = call()
    return value, _shm.received() > before


class ArrayMethods:
    def __init__(self):
        self.mark = _shm.received()

    def _after(self, value):
        self.mark = _shm.received()  # what arrives before the next call is its own message
        return value

    def echo(self, x):
        return self._after(x)

    def seen(self, x):
        """Whether the argument arrived through a segment, and its sum."""
        return self._after((_shm.received() > self.mark, float(np.asarray(x).sum())))

    def make(self, n, dtype="float32"):
        return self._after(np.arange(n, dtype=dtype))

    def fail(self, x):
        self._after(None)
        raise ValueError(f"refused {x.nbytes} bytes")

    def sleep_then(self, x, seconds):
        import time

        time.sleep(seconds)
        return self._after(x)

    def pid(self):
        return os.getpid()

    def keep(self, n):
        self.kept = np.zeros(n, dtype=np.float32)
        return self._after(self.kept)

    def bump(self):
        self.kept += 1
        return self._after(float(self.kept[0]))


@parl.remote_class
class Arrays(ArrayMethods):
    pass


@parl.remote_class(wait=False)
class FutureArrays(ArrayMethods):
    pass


def segments(tag: str) -> list[str]:
    """The segments of cluster `tag` that a process of this host holds a descriptor of (its
    owner's, or a mapping's: Python's `mmap` keeps one)."""
    prefix, found = f"/memfd:parl-{tag}-", set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(prefix):
                        found.add(target[len("/memfd:") :].removesuffix(" (deleted)"))
    return sorted(found)


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
    y, through = shared(lambda: a.echo(x))
    np.testing.assert_array_equal(x, y)
    assert through is big and y.flags.writeable
    y[:] = 7  # ours to write; the actor's copy is untouched
    z, through = shared(lambda: a.make(nbytes // 4))
    assert through is big and z[-1] == nbytes // 4 - 1
    assert a.seen(x) == (big, float(x.sum()))  # again, through the same segments


def test_received_arrays_are_independent_of_later_calls(client):
    a = Arrays()
    n = 1 << 18
    ys = [a.make(n, dtype) for dtype in ("float32", "int32", "float32")]
    xs = [a.echo(np.full(n, i, dtype=np.float32)) for i in range(4)]
    for dtype, y in zip(("float32", "int32", "float32"), ys, strict=True):
        assert y.dtype == dtype and y[0] == 0 and y[-1] == n - 1
    for i, x in enumerate(xs):
        assert (x == i).all()
    xs[0][:] = 9  # writing one leaves the others, and the next call, alone
    assert (xs[1] == 1).all() and (a.echo(xs[1]) == 1).all()
    del ys, xs  # their segments go back to the actor, for its next results
    for i in range(3):
        a.echo(np.full(n, i, dtype=np.float32))
    steady = segments(client)
    for i in range(10):
        assert (a.echo(np.full(n, i, dtype=np.float32)) == i).all()
    assert segments(client) == steady  # the same few segments, lent again and again


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
        before = _shm.received()
        y = await a.aio.echo(x)
        assert _shm.received() > before
        mine = x.copy()
        pending = a.aio.seen(mine)  # sent now, through a segment: no copy of ours is needed
        mine[:] = 0
        assert await pending == (True, float(x.sum()))
        return y

    np.testing.assert_array_equal(asyncio.run(use()), x)
    f = FutureArrays()
    before = _shm.received()
    futures = [f.echo(x + i) for i in range(8)]
    for i, fut in enumerate(futures):
        np.testing.assert_array_equal(fut.get(), x + i)
    assert _shm.received() - before == 8
    assert f.seen(x).get() == (True, float(x.sum()))
    mine = x.copy()
    pending = f.seen(mine)  # written into a segment before this returned: ours to change
    mine[:] = 0
    assert pending.get() == (True, float(x.sum()))


def test_a_future_call_whose_connection_is_replaced_before_it_leaves(client):
    """A future-mode call stages its arrays in a segment of the connection open when it is made.

    If that connection is gone by the time the call leaves (on the client's loop), the call goes
    on a new connection with the values it was made with, and the segment is free again at once
    (not lent until the old connection's end).
    """
    f = FutureArrays()
    assert f.pid().get(timeout=30)  # its connection is open: later calls stage their arrays
    ref = f._parl_ref
    loop = ref.client.loop
    old = ref.drivers[loop]
    link = old.conn.proto.shm
    assert link is not None
    go, after = threading.Event(), []

    def hold_then_close():  # on the client's loop, ahead of the call: it leaves after this
        go.wait(30)
        old.close()

    def look():  # right after the call was handed to a driver, before the old link closes
        after.append((dict(link._staged), dict(link._lent)))

    ref.client.run_soon(hold_then_close)
    x = np.arange(MIN, dtype=np.float32)
    pending = f.seen(x)
    ref.client.run_soon(look)
    (name,) = link._staged.values()  # written into a segment of the old connection
    x[:] = 0  # the call carries the values it was made with
    go.set()
    assert pending.get(timeout=30)[1] == float(np.arange(MIN, dtype=np.float32).sum())
    staged, lent = after[0]
    assert not staged and name not in lent
    assert ref.drivers[loop] is not old and f.seen(x).get(timeout=30)[1] == 0.0


def test_torch_cpu_tensors(client):
    torch = pytest.importorskip("torch")
    from parl_remote.wire import _serialize

    a = Arrays()
    t = torch.arange(1 << 18, dtype=torch.float32)
    _, buffers = _serialize.dumps(t)
    assert len(buffers) == 1  # out of band, so through a segment like an array
    assert a.seen(t) == (True, float(t.sum()))
    back = a.echo(t)
    assert isinstance(back, torch.Tensor) and torch.equal(back, t)
    back += 1  # writable
    small = a.echo(torch.ones(3, dtype=torch.int64))
    assert torch.equal(small, torch.ones(3, dtype=torch.int64))
    odd = a.echo(torch.ones(1 << 16, dtype=torch.bfloat16))  # no numpy dtype: torch's pickle
    assert odd.dtype == torch.bfloat16 and float(odd.sum()) == 1 << 16


def test_arrays_outlive_the_actor(client):
    a = Arrays()
    before = _shm.received()
    ys = [a.make(1 << 18) for _ in range(3)]
    assert _shm.received() - before == 3
    del a
    import gc

    gc.collect()
    for y in ys:
        assert y[12345] == 12345
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
            assert shared(lambda: a.echo(x))[1] is False
            small = np.arange(20_000, dtype=np.float32)  # 80 KB: within it
            assert a.seen(small)[0] is True and shared(lambda: a.echo(small))[1] is True

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
            y, through = shared(lambda: a.echo(x))
            assert not through
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
        _shm.encode_ref("../../etc/passwd", 0, [4]),
        _shm.encode_ref("parl-000000000000-1-1", 0, [4]),
        b"\x93\xa3abc",  # truncated
        "not-a-segment",  # a descriptor of the client's that is no segment
        "wrong-length",  # a segment of ours, shorter than the reference says
    ],
    ids=["traversal", "other-cluster", "truncated", "not-a-segment", "wrong-length"],
)
def test_forged_reference_closes_only_that_connection(client, ref):
    from parl_remote.wire._transport import SyncConnection

    a = Arrays()
    host, port = _actor_address(a)
    token = os.environ["PARL_CLUSTER_TOKEN"].encode()
    name = _shm.segment_name(client, os.getpid(), 10**9)
    opened = None
    if ref == "not-a-segment":
        opened = os.open(__file__, os.O_RDONLY)
        ref = _shm.encode_ref(name, opened, [4])
    elif ref == "wrong-length":
        opened = os.memfd_create(name)
        os.write(opened, b"1234")
        ref = _shm.encode_ref(name, opened, [1 << 20])
    conn = SyncConnection.open(host, port, token=token, role="client", expect="actor")
    assert conn.proto.shm is not None  # same host: references are taken
    conn.sock.sendall(_forged_frame(ref))
    conn.sock.settimeout(10)
    assert conn.sock.recv(1) == b""  # the actor closed this connection
    conn.close()
    if opened is not None:
        os.close(opened)
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
        s.sendall(_forged_frame(_shm.encode_ref("parl-x-1-1", 3, [4])))
        with contextlib.suppress(ConnectionResetError):
            while s.recv(4096):  # the challenge, then the end
                pass
    assert a.seen(np.ones(1 << 18))[0] is True


# -- the protocol alone (no cluster) -------------------------------------------------------------
@pytest.fixture
def new_store():
    """`new_store(cap)`: a store of a fresh cluster (its segments are this process's memfds)."""

    def make(cap: int = 1 << 30) -> _shm.SegmentStore:
        return _shm.SegmentStore(_shm.cluster_tag(os.urandom(8)), MIN, cap)

    return make


def _pair(client_host: str, actor_host: str, store) -> tuple:
    from parl_remote.wire.protocol.connection import AUTHENTICATED, Connection

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


def test_the_handshake_decides_and_the_reference_carries(tmp_path, new_store):
    store = new_store()
    client, actor = _pair("h", "h", store)
    assert client.shm.store is store and actor.shm.store is store
    x = np.arange(1 << 16, dtype=np.float64)
    for i in range(3):
        frames = client.send(m.Call(i, "echo", b"p"), [pickle_buffer(x + i)])
        assert sum(len(memoryview(f).cast("B")) for f in frames) < 200  # a reference
        for frame in frames:
            actor.receive_data(frame)
        msg, buffers = actor.next_event()
        assert msg.name == "echo" and len(segments(store.tag)) == 1  # the same one, lent again
        y = np.frombuffer(buffers[0], dtype=np.float64)
        np.testing.assert_array_equal(x + i, y)
        y[:] = -1  # a view of the segment, writable
        del buffers, y  # nothing of it left: handed back with the next frame
        for frame in actor.send(m.Result(i, b"r")):
            client.receive_data(frame)
        assert client.next_event()[0] == m.Result(i, b"r")
    actor.release_segments()
    client.release_segments()
    assert not segments(store.tag) and store.held == 0
    far_client, far_actor = _pair("h", "elsewhere", store)
    assert far_client.shm is None and far_actor.shm is None
    frames = far_client.send(m.Call(1, "echo", b"p"), [pickle_buffer(x)])
    assert sum(len(memoryview(f).cast("B")) for f in frames) > x.nbytes


def pickle_buffer(x):
    import pickle

    return pickle.PickleBuffer(x)


@pytest.mark.parametrize(
    "ref",
    [
        b"",
        b"\xc1",
        _shm.encode_ref("parl-abc-1-1/../../x", 3, [1]),
        _shm.encode_ref("x", 3, [1]),
        _shm.encode_ref("parl-abc-1-1", -1, [1]),
        _shm.encode_ref("parl-abc-1-1", 1 << 40, [1]),
    ],
)
def test_hostile_references_are_protocol_errors(ref):
    from parl_remote._exceptions import ProtocolError

    with pytest.raises(ProtocolError):
        _shm.decode_ref(ref, _shm.name_pattern("abc"), 1 << 30, 16)


def test_reference_limits():
    from parl_remote._exceptions import ProtocolError

    pattern = _shm.name_pattern("abc")
    assert _shm.decode_ref(_shm.encode_ref("parl-abc-1-2", 9, [5, 7]), pattern, 100, 4) == (
        "parl-abc-1-2",
        9,
        [5, 7],
    )
    for lengths in ([-1], [], [1] * 5, [101]):
        with pytest.raises(ProtocolError):
            _shm.decode_ref(_shm.encode_ref("parl-abc-1-2", 9, lengths), pattern, 100, 4)
    assert _shm.layout([1, 64, 65]) == ([0, 64, 128], 256)
    assert not _shm.wants_segment([MIN], 0) and _shm.wants_segment([MIN - 1, 1], MIN)


def _dead_pid() -> int:
    """The pid of a process that has exited (and, for the few moments a test takes, unused)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(child.stdout)


KILL_ALL = """
    import os, sys, time, numpy as np, parl

    parl.connect(os.environ["ADDRESS"])

    @parl.remote_class
    class Echo:
        def echo(self, x):
            return x

        def hold(self, x):
            self.x = x  # held: its segment stays lent to this actor
            return x.nbytes

    actors = [Echo(), Echo()]
    kept = [a.echo(np.full(1 << 18, i)) for i, a in enumerate(actors)]  # the client's, mapped
    assert [a.hold(np.ones(1 << 19)) for a in actors] == [1 << 22] * 2
    futures = [a.echo(np.ones(1 << 20)) for a in actors]  # and one each on its way
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_cluster_killed_whole_leaves_nothing_in_dev_shm(tmp_path):
    """Master, worker, actors and client killed with SIGKILL at once, mid-traffic: `/dev/shm`
    is as it was, and no segment of the cluster is left in any process of this host."""
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    cluster = make_cluster(tmp_path, workers=(2,))
    tag = _shm.cluster_tag(cluster.env["PARL_CLUSTER_TOKEN"].encode())
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILL_ALL)],
        env=dict(cluster.env, ADDRESS=cluster.address),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert client.stdout.readline() == "ready\n"
        assert segments(tag)  # the traffic did go through segments (the check can fail)
        pids = [*cluster.processes(), client.pid]
        assert len(pids) >= 5  # master, worker, two actors, client
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        client.wait(10)
        wait_until(lambda: not any(_alive(p) for p in pids), what="every process gone")
        assert not segments(tag)
        after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        assert {n for n in after - before if tag in n} == set()
    finally:
        client.kill()
        client.wait(10)
        client.stdout.close()
        cluster.stop()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_starting_worker_removes_the_directory_of_a_worker_killed_before(tmp_path):
    """A worker killed with SIGKILL leaves its directory (its actors' code): the next removes it."""
    run_dir = tempfile.mkdtemp(prefix=f"parl-worker-{_dead_pid()}-")
    os.makedirs(os.path.join(run_dir, "actors", "a1"))
    try:
        cluster = make_cluster(tmp_path, workers=(1,))
        cluster.stop()
        assert not os.path.exists(run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_the_dead_directory_sweep_removes_only_directories_whose_process_is_gone(tmp_path):
    from parl_remote import _util

    dead, root = _dead_pid(), tempfile.gettempdir()
    gone = [tempfile.mkdtemp(prefix=f"parl-test-kind-{dead}-") for _ in range(2)]
    with open(os.path.join(gone[0], "kept.txt"), "w") as f:
        f.write("a file inside goes with its directory")
    kept = [
        _util.private_dir("test-kind"),  # this process runs
        tempfile.mkdtemp(prefix=f"parl-test-kind-{dead}-x-"),  # not a name private_dir makes
        tempfile.mkdtemp(prefix=f"parl-test-other-{dead}-"),  # another kind
    ]
    link = os.path.join(root, f"parl-test-kind-{dead}-linkxxxx")
    os.symlink(tmp_path, link)  # a link with a dead owner's name: neither it nor its target goes
    kept.append(link)
    try:
        assert _util.sweep_dead_dirs("test-kind") == 2
        assert not any(os.path.exists(p) for p in gone)
        assert all(os.path.lexists(p) for p in kept) and os.path.isdir(tmp_path)
    finally:
        os.unlink(link)
        for path in kept[:-1]:
            shutil.rmtree(path, ignore_errors=True)


def test_segment_sizes_and_hand_backs():
    from parl_remote._exceptions import ProtocolError

    assert _shm.size_class(1) == 64 << 10 and _shm.size_class(1 << 20) == 1 << 20
    assert _shm.size_class((1 << 20) + 1) == (1 << 20) + (1 << 17)  # an eighth above at most
    pattern = _shm.name_pattern("abc")
    assert _shm.decode_returns(_shm.encode_returns(["parl-abc-1-2"]), pattern) == ["parl-abc-1-2"]
    for body in (b"\xc1", _shm.encode_returns(["parl-abd-1-2"]), b"\x91" + b"\xa1x" * 5000):
        with pytest.raises(ProtocolError):
            _shm.decode_returns(body, pattern)


@pytest.mark.parametrize(
    "names", [["parl-{tag}-{pid}-99"], ["nonsense"]], ids=["not-lent", "foreign"]
)
def test_a_hostile_hand_back_is_a_protocol_error(names, new_store):
    from parl_remote._exceptions import ProtocolError
    from parl_remote.wire.protocol.connection import RETURN_FLAG

    store = new_store()
    client, actor = _pair("h", "h", store)
    body = _shm.encode_returns([n.format(tag=store.tag, pid=os.getpid()) for n in names])
    with pytest.raises(ProtocolError):
        actor.receive_data(struct.pack("<II", len(body), RETURN_FLAG) + body)
    _, far_actor = _pair("h", "elsewhere", store)  # no sharing: no hand-backs either
    with pytest.raises(ProtocolError):
        far_actor.receive_data(struct.pack("<II", len(body), RETURN_FLAG) + body)
    actor.release_segments()
    client.release_segments()


def test_the_cap_counts_every_connection_of_a_process(new_store):
    store = new_store(3 << 20)
    links = [_pair("h", "h", store)[0] for _ in range(3)]
    x = np.ones(1 << 20, dtype=np.uint8)
    sent = [len(c.send(m.Call(1, "echo", b"p"), [pickle_buffer(x)])) for c in links]
    assert sent == [2, 2, 2] and store.held == 3 << 20  # a reference each: the cap is reached
    frames = links[0].send(m.Call(2, "echo", b"p"), [pickle_buffer(x)])
    assert sum(len(memoryview(f).cast("B")) for f in frames) > x.nbytes  # the socket carries it
    for c in links:
        c.release_segments()
    assert store.held == 0 and not segments(store.tag)


def test_staged_buffers_leave_without_another_copy(new_store):
    store = new_store()
    client, actor = _pair("h", "h", store)
    x = np.arange(1 << 16, dtype=np.float64)
    staged = client.shm.stage([pickle_buffer(x)])  # a future-mode call, sent later
    x[:] = 0  # the caller's own again
    for frame in client.send(m.Call(1, "echo", b"p"), staged):
        actor.receive_data(frame)
    assert len(segments(store.tag)) == 1  # the staged segment is the one sent
    _, buffers = actor.next_event()
    np.testing.assert_array_equal(np.frombuffer(buffers[0]), np.arange(1 << 16))
    del buffers, staged  # a segment lives while a process maps it
    actor.release_segments()
    client.release_segments()
    assert not segments(store.tag)


def test_a_segment_is_lent_until_its_arrays_are_gone(new_store):
    store = new_store()
    client, actor = _pair("h", "h", store)
    x = np.arange(1 << 17, dtype=np.float32)

    def call(i: int) -> np.ndarray:
        for frame in client.send(m.Call(i, "echo", b"p"), [pickle_buffer(x + i)]):
            actor.receive_data(frame)
        _, buffers = actor.next_event()
        for frame in actor.send(m.Result(i, b"r")):  # hands back whatever is free by now
            client.receive_data(frame)
        assert client.next_event()[0] == m.Result(i, b"r")
        return np.frombuffer(buffers[0], dtype=np.float32)

    held = [call(i) for i in range(3)]
    assert len(segments(store.tag)) == 3  # each held array keeps its segment lent
    for i, y in enumerate(held):
        np.testing.assert_array_equal(y, x + i)  # never overwritten by a later call
    del held, y
    call(3)  # a fourth: the three come back only with the actor's reply to this call
    assert len(segments(store.tag)) == 4
    for i in range(5):
        call(4 + i)
    assert len(segments(store.tag)) == 4  # the freed segments are lent again, none added
    actor.release_segments()
    client.release_segments()
    assert not segments(store.tag) and store.held == 0


def test_plain_calls_skip_the_buffer_machinery_and_arrays_still_leave_out_of_band():
    import pickle

    from parl_remote.wire import _serialize

    plain = ((1, 2.5, "x", None, b"y", True), {})
    data, buffers = _serialize.dumps(plain)
    assert buffers == [] and pickle.loads(data) == plain
    x = np.ones(1 << 16)
    for value in (((1, x), {}), ((1,), {"k": x}), ((1, [x]), {}), x):
        data, buffers = _serialize.dumps(value)
        assert len(buffers) == 1 and np.shares_memory(np.asarray(buffers[0]), x)


def test_a_result_the_actor_changes_right_after_is_sent_as_it_was(client):
    f = FutureArrays()
    f.pid().get()
    for n in (1 << 18, 1 << 22):  # one segment, then a larger one
        pending = [f.keep(n), f.bump(), f.bump()]  # in flight together: run back to back
        kept, first, second = (p.get() for p in pending)
        assert kept.shape == (n,) and not kept.any() and (first, second) == (1.0, 2.0)


def test_a_segment_its_owner_removes_is_unmapped_by_the_peer(new_store):
    store = new_store()
    client, actor = _pair("h", "h", store)
    sizes = [1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21, 1 << 22]

    def round_trip(nbytes: int) -> None:
        x = np.ones(nbytes, dtype=np.uint8)
        for frame in client.send(m.Call(1, "echo", b"p"), [pickle_buffer(x)]):
            actor.receive_data(frame)
        actor.next_event()  # the views are dropped at once: handed back with the reply
        for frame in actor.send(m.Result(1, b"r")):
            client.receive_data(frame)
        client.next_event()

    for nbytes in sizes:  # each needs a larger segment than the last: six, then two removed
        round_trip(nbytes)
    owned = {segment.name for segment in client.shm._free}
    assert len(owned) == 4  # four kept free, two removed: alive while the actor maps them
    assert set(segments(store.tag)) == set(actor.shm._maps) > owned
    round_trip(1 << 20)  # the client tells the actor which it removed...
    owned = {segment.name for segment in client.shm._free}
    assert set(actor.shm._maps) == set(segments(store.tag)) == owned  # ...and they are gone
    actor.release_segments()
    client.release_segments()


def test_a_hand_back_outlives_a_send_refused_for_its_size(new_store):
    store = new_store()
    client, actor = _pair("h", "h", store)
    x = np.ones(1 << 17, dtype=np.uint8)
    for frame in client.send(m.Call(1, "echo", b"p"), [pickle_buffer(x)]):
        actor.receive_data(frame)
    actor.next_event()  # the views are dropped at once: the segment is owed back
    assert list(actor.shm.owed) and list(client.shm._lent)
    limit, actor.max_message_bytes = actor.max_message_bytes, 100
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        actor.send(m.Result(1, b"r" * 200))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        actor.send(m.Result(1, b"r"), [b"b" * 200])
    actor.max_message_bytes = limit
    for frame in actor.send(m.Result(1, b"r")):  # the hand-back rides on the next frame
        client.receive_data(frame)
    assert client.next_event()[0] == m.Result(1, b"r")
    assert not client.shm._lent and len(client.shm._free) == 1
    actor.release_segments()
    client.release_segments()
    assert not segments(store.tag) and store.held == 0


def test_a_staged_message_that_is_never_sent_frees_its_segment(new_store):
    store = new_store()
    client, actor = _pair("h", "h", store)
    views = client.shm.stage([pickle_buffer(np.ones(1 << 17, dtype=np.uint8))])
    assert len(client.shm._lent) == 1
    client.max_message_bytes = 1000
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        client.send(m.Call(1, "echo", b"p"), views)
    assert not client.shm._lent and len(client.shm._free) == 1  # free for the next message
    views = client.shm.stage([pickle_buffer(np.ones(1 << 16, dtype=np.uint8))])
    client.shm.unstage(views)  # its message went on another connection
    assert not client.shm._lent and len(segments(store.tag)) == 1
    del views  # a segment lives while a process maps it
    actor.release_segments()
    client.release_segments()
    assert not segments(store.tag) and store.held == 0


def test_a_public_segment_is_mapped_from_its_reference_and_refuses_what_is_not_it():
    """`parl_remote.shm.Segment`: attach checks the reference names that segment (its name on
    its owner's descriptor, this user's, private, large enough) before mapping it."""
    from parl_remote.shm import Segment, SegmentRef

    owner = Segment.create(100, prefix="parl-test")
    try:
        assert owner.owner and owner.size == 100 and owner.name.startswith("parl-test-")
        assert os.stat(f"/proc/self/fd/{owner.ref.fd}").st_mode & 0o777 == 0o600
        peer = Segment.attach(tuple(owner.ref))  # plain values, as a call carries them
        peer.buffer[:5] = b"hello"
        assert bytes(owner.buffer[:5]) == b"hello" and not peer.owner
        name, pid, fd, size = owner.ref
        for bad in (None, "x", (name, pid, fd), ("../x", pid, fd, size), (name, True, fd, size)):
            with pytest.raises(ValueError, match="not a segment reference"):
                Segment.attach(bad)
        with pytest.raises(ValueError, match="holds 100 bytes"):
            Segment.attach(SegmentRef(name, pid, fd, 101))
        other = Segment.create(100, prefix="parl-test")
        try:
            with pytest.raises(ValueError, match="is not the segment"):
                Segment.attach(SegmentRef(name, pid, other.ref.fd, size))
        finally:
            other.close()
        with pytest.raises(ValueError, match="prefix"):
            Segment.create(1, prefix="../x")
        with pytest.raises(ValueError, match="size"):
            Segment.create(-1)
        view = np.frombuffer(peer.buffer, np.uint8)
        peer.close()
        owner.close()
        assert peer.buffer is None and owner.buffer is None
        with pytest.raises(OSError):
            Segment.attach((name, pid, fd, size))  # its owner let go: none can attach now
        assert bytes(view[:5]) == b"hello"  # what is still viewed stays mapped
    finally:
        owner.close()


def test_a_segment_pool_lends_until_the_holder_goes_and_makes_at_most_its_limit():
    from parl_remote.shm import SegmentPool

    class Holder:
        pass

    pool = SegmentPool(4096, limit=2, prefix="parl-test")
    first, second = pool.acquire(), pool.acquire()
    assert first is not None and second is not None and first is not second
    assert pool.acquire() is None  # the limit
    holder = Holder()
    pool.lend(first, holder)
    pool.release(second)  # acquired, not lent: free at once
    assert pool.acquire() is second and pool.acquire() is None
    del holder  # the loan ends with its holder
    assert pool.acquire() is first
    pool.close()
    assert pool.acquire() is None and pool.segments == []
    assert first.buffer is None and second.buffer is None
