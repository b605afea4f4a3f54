"""The Ray engine: `@parl.remote_class` actors on a real local Ray (`parl.connect(backend="ray")`).

One Ray for the whole module (2 CPUs, no dashboard, a private temp dir and HOME), started by a
module fixture and shut down in its teardown. A file lock (shared with test_ray_cluster.py)
keeps a second pytest-xdist worker from starting another Ray at the same time. Every actor a
test makes is killed after it, and the next test starts once Ray has both CPUs free again.

Besides its own tests, the module runs the shared suite (`_SHARED` below): the engine-neutral
tests of the xparl modules, with this module's Ray versions of the engine fixtures.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import psutil
import pytest

import parl_remote
from parl_remote import RemoteActorDiedError, RemoteError, RemoteSerializeError, ResourceError
from parl_remote._config import settings
from tests.remote import test_api, test_failures, test_hardening, test_shipping_and_logs
from tests.remote.conftest import init_test_ray, one_ray_at_a_time, wait_until

pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def ray_client(tmp_path_factory):
    ray = pytest.importorskip("ray", reason='Ray is not installed: pip install "parl-remote[ray]"')
    # One Ray at a time on this machine, whichever xdist worker runs this module.
    with one_ray_at_a_time(tmp_path_factory), pytest.MonkeyPatch.context() as mp:
        # Short paths: Ray's unix sockets live under its temp dir.
        tmp = tempfile.mkdtemp(prefix="pr", dir="/tmp")
        os.makedirs(f"{tmp}/home")
        mp.setenv("RAY_TMPDIR", tmp)
        mp.setenv("HOME", f"{tmp}/home")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        # Ray starts its workers at niceness 15: beside the other test processes they would
        # wait for the CPU behind everything else (an actor's start took 76 s instead of 21 s
        # with the two cores busy).
        mp.setenv("RAY_worker_niceness", "0")
        try:
            init_test_ray(
                ray,
                address="local",
                num_cpus=2,
                include_dashboard=False,
                object_store_memory=150 * 2**20,
                log_to_driver=True,
                _temp_dir=f"{tmp}/ray",
            )
            client = parl_remote.connect(backend="ray")
            yield client
        finally:
            parl_remote.disconnect()
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def client(ray_client):
    """The module's Ray client; every actor made in the test is stopped after it."""
    yield parl_remote.connect(backend="ray")
    gc.collect()
    now = parl_remote.connect(backend="ray")
    for ref in list(now.refs.values()):
        ref.release()
    ray = now.ray
    wait_until(lambda: ray.available_resources().get("CPU") == 2, 30, 0.05, "Ray's CPUs freed")


@pytest.fixture
def connected(client):
    """What the shared suite's tests take: here, the Ray client (see `_SHARED` below)."""
    return client


@pytest.fixture
def engine(client) -> str:
    """The engine this test's actors run on."""
    return "ray"


@pytest.fixture
def actors_freed(client):
    """A function that waits until every actor the test made is freed (both CPUs back)."""
    ray = client.ray

    def wait() -> None:
        wait_until(lambda: ray.available_resources().get("CPU") == 2, 30, 0.05, "CPUs freed")

    return wait


@pytest.fixture
def reconnect(client):
    """A function that connects this process again, with other `parl.connect` arguments."""

    def again(**kwargs):
        parl_remote.disconnect()  # the module's Ray stays: this process had joined it itself
        return parl_remote.connect(backend="ray", **kwargs)

    yield again
    parl_remote.disconnect()
    parl_remote.connect(backend="ray")


# The shared suite: every test of these modules that takes an engine fixture (`connected`,
# `engine`, `actors_freed`, `reconnect`), run here against Ray as it is, with these fixtures
# of this module. Those marked `xparl_only` stay out (each mark says why).
_ENGINE_FIXTURES = {"connected", "engine", "actors_freed", "reconnect"}
_SHARED_MODULES = (test_api, test_failures, test_hardening, test_shipping_and_logs)


def _shared(module) -> dict:
    tests = {}
    for name, test in vars(module).items():
        if not name.startswith("test_") or not inspect.isfunction(test):
            continue
        marks = {mark.name for mark in getattr(test, "pytestmark", ())}
        if "xparl_only" in marks:
            continue
        if _ENGINE_FIXTURES & set(inspect.signature(test).parameters):
            tests[f"{name}_on_ray"] = test
    return tests


