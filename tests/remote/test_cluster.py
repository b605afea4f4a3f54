"""The cluster as an operator sees it: xparl flows, GPUs, lost workers, a restarted master."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import parl
import parl_remote
from parl_remote.engines.xparl import _cluster
from tests.remote.conftest import client_env, free_port, make_cluster, wait_until

pytestmark = pytest.mark.xparl_only  # the xparl CLI, its master and workers


def xparl(*args: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = shutil.which("xparl", path=os.path.dirname(sys.executable)) or "xparl"
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_xparl_start_connect_status_stop_as_a_user_types_them(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PARL_CLUSTER_TOKEN"}
    env["PARL_HOME"] = str(home)
    port = free_port()
    started = xparl("start", "--port", str(port), "--cpu_num", "2", env=env)
    state_file = home / "clusters" / f"master-{port}.json"
    try:
        assert started.returncode == 0, started.stderr
        assert f"PARL master started on 127.0.0.1:{port}" in started.stdout
        assert f"parl.connect('127.0.0.1:{port}')" in started.stdout
        token_file = home / "token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"

        again = xparl("start", "--port", str(port), env=env)
        assert again.returncode == 1 and "already runs on port" in again.stderr

        token = token_file.read_text().strip()
        joined = xparl(
            "connect",
            "--address",
            f"127.0.0.1:{port}",
            "--cpu_num",
            "1",
            env=dict(env, PARL_CLUSTER_TOKEN=token),
        )
        assert joined.returncode == 0, joined.stderr
        assert "joined the cluster" in joined.stdout

        status = xparl("status", env=env)
        assert status.returncode == 0, status.stderr
        assert "workers: 2   CPU slots: 0 used, 3 vacant, 3 total" in status.stdout

        state = json.loads(state_file.read_text())
        pids = [state["master"]["pid"], *(w["pid"] for w in state["workers"])]
        worker_files = list((home / "clusters").glob("worker-*.json"))
        pids += [json.loads(f.read_text())["worker"]["pid"] for f in worker_files]
        children = [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]
        assert len(pids) == 3 and len(children) == 3  # one warm actor process per slot

        stopped = xparl("stop", env=env)
        assert stopped.returncode == 0, stopped.stderr
        wait_until(
            lambda: not any(psutil.pid_exists(p) for p in pids + children),
            what="every process to end",
        )
        assert not state_file.exists() and not list((home / "clusters").glob("worker-*.json"))
        assert xparl("status", "--port", str(port), env=env).returncode == 1
    finally:
        if state_file.exists():
            state = json.loads(state_file.read_text())
            for proc in [state["master"], *state["workers"]]:
                _cluster.ProcessInfo(proc["pid"], proc["create_time"], proc["log"]).stop()


def test_xparl_connect_without_a_token_or_a_master_says_why(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PARL_CLUSTER_TOKEN"}
    env["PARL_HOME"] = str(tmp_path / "empty-home")
    result = xparl("connect", "--address", f"127.0.0.1:{free_port()}", env=env)
    assert result.returncode == 1 and "no cluster token" in result.stderr
    result = xparl(
        "connect", "--address", f"127.0.0.1:{free_port()}", env=dict(env, PARL_CLUSTER_TOKEN="x")
    )
    assert result.returncode == 1
    assert "no PARL master answers at" in result.stderr
    for what in ("is running there", "port is reachable", "token is right"):
        assert what in result.stderr


@parl.remote_class(n_gpu=1)
class OneGpu:
    def devices(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES")


@parl.remote_class(n_gpu=2)
class TwoGpus(OneGpu._original):
    pass


@parl.remote_class
class CpuOnly(OneGpu._original):
    pass


def test_gpu_slots_are_booked_per_worker(tmp_path):
    cluster = make_cluster(tmp_path, workers=())
    cluster.add_worker(cpu_num=4, gpu="0,1")
    try:
        with client_env(cluster, PARL_RESOURCE_WAIT_S=1):
            parl.connect(cluster.address)
            a, b = OneGpu(), OneGpu()
            assert sorted([a.devices(), b.devices()]) == ["0", "1"]
            assert CpuOnly().devices() == ""  # a CPU actor on a GPU worker sees no GPU
            with pytest.raises(parl.ResourceError, match="with 1 GPUs"):
                OneGpu()
            del a
            wait_until(
                lambda: cluster.status()["workers"][0]["free_gpus"], what="the GPU to come back"
            )
            c = OneGpu()
            assert c.devices() in ("0", "1") and c.devices() != b.devices()
            del b, c
            wait_until(
                lambda: len(cluster.status()["workers"][0]["free_gpus"]) == 2, what="both GPUs free"
            )
            assert TwoGpus().devices() == "0,1"
            with pytest.raises(parl.ResourceError, match="no worker offers 3 GPUs"):
                parl.remote_class(n_gpu=3)(CpuOnly._original)()
    finally:
        cluster.stop()


@parl.remote_class
class Worky:
    def pid(self):
        return os.getpid()

    def sleep(self, seconds):
        time.sleep(seconds)
        return "done"


def test_a_busy_actor_is_never_declared_dead(tmp_path):
    cluster = make_cluster(tmp_path, workers=(1,), PARL_HEARTBEAT_S=0.2, PARL_HEARTBEAT_TIMEOUT_S=1)
    try:
        with client_env(cluster, PARL_HEARTBEAT_S=0.2, PARL_HEARTBEAT_TIMEOUT_S=1):
            parl.connect(cluster.address)
            actor = Worky()
            assert actor.sleep(4) == "done"  # four heartbeat timeouts inside one call
            assert cluster.status()["actors"][0]["state"] != "dead"
    finally:
        cluster.stop()


def test_a_restarted_master_gets_its_cluster_back(tmp_path):
    cluster = make_cluster(tmp_path, workers=(2,), PARL_HEARTBEAT_S=0.2, PARL_HEARTBEAT_TIMEOUT_S=2)
    try:
        with client_env(
            cluster, PARL_HEARTBEAT_S=0.2, PARL_HEARTBEAT_TIMEOUT_S=2, PARL_RESOURCE_WAIT_S=5
        ):
            parl.connect(cluster.address)
            actor = Worky()
            pid = actor.pid()
            os.kill(cluster.master.pid, signal.SIGKILL)
            cluster.master.stop()
            assert actor.pid() == pid  # the data plane does not pass through the master
            with pytest.raises(
                parl_remote.MasterUnreachableError, match="master at .* is unreachable"
            ):
                wait_until(lambda: not parl_client().connected, what="the client to notice")
                Worky()
            cluster.start_master()  # same port
            wait_until(lambda: parl_client().connected, what="the client to reconnect")
            wait_until(
                lambda: cluster.status()["totals"]["workers"] == 1, what="the worker to re-register"
            )
            status = cluster.status()
            assert [a["pid"] for a in status["actors"]] == [pid]  # adopted, not lost
            assert status["totals"]["cpu_used"] == 1
            second = Worky()
            assert second.pid() != pid and actor.pid() == pid
            del actor
            wait_until(
                lambda: cluster.status()["totals"]["cpu_used"] == 1, what="release after restart"
            )
    finally:
        cluster.stop()


def parl_client():
    from parl_remote.client._connect import current_client

    return current_client()


def test_the_registry_tells_idle_from_busy(tmp_path):
    cluster = make_cluster(tmp_path, workers=(1,))
    try:
        with client_env(cluster):
            parl.connect(cluster.address)
            actor = Worky()
            actor.pid()
            wait_until(lambda: cluster.status()["actors"][0]["state"] == "idle", what="idle")
            import threading

            caller = threading.Thread(target=actor.sleep, args=(6,))
            caller.start()
            wait_until(
                lambda: cluster.status()["actors"][0]["state"] == "busy", timeout=10, what="busy"
            )
            caller.join(15)
            wait_until(
                lambda: cluster.status()["actors"][0]["state"] == "idle",
                timeout=10,
                what="idle again",
            )
            assert cluster.status()["actors"][0]["calls"] >= 2
    finally:
        cluster.stop()


def test_each_actor_process_has_a_session_of_its_own(tmp_path):
    # The kernel shares CPU time between sessions (autogroup): actors sharing their worker's
    # session would share one process's worth of CPU between them on a busy machine.
    cluster = make_cluster(tmp_path, workers=(2,))
    try:
        with client_env(cluster):
            parl.connect(cluster.address)
            a, b = Worky(), Worky()
            sessions = {os.getsid(a.pid()), os.getsid(b.pid()), os.getsid(cluster.workers[0].pid)}
            assert len(sessions) == 3
            assert os.getsid(a.pid()) == a.pid()
    finally:
        cluster.stop()


def test_the_embedded_cluster_keeps_a_lone_actor_in_its_clients_session(monkeypatch):
    # A blocking call then waits for one session's turn on a busy machine, not two; once a
    # second actor runs beside it, each has a session of its own, as an xparl worker's do.
    monkeypatch.delenv("PARL_CLUSTER_TOKEN", raising=False)
    client = parl.connect(cpu_num=2, log_to_driver=False)
    try:
        mine = os.getsid(0)
        for info in (client.cluster.master, client.cluster.worker):
            assert os.getsid(info.pid) == mine and os.getpgid(info.pid) == info.pid
        a = Worky()
        assert os.getsid(a.pid()) == mine
        b = Worky()
        assert os.getsid(b.pid()) == b.pid()
        a_pid = a.pid()
        wait_until(lambda: os.getsid(a_pid) == a_pid, timeout=10, what="the first one left")
        del a, b
        c = Worky()  # alone again: an actor being freed counts no more
        assert os.getsid(c.pid()) == mine
    finally:
        parl.disconnect()


def test_an_embedded_cluster_removes_the_logs_of_one_whose_process_is_gone(monkeypatch):
    """A user process killed without `stop()` leaves its cluster's logs: the next start removes
    them (a live process's stay)."""
    from parl_remote import _util
    from tests.remote.test_shm import _dead_pid

    monkeypatch.delenv("PARL_CLUSTER_TOKEN", raising=False)
    gone = tempfile.mkdtemp(prefix=f"parl-cluster-{_dead_pid()}-")
    with open(os.path.join(gone, "master.log"), "w") as f:
        f.write("the last words of a cluster whose user was killed\n")
    live = _util.private_dir("cluster")
    cluster = _cluster.EmbeddedCluster.start(cpu_num=1, monitor_port=None)
    try:
        assert not os.path.exists(gone) and os.path.isdir(live)
        assert os.path.basename(cluster.logdir).startswith(f"parl-cluster-{os.getpid()}-")
    finally:
        cluster.stop()
        shutil.rmtree(gone, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)
    assert not os.path.exists(cluster.logdir)
