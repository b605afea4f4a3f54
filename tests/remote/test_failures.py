"""Every error kind a caller can see, and every way an actor's slot comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import parl
import parl_remote
from tests.remote.conftest import client_env, make_cluster, run_client_script, wait_until


@parl.remote_class
class Fragile:
    def pid(self):
        return os.getpid()

    def crash(self):
        os._exit(3)

    def exit(self, code):
        sys.exit(code)

    def abort(self):
        os.kill(os.getpid(), signal.SIGKILL)

    def hog(self, mb):
        self.block = bytearray(mb * 1024 * 1024)
        for i in range(0, len(self.block), 4096):
            self.block[i] = 1
        time.sleep(30)
        return "survived"

    def sleep(self, seconds):
        time.sleep(seconds)
        return "woke"

    def ping(self):
        return "pong"


@parl.remote_class(max_memory=300)
class Limited(Fragile._original):
    pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = make_cluster(tmp_path_factory.mktemp("failures"), workers=(2,))
    yield cluster
    cluster.stop()


@pytest.fixture
def connected(cluster):
    """This module's cluster (2 slots, a short resource wait); the Ray suite gives its own."""
    with client_env(cluster, PARL_RESOURCE_WAIT_S=1.5):
        parl.connect(cluster.address)
        yield cluster


def used(cluster) -> int:
    return cluster.status()["totals"]["cpu_used"]


def _slots_back(cluster):
    wait_until(lambda: used(cluster) == 0, timeout=10, what="every slot to come back")


# How an actor's process ended, as the caller reads it. Ray does not learn a process's exit
# status: it says the actor died, and only `sys.exit` and a memory limit leave their reason.
_DIED = {
    "xparl": {},
    "ray": {"exited with code": "its Ray actor died", "SIGKILL": "its Ray actor died"},
}


def _died(engine: str, xparl_reason: str) -> str:
    for key, reason in _DIED[engine].items():
        if key in xparl_reason:
            return reason
    return xparl_reason


@pytest.mark.parametrize(
    ("method", "args", "reason"),
    [
        ("crash", (), r"its process exited with code 3"),
        ("exit", (7,), r"the actor called sys.exit\(7\)"),
        ("abort", (), r"its process was killed by SIGKILL"),
    ],
    ids=["crash", "exit", "abort"],
)
def test_a_dead_actor_raises_on_the_pending_call_and_every_later_one(
    engine, actors_freed, method, args, reason
):
    reason = _died(engine, reason)
    actor = Fragile()
    neighbour = Fragile()
    with pytest.raises(parl.RemoteActorDiedError, match=reason):
        getattr(actor, method)(*args)
    with pytest.raises(parl.RemoteActorDiedError, match=reason):
        actor.ping()

    async def later():
        with pytest.raises(parl.RemoteActorDiedError, match=reason):
            await actor.aio.ping()

    asyncio.run(later())
    assert neighbour.ping() == "pong"  # the other actor is untouched
    actor = neighbour = None
    actors_freed()


def test_kill_9_of_the_actor_process_from_outside_during_a_call(engine, actors_freed):
    actor = Fragile()
    pid = actor.pid()
    future_result = {}

    def call():
        try:
            actor.sleep(30)
        except parl.RemoteActorDiedError as exc:
            future_result["error"] = exc

    import threading

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    caller.join(10)
    assert not caller.is_alive()
    assert _died(engine, "killed by SIGKILL") in str(future_result["error"])
    actor = None
    actors_freed()


def test_memory_limit(actors_freed):
    actor = Limited()
    with pytest.raises(
        parl.RemoteActorDiedError, match=r"exceeded its memory limit of 300 MB \(RSS \d+ MB\)"
    ):
        actor.hog(600)
    with pytest.raises(parl.RemoteActorDiedError, match="memory limit"):
        actor.ping()
    del actor
    actors_freed()


def test_future_mode_on_a_dead_actor(engine):
    @parl.remote_class(wait=False)
    class F:
        def crash(self):
            os._exit(1)

        def ping(self):
            return 1

    f = F()
    pending = f.crash()
    with pytest.raises(parl.RemoteActorDiedError, match=_died(engine, "exited with code 1")):
        pending.get(timeout=10)
    with pytest.raises(parl.RemoteActorDiedError):
        f.ping().get(timeout=10)


@pytest.mark.xparl_only  # counts xparl's slots
def test_no_free_slot_is_a_resource_error_stating_the_wait(connected):
    client = connected
    _slots_back(client)
    a, b = Fragile(), Fragile()
    start = time.monotonic()
    with pytest.raises(
        parl.ResourceError,
        match=r"no free CPU slot for Fragile within 1.5 s.*2 CPU slots on 1 workers, 2 in use",
    ):
        Fragile()
    assert time.monotonic() - start < 10
    del a
    c = Fragile()  # a slot came back: creation works again
    assert c.ping() == "pong"
    del b, c
    _slots_back(client)


@pytest.mark.xparl_only  # connects to the cluster's address
def test_a_waiting_creation_gets_the_slot_that_frees(connected):
    client = connected
    _slots_back(client)
    a, b = Fragile(), Fragile()
    with client_env(client, PARL_RESOURCE_WAIT_S=20):
        parl.connect(client.address)
        import threading

        victim = a.pid()
        timer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
        timer.start()
        c = Fragile()  # waits until a's slot is back
        assert c.ping() == "pong"
        timer.join()
    del a, b, c


def test_constructor_errors_are_raised_and_free_the_slot(actors_freed):
    @parl.remote_class
    class Broken:
        def __init__(self, x):
            raise KeyError(x)

    actors_freed()
    with pytest.raises(KeyError, match="'boom'"):
        Broken("boom")
    actors_freed()


@pytest.mark.xparl_only  # counts xparl's slots after a client's kill -9
def test_the_client_process_exit_frees_its_actors(cluster):
    code = f"""
    import os, time, parl
    parl.connect({cluster.address!r})

    @parl.remote_class
    class A:
        def pid(self):
            return os.getpid()

    actors = [A(), A()]
    print("PIDS", *[a.pid() for a in actors], flush=True)
    time.sleep(60)
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        text=True,
        env=cluster.env,
    )
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2 and used(cluster) == 2
        proc.kill()  # kill -9 of the client
        proc.wait(10)
        _slots_back(cluster)
        wait_until(
            lambda: not any(psutil.pid_exists(p) for p in pids), what="the actor processes to end"
        )
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.xparl_only  # xparl's cluster token
def test_wrong_token_is_refused_with_a_clear_message_on_both_ends(cluster):
    result = run_client_script(
        f"""
        import parl
        try:
            parl.connect({cluster.address!r})
        except parl.RemoteError as exc:
            print(type(exc).__name__, exc)
        """,
        cluster,
        env={"PARL_CLUSTER_TOKEN": "not-the-token"},
    )
    assert "AuthenticationError" in result.stdout and "wrong cluster token" in result.stdout
    wait_until(
        lambda: "does not know the cluster token" in cluster.log(), what="the master's log line"
    )


@pytest.mark.xparl_only  # an xparl address
def test_connect_to_nothing_is_a_clear_error(monkeypatch):
    from tests.remote.conftest import free_port

    monkeypatch.setenv("PARL_CLUSTER_TOKEN", "some-token")
    port = free_port()
    with pytest.raises(
        parl_remote.NotConnectedError,
        match=rf"no PARL master answers at 127.0.0.1:{port}.*xparl start",
    ):
        parl.connect(f"127.0.0.1:{port}")