_SHARED = {name: test for module in _SHARED_MODULES for name, test in _shared(module).items()}
globals().update(_SHARED)


@parl_remote.remote_class
class Counter:
    def __init__(self, start=0):
        self.count = start
        self.seen = []

    def add(self, n=1):
        self.count += n
        self.seen.append(n)
        return self.count

    def pid(self):
        return os.getpid()

    def cwd(self):
        return os.getcwd()

    def fail(self, text):
        raise KeyError(text)

    def echo(self, value):
        return value

    def shout(self, text):
        print(text, file=sys.stderr, flush=True)

    def crash(self):
        os._exit(7)

    def leave(self, code):
        sys.exit(code)

    def hog(self, mb):
        self.ballast = [*getattr(self, "ballast", []), np.ones(int(mb * 1e6), dtype=np.uint8)]
        return len(self.ballast)

    def cwd_file(self, name):
        with open(name) as f:
            return f.read()

    def call_other(self, other, n):
        return other.add(n)

    async def wait_for(self, name):
        event = self._events(name)
        await asyncio.wait_for(event.wait(), 20)
        return name

    def _events(self, name):
        if not hasattr(self, "events"):
            self.events = {}
        return self.events.setdefault(name, asyncio.Event())


@parl_remote.remote_class
class Broken:
    def __init__(self, how):
        if how == "raise":
            raise ValueError("no good")
        sys.exit(5)


def test_a_failing_constructor_raises_and_frees_the_actor(client):
    with pytest.raises(ValueError, match="no good") as info:
        Broken("raise")
    assert isinstance(info.value, RemoteError)
    with pytest.raises(RemoteActorDiedError, match=r"sys.exit\(5\)"):
        asyncio.run(Broken.aio("exit"))
    ray = client.ray
    wait_until(lambda: ray.available_resources().get("CPU") == 2, 30, 0.05, "both CPUs freed")


def test_blocking_calls_from_many_threads(client):
    counter = Counter(10)
    assert counter.add(1) == 11
    results = []

    def work():
        for _ in range(20):
            results.append(counter.add(1))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == list(range(12, 92))
    assert counter.count == 91


def test_awaitable_calls_raise_the_same_errors(client):
    async def main():
        counter = await Counter.aio()
        with pytest.raises(KeyError, match="boom") as info:
            await counter.fail("boom")
        assert isinstance(info.value, RemoteError)
        with pytest.raises(RemoteSerializeError, match="argument 0"):
            await counter.echo(threading.Lock())
        with pytest.raises(RemoteActorDiedError, match="died"):
            await counter.crash()
        with pytest.raises(RemoteActorDiedError):
            await counter.add(1)

    asyncio.run(main())


def test_kill_fails_waiting_and_later_calls(client):
    counter = Counter()

    async def main():
        waiting = asyncio.ensure_future(counter.aio.wait_for("never"))
        await asyncio.sleep(0.2)
        parl_remote.kill(counter)
        with pytest.raises(RemoteActorDiedError, match="killed by parl.kill"):
            await asyncio.wait_for(waiting, 20)

    asyncio.run(main())
    with pytest.raises(RemoteActorDiedError, match="killed by parl.kill"):
        counter.add(1)
    parl_remote.kill(counter)  # already gone: nothing happens


def test_a_killed_actors_directory_goes_when_the_next_actor_starts(client):
    """`ray.kill` leaves an actor no time to remove its code directory: the next actor does."""
    counter = Counter()
    pid, workdir = counter.pid(), counter.cwd()
    assert os.path.basename(workdir).startswith(f"parl-ray-actor-{pid}-")
    assert os.path.isdir(workdir)
    parl_remote.kill(counter)
    wait_until(lambda: not psutil.pid_exists(pid), 30, 0.05, "the killed actor's process to exit")
    assert os.path.isdir(workdir)  # nothing removed it
    later = Counter()
    assert later.add(1) == 1 and not os.path.exists(workdir)
    assert os.path.isdir(later.cwd())


