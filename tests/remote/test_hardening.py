"""Operator and PARL-compatibility details: CPU count without affinity, `xparl --version`,
stale cluster state, attribute shadowing, what `distributed_files` ships and when."""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import psutil
import pytest

import parl_remote
from parl_remote import _util
from tests.remote.conftest import client_env, free_port, make_cluster, wait_until
from tests.remote.test_cluster import xparl


def test_available_cpus_without_sched_getaffinity(monkeypatch):
    assert _util.available_cpus() >= 1
    monkeypatch.delattr(_util.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(_util.os, "cpu_count", lambda: 7)
    assert _util.available_cpus() == 7
    monkeypatch.setattr(_util.os, "cpu_count", lambda: None)
    assert _util.available_cpus() == 1


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.4.5.6", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("fe80::1", False),
        ("example.org", False),
    ],
)
def test_is_loopback_decides_whether_xparl_start_warns_of_plaintext(host, loopback):
    assert _util.is_loopback(host) is loopback


@pytest.mark.xparl_only  # the xparl CLI
def test_xparl_version_prints_the_package_version():
    result = xparl("--version", env=dict(os.environ))
    assert result.returncode == 0
    assert result.stdout.strip() == f"xparl {importlib.metadata.version('parl-remote')}"


def _stale_state(home, port: int) -> str:
    """A state file left by a cluster that died without `xparl stop` (its PIDs are gone)."""
    dead = psutil.Popen(["true"])
    dead.wait(10)
    entry = {"pid": dead.pid, "create_time": 1.0, "log": "gone.log"}
    path = home / "clusters" / f"master-{port}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"port": port, "host": "127.0.0.1", "connect_host": "127.0.0.1"}
    path.write_text(json.dumps({**state, "master": entry, "workers": [entry]}))
    return path


@pytest.mark.xparl_only  # the xparl CLI's cluster state
def test_dead_clusters_state_does_not_count(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PARL_CLUSTER_TOKEN"}
    env["PARL_HOME"] = str(home)
    stale = _stale_state(home, free_port())
    port = free_port()
    started = xparl("start", "--port", str(port), "--cpu_num", "1", "--monitor_port", "0", env=env)
    state_file = home / "clusters" / f"master-{port}.json"
    try:
        assert started.returncode == 0, started.stderr
        status = xparl("status", env=env)
        assert status.returncode == 0, status.stderr
        assert "several clusters" not in status.stderr
        assert f":{port}" in status.stdout
        assert not stale.exists()
        state = json.loads(state_file.read_text())
        pids = [state["master"]["pid"], *(w["pid"] for w in state["workers"])]
        stopped = xparl("stop", env=env)
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), what="the cluster to end")
        nothing = xparl("status", env=env)
        assert nothing.returncode == 1 and "no cluster was started" in nothing.stderr
    finally:
        if state_file.exists():
            state = json.loads(state_file.read_text())
            for proc in [state["master"], *state["workers"]]:
                _util.kill_pid(proc["pid"], create_time=proc["create_time"])


@parl_remote.remote_class
class Shadowed:
    def __init__(self):
        self.arg1 = 5
        self.value = 7

    def arg1(self):  # hidden by the instance attribute, as in PARL
        return "method"

    def other(self):
        return "other"


def test_an_attribute_hides_a_method_of_its_name(connected):
    s = Shadowed()
    assert s.arg1 == 5
    assert s.other() == "other"
    assert s.value == 7
    with pytest.raises(TypeError):
        s.value()
    with pytest.raises(TypeError):
        s.arg1()  # 5 is not callable, here as locally

    async def main():
        a = await Shadowed.aio()
        return await a.arg1, await s.aio.arg1, await a.other()

    assert asyncio.run(main()) == (5, 5, "other")
    twin = s.aio
    s.other = "attribute"  # set through the handle, it hides the method too
    assert s.other == "attribute" and s.arg1 == 5
    assert asyncio.run(_await_attribute(twin, "other")) == "attribute"


async def _await_attribute(handle, name):
    return await getattr(handle, name)


@parl_remote.remote_class
class ShadowsLater:
    def arg1(self):
        return "method"

    def set_arg1(self, value):
        self.arg1 = value

    def other(self):
        return "other"


