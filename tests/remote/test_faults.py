"""Faults, with what the caller sees and how soon: each bound is stated where it is checked."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

import parl
from tests.remote.conftest import CuttableProxy, client_env, make_cluster, wait_until

pytestmark = pytest.mark.xparl_only  # faults of xparl's master, workers and sockets

FAST = {"PARL_HEARTBEAT_S": 0.2, "PARL_HEARTBEAT_TIMEOUT_S": 2, "PARL_CONNECT_TIMEOUT_S": 2}


@parl.remote_class
class Probe:
    def pid(self):
        return os.getpid()

    def sleep(self, seconds):
        time.sleep(seconds)
        return "done"


def test_kill_9_of_an_actor_process_during_a_call(tmp_path):
    cluster = make_cluster(tmp_path, workers=(2,), PARL_WARM_SPARES=1)
    try:
        with client_env(cluster):
            parl.connect(cluster.address)
            victim, bystander = Probe(), Probe()
            victim_pid = victim.pid()
            outcome = {}

            def call():
                start = time.monotonic()
                try:
                    victim.sleep(60)
                except parl.RemoteActorDiedError as exc:
                    outcome["error"], outcome["after"] = exc, time.monotonic() - start

            caller = threading.Thread(target=call)
            caller.start()
            time.sleep(0.3)
            [worker] = cluster.status()["workers"]
            warm = {c.pid for c in psutil.Process(worker["pid"]).children()} - {victim_pid}
            killed_at = time.monotonic()
            os.kill(victim_pid, signal.SIGKILL)
            caller.join(10)
            # The pending call fails within 3 s of the kill, saying how the process ended.
            assert "killed by SIGKILL" in str(outcome["error"])
            assert time.monotonic() - killed_at < 3
            with pytest.raises(parl.RemoteActorDiedError, match="killed by SIGKILL"):
                victim.pid()
            assert bystander.sleep(0) == "done"  # the client's other actor is untouched
            # The slot is back within 5 s, with a fresh warm process in it: the worker's
            # spare, started before the kill (the slot's new actor waits for no start-up).
            wait_until(
                lambda: cluster.status()["totals"]["cpu_used"] == 1, timeout=5, what="the slot"
            )
            replacement = Probe()
            assert replacement.pid() not in (bystander.pid(), victim_pid)
            assert replacement.pid() in warm
    finally:
        cluster.stop()


def test_a_worker_cut_off_is_declared_lost_and_rejoins_without_ghost_slots(tmp_path):
    cluster = make_cluster(tmp_path, workers=(), **FAST)
    proxy = CuttableProxy(cluster.port)
    try:
        # The worker reaches the master only through the proxy; clients reach actors directly.
        worker_env = dict(cluster.env)
        cluster.address, direct = f"127.0.0.1:{proxy.port}", cluster.address
        cluster.add_worker(cpu_num=2)
        cluster.address = direct
        with client_env(cluster, **FAST):
            parl.connect(cluster.address)
            actor = Probe()
            assert actor.pid()
            totals = cluster.status()["totals"]  # one snapshot: memory figures move
            assert (totals["workers"], totals["cpu_used"]) == (1, 1)

            proxy.cut.set()
            cut_at = time.monotonic()
            # Declared lost after the 2 s heartbeat timeout (within 5 s) ...
            wait_until(
                lambda: cluster.status()["totals"]["workers"] == 0, timeout=5, what="worker lost"
            )
            assert time.monotonic() - cut_at >= 1.5
            # ... and its actor's caller is told so, although the process still runs.
            with pytest.raises(parl.RemoteActorDiedError, match="stopped responding"):
                wait_until(lambda: actor.pid() and False, timeout=5, interval=0.1, what="the news")

            proxy.cut.clear()
            # The worker notices the silence too, reconnects through the restored link and
            # re-registers within 10 s; its old actor is stopped, so no slot stays taken.
            wait_until(
                lambda: cluster.status()["totals"]["workers"] == 1, timeout=10, what="rejoin"
            )
            wait_until(
                lambda: (
                    cluster.status()["totals"]["cpu_used"] == 0
                    and cluster.status()["totals"]["cpu_vacant"] == 2
                ),
                timeout=10,
                what="no ghost slot",
            )
            with client_env(cluster, PARL_RESOURCE_WAIT_S=15, **FAST):
                parl.connect(cluster.address)
                fresh = [Probe(), Probe()]  # both slots usable again
                assert len({a.pid() for a in fresh}) == 2
        del worker_env
    finally:
        proxy.close()
        cluster.stop()


def test_kill_9_of_the_master_then_xparl_start_brings_the_cluster_back(tmp_path):
    import json
    import subprocess
    import sys

    from parl_remote.engines.xparl import _cluster
    from tests.remote.conftest import Cluster, free_port

    port = free_port()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PARL_CLUSTER_TOKEN"}
    env.update(PARL_HOME=str(home), **{k: str(v) for k, v in FAST.items()})
    xparl = [sys.executable, "-m", "parl_remote.cli"]

    def run(*args):
        return subprocess.run(
            [*xparl, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    assert run("start", "--port", str(port), "--cpu_num", "2").returncode == 0
    state_file = home / "clusters" / f"master-{port}.json"
    state = json.loads(state_file.read_text())
    token = (home / "token").read_text().strip()
    cluster = Cluster(f"127.0.0.1:{port}", port, dict(env, PARL_CLUSTER_TOKEN=token), str(tmp_path))
    try:
        with client_env(cluster, PARL_RESOURCE_WAIT_S=5, **FAST):
            client = parl.connect(cluster.address)
            actor = Probe()
            pid = actor.pid()
            os.kill(state["master"]["pid"], signal.SIGKILL)
            # Actors keep serving their clients: the data plane does not pass through the master.
            for _ in range(20):
                assert actor.pid() == pid
            # New creations fail at once, saying why, once the client noticed (within 3 s).
            wait_until(lambda: not client.connected, timeout=3, what="the client to notice")
            with pytest.raises(parl.RemoteError, match="master at .* is unreachable"):
                Probe()
            restarted = run("start", "--port", str(port))
            assert restarted.returncode == 0, restarted.stderr
            assert "still running and rejoin" in restarted.stdout
            # Within 10 s the worker re-registered (with the live actor) and the client is back.
            wait_until(lambda: client.connected, timeout=10, what="the client to reconnect")
            wait_until(
                lambda: cluster.status()["totals"]["workers"] == 1,
                timeout=10,
                what="re-registration",
            )
            assert [a["pid"] for a in cluster.status()["actors"]] == [pid]
            assert Probe().pid() != pid and actor.pid() == pid
    finally:
        stopped = run("stop", "--port", str(port))
        assert stopped.returncode == 0, stopped.stderr
        for proc in [state["master"], *state["workers"]]:
            _cluster.ProcessInfo(proc["pid"], proc["create_time"], proc["log"]).stop()


def test_kill_9_of_a_worker(tmp_path):
    import json
    import urllib.request

    import psutil

    cluster = make_cluster(tmp_path, workers=(1, 1), dashboard=True)
    try:
        with client_env(cluster):
            parl.connect(cluster.address)
            a, b = Probe(), Probe()
            a_pid = a.pid()
            victim = next(
                w
                for w in cluster.workers
                if a_pid in [c.pid for c in psutil.Process(w.pid).children()]
            )
            outcome = {}

            def call():
                try:
                    a.sleep(60)
                except parl.RemoteActorDiedError as exc:
                    outcome["error"] = exc

            caller = threading.Thread(target=call)
            caller.start()
            time.sleep(0.3)
            killed_at = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            caller.join(10)
            # The pending call fails within 3 s: the actor process dies with its worker.
            assert time.monotonic() - killed_at < 3
            assert isinstance(outcome.get("error"), parl.RemoteActorDiedError)
            with pytest.raises(parl.RemoteActorDiedError):
                a.pid()
            assert b.sleep(0) == "done"  # the other worker's actor is untouched
            # Within 5 s the master has dropped the worker; xparl status and the dashboard agree.
            wait_until(lambda: cluster.status()["totals"]["workers"] == 1, timeout=5, what="drop")
            # Its actor processes follow their worker (they watch it) within 5 s.
            wait_until(
                lambda: not psutil.pid_exists(a_pid) or psutil.Process(a_pid).status() == "zombie",
                timeout=5,
                what="the actor process to follow its worker",
            )
            url = cluster.master.ready["dashboard"] + "api/cluster"
            with urllib.request.urlopen(url, timeout=10) as response:
                shown = json.load(response)
            status = cluster.status()
            assert shown["totals"]["workers"] == status["totals"]["workers"] == 1
            assert [w["worker_id"] for w in shown["workers"]] == [
                w["worker_id"] for w in status["workers"]
            ]
    finally:
        cluster.stop()
