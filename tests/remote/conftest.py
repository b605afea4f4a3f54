"""Real clusters for the remote tests: processes on 127.0.0.1, always stopped by PID."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import pytest

import parl_remote
from parl_remote._config import settings
from parl_remote.cli import STATUS_PAGE
from parl_remote.engines.xparl import _cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """`n` different free ports of 127.0.0.1 (each socket stays bound until all are chosen:
    `free_port()` called twice can give the same port twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def one_ray_at_a_time(tmp_path_factory) -> Iterator[None]:
    """Hold the lock that lets one test Ray at a time run here, whichever process asks."""
    lock_path = tmp_path_factory.getbasetemp().parent / "parl-ray-tests.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def init_test_ray(ray, **kwargs) -> None:
    """`ray.init(**kwargs)`, tried a second time where Ray's node did not start in its 30 s.

    On a loaded machine Ray's own wait for its raylet can pass ("timed out during startup");
    the processes that attempt started are stopped by PID before the second one.
    """
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    try:
        ray.init(**kwargs)
        return
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
    with contextlib.suppress(Exception):
        ray.shutdown()
    started = [c for c in me.children(recursive=True) if c.pid not in before]
    for child in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(started, timeout=30)
    ray.init(**kwargs)


@dataclass
class Cluster:
    """A master and workers started by a test; `stop()` ends them all by PID."""

    address: str
    port: int
    env: dict[str, str]
    logdir: str
    master: _cluster.ProcessInfo | None = None
    workers: list[_cluster.ProcessInfo] = field(default_factory=list)
    dashboard: bool = False
    master_args: tuple[str, ...] = ()  # more of the master's command line (`--preload ...`)

    @property
    def owner(self) -> list[str]:
        """The command-line flag that ends a master or worker when the test's process is gone
        (a test run killed before it could stop its clusters leaves none behind)."""
        return ["--owner-pid", str(os.getpid())]

    @property
    def dashboard_port(self) -> int:
        """The dashboard's port (the cluster must be made with `dashboard=True`)."""
        return int(self.master.ready["dashboard"].rstrip("/").rpartition(":")[2])

    def start_master(self) -> _cluster.ProcessInfo:
        """Start the master: on a port of its choosing the first time (port 0: no other
        process can take the port between its choice and the bind), on the same one again."""
        self.master = _cluster.spawn(
            "parl_remote.master._master",
            ["--host", "127.0.0.1", "--port", str(self.port), *self.owner]
            + (["--monitor_port", "0"] if self.dashboard else [])
            + list(self.master_args),
            log=os.path.join(self.logdir, "master.log"),
            env=self.env,
        )
        if self.port == 0:
            self.port = int(self.master.ready["port"])
            self.address = f"127.0.0.1:{self.port}"
        return self.master

    def add_worker(
        self, cpu_num: int = 2, gpu: str = "", extra_env: dict | None = None
    ) -> _cluster.ProcessInfo:
        args = ["--address", self.address, "--cpu_num", str(cpu_num), *self.owner]
        if gpu:
            args += ["--gpu", gpu]
        worker = _cluster.spawn(
            "parl_remote.worker._worker",
            args,
            log=os.path.join(self.logdir, f"worker-{len(self.workers)}.log"),
            env=dict(self.env, **(extra_env or {})),
        )
        self.workers.append(worker)
        return worker

    def processes(self) -> list[int]:
        """PIDs of master, workers, and every actor process under the workers."""
        pids = []
        for info in [self.master, *self.workers]:
            if info is None:
                continue
            pids.append(info.pid)
            with contextlib.suppress(psutil.Error):
                pids += [c.pid for c in psutil.Process(info.pid).children(recursive=True)]
        return pids

    def status(self, offset: int = 0, limit: int | None = STATUS_PAGE) -> dict:
        """What `xparl status` asks for: the totals and a page of each list."""
        from parl_remote.cli import _request
        from parl_remote.wire.protocol import messages as m

        token = self.env["PARL_CLUSTER_TOKEN"].encode()
        request = lambda rid: m.StatusRequest(rid, offset, limit)  # noqa: E731
        return _request(self.address, request, token=token).status

    def stop(self) -> None:
        pids = self.processes()
        for info in [*self.workers, self.master]:
            if info is not None:
                info.stop(timeout=5)
        for pid in pids:  # actor processes die with their worker; make sure
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()

    def log(self, name: str = "master.log") -> str:
        with open(os.path.join(self.logdir, name), errors="replace") as f:
            return f.read()


def make_cluster(
    tmp_path, workers=(2,), *, dashboard: bool = False, master_args=(), **env_overrides
) -> Cluster:
    token = secrets.token_hex(16)
    env = dict(os.environ, PARL_CLUSTER_TOKEN=token, PARL_HOME=str(tmp_path / "parl-home"))
    env.update({k: str(v) for k, v in env_overrides.items()})
    cluster = Cluster(
        "127.0.0.1:0", 0, env, str(tmp_path), dashboard=dashboard, master_args=tuple(master_args)
    )
    try:
        cluster.start_master()
        for cpu_num in workers:
            cluster.add_worker(cpu_num)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def client_env(cluster: Cluster, **overrides) -> Iterator[None]:
    """This process speaks to `cluster`: its token, and settings such as short timeouts."""
    keys = {
        "PARL_CLUSTER_TOKEN": cluster.env["PARL_CLUSTER_TOKEN"],
        **{k: str(v) for k, v in overrides.items()},
    }
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    settings.reload()
    try:
        yield
    finally:
        parl_remote.disconnect()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        settings.reload()


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory):
    cluster = make_cluster(tmp_path_factory.mktemp("cluster"), workers=(3,))
    yield cluster
    cluster.stop()