@parl_remote.remote_class
class Peer:
    def keep(self, handle):
        self.handle = handle
        return handle.arg1()  # not hidden yet

    def read(self):
        return self.handle.other(), self.handle.arg1  # learns it with the first reply

    def call(self):
        self.handle.arg1()


def test_an_attribute_set_by_a_later_method_hides_the_method(connected):
    s = ShadowsLater()
    twin = s.aio
    peer = Peer()
    assert peer.keep(s) == "method"
    assert s.arg1() == "method"
    assert s.set_arg1(5) is None
    assert s.arg1 == 5  # the reply told this process
    assert asyncio.run(_await_attribute(twin, "arg1")) == 5
    with pytest.raises(TypeError, match="not callable"):
        s.arg1()
    assert s.other() == "other"
    with pytest.raises(TypeError, match="not callable"):
        peer.call()  # a process not told yet: the actor finds the attribute and raises
    assert peer.read() == ("other", 5)  # told with its next reply
    parl_remote.kill(peer)  # its CPU for the next actor (a Ray of 2 CPUs)
    later = ShadowsLater()
    assert later.arg1() == "method"  # another actor of the class is untouched


@parl_remote.remote_class
class Lister:
    def tree(self, top):
        found = {}
        for dirpath, dirnames, names in os.walk(top):
            for d in dirnames:
                found[os.path.relpath(os.path.join(dirpath, d), top) + "/"] = None
            for n in names:
                with open(os.path.join(dirpath, n)) as f:
                    found[os.path.relpath(os.path.join(dirpath, n), top)] = f.read()
        return found


def test_distributed_files_are_read_at_connect_with_empty_folders(reconnect, tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "empty" / "deeper").mkdir(parents=True)
    (data / "sub").mkdir()
    (data / "sub" / "a.txt").write_text("first")
    (data / "b.txt").write_text("kept")
    monkeypatch.chdir(tmp_path)
    reconnect(distributed_files=["data"])
    (data / "sub" / "a.txt").write_text("changed after connect")
    (data / "b.txt").unlink()
    tree = Lister().tree("data")
    assert tree == {
        "empty/": None,
        "empty/deeper/": None,
        "sub/": None,
        "sub/a.txt": "first",
        "b.txt": "kept",
    }


def test_a_missing_distributed_file_fails_at_connect(reconnect, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="matches no file"):
        reconnect(distributed_files=["nothing.txt"])
    with pytest.raises(parl_remote.NotConnectedError):
        Lister()


@parl_remote.remote_class
class Sleeper:
    def nap(self, seconds):
        time.sleep(seconds)
        return seconds

    def pid(self):
        return os.getpid()


async def _await(method, *args):
    return await method(*args)


@pytest.mark.xparl_only  # counts xparl's slots
def test_kill_frees_the_actor_and_its_slot_now(tmp_path):
    cluster = make_cluster(tmp_path, workers=(1,))
    try:
        with client_env(cluster):
            parl_remote.connect(cluster.address)
            actor = Sleeper()
            pid = actor.pid()
            outcome = {}

            def pending():
                try:
                    outcome["value"] = actor.nap(60)
                except BaseException as exc:
                    outcome["error"] = exc

            caller = threading.Thread(target=pending, daemon=True)
            caller.start()
            wait_until(lambda: cluster.status()["actors"][0]["state"] == "busy", what="busy")
            parl_remote.kill(actor)
            caller.join(15)
            assert isinstance(outcome.get("error"), parl_remote.RemoteActorDiedError)
            assert "killed by parl.kill()" in str(outcome["error"])
            with pytest.raises(parl_remote.RemoteActorDiedError, match="killed"):
                actor.pid()
            with pytest.raises(parl_remote.RemoteActorDiedError, match="killed"):
                asyncio.run(_await(actor.aio.pid))
            parl_remote.kill(actor)  # idempotent
            parl_remote.kill(actor.aio)
            wait_until(lambda: not psutil.pid_exists(pid), what="the actor process to end")
            # Its only slot is free again: a new actor gets it.
            assert Sleeper().pid() != pid
    finally:
        cluster.stop()


def test_kill_takes_only_handles():
    with pytest.raises(TypeError, match="actor handle"):
        parl_remote.kill(object())