def test_no_resources_is_a_resource_error(client, monkeypatch):
    monkeypatch.setattr(settings, "resource_wait_s", 1.0)
    Gpu = parl_remote.remote_class(Counter._original, n_gpu=1)
    with pytest.raises(ResourceError, match="1 GPU"):
        Gpu()


def test_del_frees_the_actor(client):
    counter = Counter()
    pid = counter.pid()
    assert psutil.pid_exists(pid)
    del counter
    gc.collect()
    wait_until(lambda: not psutil.pid_exists(pid), 30, 0.05, "the actor's process to exit")


def test_a_handle_passed_to_another_actor(client, capfd):
    # `Counter` has an `async def` method: its host is an async Ray actor, where a blocking
    # `ray.get` makes Ray warn; a blocking parl call there waits without it.
    first, second = Counter(), Counter(100)
    assert first.call_other(second, 5) == 105
    assert second.count == 105
    first.shout("after the call")  # to stderr, where Ray's warning would be before it
    seen = []

    def echoed():
        out, err = capfd.readouterr()
        seen.append(out + err)
        return "after the call" in "".join(seen)

    wait_until(echoed, 30, 0.1, "the actor's stderr echoed here")
    assert "blocking ray.get" not in "".join(seen)


def test_distributed_files_and_user_modules_are_shipped(client, tmp_path, monkeypatch):
    (tmp_path / "data.txt").write_text("shipped")
    (tmp_path / "ray_user_mod_x.py").write_text(
        textwrap.dedent(
            """
            import parl_remote

            @parl_remote.remote_class
            class Reader:
                def read(self, name):
                    with open(name) as f:
                        return f.read()
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import ray_user_mod_x

    parl_remote.disconnect()  # the module's Ray stays: this process had joined it itself
    try:
        parl_remote.connect(backend="ray", distributed_files=["data.txt"])
        reader = ray_user_mod_x.Reader()
        assert reader.read("data.txt") == "shipped"
        assert "class Reader" in reader.read("ray_user_mod_x.py")  # its own copy of the module
    finally:
        parl_remote.disconnect()
        sys.modules.pop("ray_user_mod_x", None)
        parl_remote.connect(backend="ray")


def test_connect_checks_its_arguments(client):
    assert parl_remote.connect(backend="ray") is client
    assert parl_remote.connect() is client  # what samplers call: the process's cluster
    with pytest.raises(ValueError, match="backend='spark'"):
        parl_remote.connect(backend="spark")
    with pytest.raises(parl_remote.ClusterError, match="already connected"):
        parl_remote.connect("127.0.0.1:1")


def test_ray_missing_is_an_import_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r'pip install "parl-remote\[ray\]"'):
        parl_remote.connect(backend="ray")


@pytest.mark.slow
def test_samplers_run_unchanged_on_ray(client):
    pytest.importorskip("gymnasium")
    from parl_algos.samplers import AsyncSampler, ParallelSampler
    from tests.algos.test_samplers_remote import ENV_FN, SIZES, LinearAgent

    with ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as sampler:
        first, second = sampler.collect(), sampler.collect()
        assert len(first.obs) == len(second.obs) > 0
    with AsyncSampler(ENV_FN, LinearAgent(), **SIZES) as sampler:
        assert len(sampler.collect().obs) > 0


@pytest.mark.slow
def test_a_ray_that_connect_started_stops_with_disconnect(ray_client):
    # A process of its own: this one's Ray was started by the fixture, not by connect.
    script = textwrap.dedent(
        """
        import ray, parl_remote

        @parl_remote.remote_class
        class Square:
            def of(self, x):
                return x * x

        client = parl_remote.connect(backend="ray", cpu_num=1)
        assert client.owns_ray and ray.cluster_resources()["CPU"] == 1
        print("squared", Square().of(7))
        parl_remote.disconnect()
        print("initialized after disconnect:", ray.is_initialized())
        """
    )
    tmp = tempfile.mkdtemp(prefix="pr", dir="/tmp")  # short: Ray's sockets live there
    env = dict(
        os.environ,
        RAY_TMPDIR=tmp,
        HOME=tmp,
        RAY_ADDRESS="",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_worker_niceness="0",
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "squared 49" in done.stdout
    assert "initialized after disconnect: False" in done.stdout


def test_importing_parl_remote_does_not_import_ray():
    code = "import sys, parl, parl_remote; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