@pytest.fixture
def connected(module_cluster):
    """This process is a client of the module's cluster for one test."""
    with client_env(module_cluster):
        parl_remote.connect(module_cluster.address)
        yield module_cluster


# The engine fixtures: what a test of the `@parl.remote_class` API asks of the engine its
# actors run on. Here, xparl (`connected` is a `Cluster`); tests/remote/test_ray.py gives the
# same names for Ray and runs every test that takes `connected` and is not marked
# `xparl_only` there as well.
@pytest.fixture
def engine(connected) -> str:
    """The engine this test's actors run on: "xparl" ("ray" in the Ray suite)."""
    return "xparl"


@pytest.fixture
def actors_freed(connected):
    """A function that waits until every actor the test made is freed (no slot in use)."""

    def wait() -> None:
        used = lambda: connected.status()["totals"]["cpu_used"]  # noqa: E731
        wait_until(lambda: used() == 0, timeout=10, what="every slot to come back")

    return wait


@pytest.fixture
def reconnect(connected):
    """A function that connects this process again, with other `parl.connect` arguments."""

    def again(**kwargs):
        parl_remote.disconnect()
        return parl_remote.connect(connected.address, **kwargs)

    return again


def run_client_script(
    code: str, cluster: Cluster, *, timeout: float = 60, cwd=None, env=None
) -> subprocess.CompletedProcess:
    """Run a user script (a real `__main__`) against the cluster."""
    return run_script(code, dict(cluster.env, **(env or {})), timeout=timeout, cwd=cwd)


def run_script(code: str, env: dict, *, timeout: float = 60, cwd=None):
    """Run a user script (a real `__main__`) with exactly the environment `env`."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        check=False,
    )


class CuttableProxy:
    """A loopback TCP proxy whose forwarding can be cut and restored, connections left open.

    While cut, bytes in both directions are read and dropped: to both ends the link looks
    alive at the TCP level but carries nothing, as when a network path silently fails.
    """

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self.cut = threading.Event()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        import threading

        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._closed.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self.cut.is_set():
                continue  # dropped
            try:
                dst.sendall(data)
            except OSError:
                break
        # While cut, an end that hangs up is not heard of on the other side either.
        for s in (src,) if self.cut.is_set() else (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()
        for thread in self._threads:
            thread.join(2)


@dataclass
class TappedConnection:
    """What each side of one relayed connection sent."""

    up: bytearray = field(default_factory=bytearray)
    """From the connecting side to the target."""
    down: bytearray = field(default_factory=bytearray)
    """From the target back."""


class WireTap:
    """A loopback TCP relay on an asyncio loop of its own that records both directions of
    every connection through it (`conns`), as a tap on the wire would see them."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        import asyncio
        import threading

        self.target = (target_host, target_port)
        self.conns: list[TappedConnection] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(10), "the tap did not start"

    def _run(self, started) -> None:
        import asyncio

        async def listen() -> None:
            self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            started.set()

        self._loop.run_until_complete(listen())
        self._loop.run_forever()

    async def _relay(self, reader, writer) -> None:
        import asyncio

        conn = TappedConnection()
        self.conns.append(conn)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]

        async def pump(src, dst, seen: bytearray) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    seen += data
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, conn.up), pump(up_reader, writer, conn.down))

    async def _shutdown(self) -> None:
        import asyncio

        self._server.close()
        for writer in self._writers:
            writer.close()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
        await asyncio.sleep(0.01)  # the transports' close callbacks run

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> WireTap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tls_records(data: bytes | bytearray) -> list[int]:
    """The content types of the TLS records that `data` is made of, whole; fails on anything
    else (a byte of plaintext, a record cut short)."""
    types, pos = [], 0
    while pos < len(data):
        head = data[pos : pos + 5]
        assert len(head) == 5, f"{len(data) - pos} bytes after the last whole record"
        kind, major, minor, length = head[0], head[1], head[2], int.from_bytes(head[3:5], "big")
        assert kind in (20, 21, 22, 23) and (major, minor) in ((3, 1), (3, 3)), (
            f"not a TLS record at byte {pos}: {bytes(data[pos : pos + 16])!r}"
        )
        assert pos + 5 + length <= len(data), f"a record cut short at byte {pos}"
        types.append(kind)
        pos += 5 + length
    return types