# -- child processes -------------------------------------------------------------------------
def _child_creates_an_actor(address: str | None) -> tuple[int, int]:
    """In a child process: (optionally) connect, create an actor, and ask it something."""
    if address is not None:
        client = parl_remote.connect(address)
        assert client.address == address
    actor = Sleeper()
    return os.getpid(), actor.pid()


def _run_children(executor_factory, address: str | None, parent_actor) -> None:
    with executor_factory() as pool:
        futures = [pool.submit(_child_creates_an_actor, address) for _ in range(2)]
        # The parent's actors keep working while the children use the cluster.
        assert parent_actor.nap(0) == 0
        for future in futures:
            child_pid, actor_pid = future.result(timeout=30)
            assert child_pid != os.getpid() and actor_pid != parent_actor.pid()
    assert parent_actor.nap(0) == 0


@pytest.mark.xparl_only  # fork children: a Ray driver does not survive fork
@pytest.mark.parametrize("explicit", [True, False], ids=["connect", "inherited"])
def test_fork_children_get_clients_of_their_own(connected, explicit):
    address = parl_remote.connect(connected.address).address
    assert address == connected.address
    parent_actor = Sleeper()
    ctx = multiprocessing.get_context("fork")
    _run_children(
        lambda: ProcessPoolExecutor(2, mp_context=ctx),
        address if explicit else None,
        parent_actor,
    )
    with ctx.Pool(1) as pool:
        child_pid, _ = pool.apply_async(_child_creates_an_actor, (None,)).get(timeout=30)
        assert child_pid != os.getpid()
    assert parent_actor.nap(0) == 0


@pytest.mark.xparl_only  # children join xparl's embedded cluster
def test_spawn_children_join_the_embedded_cluster(monkeypatch):
    monkeypatch.delenv("PARL_CLUSTER_TOKEN", raising=False)
    client = parl_remote.connect(cpu_num=3)
    try:
        host, _, port = client.address.rpartition(":")
        assert host == "127.0.0.1" and port.isdigit()
        parent_actor = Sleeper()
        for method in ("spawn", "forkserver"):
            ctx = multiprocessing.get_context(method)
            _run_children(
                lambda ctx=ctx: ProcessPoolExecutor(1, mp_context=ctx), client.address, parent_actor
            )
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            result = pool.apply_async(_child_creates_an_actor, (client.address,))
            assert result.get(timeout=30)[0] != os.getpid()
    finally:
        parl_remote.disconnect()
    assert "PARL_CLUSTER_TOKEN" not in os.environ


# -- handles as arguments --------------------------------------------------------------------
@parl_remote.remote_class
class Relay:
    def __init__(self):
        self.peer = None

    def keep(self, handle):
        self.peer = handle
        return handle

    def kind(self, handle):
        awaitable = isinstance(handle, parl_remote.AsyncActorHandle)
        return "AsyncActorHandle" if awaitable else "ActorHandle"

    def ask(self):
        return self.peer.pid()

    async def aask(self):
        return await self.peer.pid()

    def hand_on(self, other, handle):
        return other.keep(handle)

    def ask_other(self, other):
        return other.ask()

    def kill_peer(self):
        parl_remote.kill(self.peer)

    def pause(self, seconds):
        time.sleep(seconds)  # holds the actor's loop: calls sent meanwhile wait unread


@pytest.mark.xparl_only  # three actors at once: the Ray suite's Ray has 2 CPUs
def test_a_handle_passed_through_two_actors_still_works(connected):
    first, second = Relay(), Relay()
    target = Sleeper()
    pid = target.pid()
    returned = first.hand_on(second, target)
    assert returned._parl_ref is target._parl_ref  # back here: the very same actor reference
    assert second.ask() == pid
    assert first.ask_other(second) == pid
    del first  # its slot goes to the next actor
    # The actor lives while any process holds a handle of it: here the second relay does.
    del target, returned
    gc.collect()
    assert second.ask() == pid
    # A temporary handle lives on in the relay; the one it replaced was the last of `pid`.
    second.keep(Sleeper())
    gc.collect()
    other_pid = second.ask()
    assert other_pid != pid and psutil.pid_exists(other_pid)
    wait_until(lambda: not psutil.pid_exists(pid), what="the actor no one holds to end")


def test_handles_keep_their_kind(connected):
    relay, target = Relay(), Sleeper()
    assert isinstance(relay.keep(target.aio), parl_remote.AsyncActorHandle)
    assert relay.kind(target.aio) == "AsyncActorHandle"
    assert relay.kind(target) == "ActorHandle"
    assert asyncio.run(_await(relay.aio.aask)) == target.pid()


_KEPT = []


def _child_makes_an_actor() -> Sleeper:
    actor = Sleeper()
    _KEPT.append(actor)  # this process holds it until it exits
    return actor


@pytest.mark.xparl_only  # a fork child: a Ray driver does not survive fork
def test_an_actor_ends_with_its_creator_and_other_holders_hear_it(connected):
    relay = Relay()
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        actor = pool.submit(_child_makes_an_actor).result(timeout=30)
        pid = actor.pid()
        relay.keep(actor)
        assert relay.ask() == pid
    # The pool's process exited: its client left, and its actor ended with it.
    wait_until(lambda: not psutil.pid_exists(pid), what="the actor to end with its creator")
    with pytest.raises(parl_remote.RemoteActorDiedError):
        actor.pid()
    with pytest.raises(parl_remote.RemoteActorDiedError):
        relay.ask()


def test_kill_reaches_every_holder(connected):
    relay, target = Relay(), Sleeper()
    relay.keep(target)
    parl_remote.kill(target)
    wait_until(lambda: _killed(relay.ask), timeout=5, what="the holder to see the kill")


def test_any_holder_may_kill(connected):
    relay, target = Relay(), Sleeper()
    relay.keep(target.aio)
    relay.kill_peer()
    relay.kill_peer()  # idempotent there too
    wait_until(lambda: _killed(target.pid), timeout=5, what="the creator to see the kill")


def _killed(call) -> bool:
    """Whether `call()` fails because its actor was killed (False while it still answers)."""
    try:
        call()
    except parl_remote.RemoteActorDiedError as exc:
        assert "killed by parl.kill()" in str(exc)
        return True
    return False


def test_a_handle_sent_without_waiting_and_dropped_lives_until_received(connected):
    relay = Relay()

    async def send_and_drop():
        target = await Sleeper.aio()
        pid = await target.pid()
        paused = relay.aio.pause(2)  # the next call is read only after two seconds
        relay.aio.keep(target)  # not waited for, and dropped with `target` right away
        del target
        gc.collect()
        await paused
        return pid, await relay.aio.aask()

    pid, answered = asyncio.run(send_and_drop())
    assert answered == pid
    relay.keep(None)  # the relay lets go: no process holds it now
    wait_until(lambda: not psutil.pid_exists(pid), what="the actor no one holds to end")


@pytest.mark.xparl_only  # restarts the xparl master
def test_holds_come_back_after_a_master_restart(tmp_path):
    quick = {"PARL_HEARTBEAT_S": 0.5, "PARL_HEARTBEAT_TIMEOUT_S": 10}
    cluster = make_cluster(tmp_path, workers=(3,), **quick)
    try:
        with client_env(cluster, **quick):
            parl_remote.connect(cluster.address)
            relay, target = Relay(), Sleeper()
            pid = target.pid()
            relay.keep(target)
            os.kill(cluster.master.pid, signal.SIGKILL)
            cluster.master.stop()
            cluster.start_master()  # same port: workers and clients come back to it
            wait_until(
                lambda: (
                    _quietly(cluster.status, "totals", "clients") == 2
                    and cluster.status()["totals"]["actors"] == 2
                ),
                what="both clients and the worker to re-register",
            )
            del target  # its creator lets go; the relay's process still holds it
            gc.collect()
            assert relay.ask() == pid
            relay.keep(None)  # the last holder lets go: now it ends
            wait_until(lambda: not psutil.pid_exists(pid), what="the actor no one holds to end")
    finally:
        cluster.stop()


def _quietly(status, *keys):
    """`status()[k1][k2]...`, or None while the master does not answer."""
    try:
        value = status()
    except (OSError, parl_remote.RemoteError):
        return None
    for key in keys:
        value = value[key]
    return value
