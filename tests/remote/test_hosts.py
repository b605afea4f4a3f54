"""Many hosts on one machine: a TLS cluster whose workers stand for other machines.

The master listens on 127.0.0.1; two workers, "host-b" and "host-c", have actors that listen on
127.0.0.2 and 127.0.0.3, each worker with a host identity of its own (`PARL_HOST_ID`), its own
working and temporary directories and its own `PARL_HOME` (empty: it fetches the cluster CA
from the master and has it sign a certificate, as on another machine). The client, "host-a",
has an empty `PARL_HOME` too, and removes its code directory once connected: its modules and
`distributed_files` reach the actors only as shipped. Arrays between hosts go through the
socket, never shared memory. Then host-c is lost whole -- its worker and its actor killed at
once -- and its actor's caller gets `RemoteActorDiedError` while host-b's slot serves a new
actor. Real processes, stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.remote.conftest import make_cluster, wait_until

pytestmark = pytest.mark.xparl_only  # xparl's workers and TLS

HOSTS = {"host-b": "127.0.0.2", "host-c": "127.0.0.3"}

CLIENT = """
    import json, os, shutil, sys
    import numpy as np
    import parl_remote
    from parl_remote.security import _tls_context
    from parl_remote.wire import _shm

    from mylib.util import helper  # the client's own module, in the directory it removes

    here = os.getcwd()
    parl_remote.connect(os.environ["ADDRESS"], distributed_files=["data"])
    os.chdir("/")
    shutil.rmtree(here)  # nothing of the client's files is left to read
    import csv, difflib  # and modules imported since: the client looks at its modules again

    @parl_remote.remote_class
    class Probe:
        def where(self):
            import ssl
            return {
                "host_id": _shm.host_id(),
                "home": os.environ["PARL_HOME"],
                "cwd": os.getcwd(),
                "cert": os.environ.get("PARL_TLS_CERT", ""),
                "verifies": _tls_context.client_context().verify_mode == ssl.CERT_REQUIRED,
            }

        def helped(self, x):
            from mylib.util import helper
            with open("data/config.txt") as f:
                return helper(x), f.read()

        def echo(self, x):
            return x, _shm.received()

    def report(probe):
        core = object.__getattribute__(probe, "_parl_ref").core
        x = np.arange(1 << 20, dtype=np.float64)  # 8 MB each way
        y, received = probe.echo(x)
        return dict(
            probe.where(),
            address=core.host,
            helped=probe.helped(4),
            arrays_intact=bool((y == x).all()),
            through_shm=received + _shm.received(),
        )

    probes = [Probe(), Probe()]
    reports = [report(p) for p in probes]
    assert _tls_context.trusted() is not None  # the CA fetched from the master
    print(json.dumps({"client_home": os.environ["PARL_HOME"], "reports": reports}), flush=True)
    sys.stdin.readline()  # the test takes host-c away meanwhile
    lost = next(p for p, r in zip(probes, reports) if r["host_id"] == "host-c")
    kept = next(p for p in probes if p is not lost)
    try:
        lost.where()
    except parl_remote.RemoteActorDiedError as exc:
        print(json.dumps({"died": type(exc).__name__}), flush=True)
    del probes, kept  # host-b's slot is free again: a new actor lands there
    print(json.dumps({"new": Probe().where()["host_id"]}), flush=True)
"""


def _line(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The next line the client prints (JSON), within `timeout` seconds."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout), f"the client printed nothing in {timeout} s"
    line = proc.stdout.readline()
    assert line, f"the client ended: {proc.wait(10)}, {proc.stderr.read()}"
    return json.loads(line)


def _host_env(tmp_path, name: str) -> dict[str, str]:
    """The environment of a process of host `name`: nothing of the test's PARL settings."""
    root = tmp_path / name
    for sub in ("home", "tmp", "cwd"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARL_")}
    env.update(PARL_HOME=str(root / "home"), PARL_HOST_ID=name, TMPDIR=str(root / "tmp"))
    env["PARL_TLS"] = "1"
    return env


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and every process under it, all at once."""
    with contextlib.suppress(psutil.NoSuchProcess):
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)


def test_hosts_of_their_own_ship_code_encrypt_and_lose_a_host_whole(tmp_path, monkeypatch):
    cluster = make_cluster(tmp_path, workers=(), PARL_TLS="1")
    monkeypatch.setenv("PARL_TLS", "1")  # this process asks the master for its status
    token = cluster.env["PARL_CLUSTER_TOKEN"]
    workers: dict[str, subprocess.Popen] = {}
    client = None
    try:
        for name, ip in HOSTS.items():
            env = dict(_host_env(tmp_path, name), PARL_CLUSTER_TOKEN=token)
            with open(tmp_path / f"{name}.log", "wb") as log:
                workers[name] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "parl_remote.worker._worker",
                        "--address",
                        cluster.address,
                        "--cpu_num",
                        "1",
                        "--host",
                        ip,
                    ],
                    cwd=tmp_path / name / "cwd",
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        wait_until(
            lambda: cluster.status()["totals"]["workers"] == 2, timeout=30, what="both hosts"
        )
        code = tmp_path / "host-a" / "cwd"
        (code / "mylib").mkdir(parents=True)
        (code / "mylib" / "__init__.py").write_text("")
        (code / "mylib" / "util.py").write_text("def helper(x):\n    return x * 10\n")
        (code / "data").mkdir()
        (code / "data" / "config.txt").write_text("lr = 0.1\n")
        env = dict(_host_env(tmp_path, "host-a"), PARL_CLUSTER_TOKEN=token)
        env["ADDRESS"] = cluster.address
        client = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CLIENT)],
            cwd=code,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = _line(client)
        assert not code.exists()  # the client's code directory went before any actor
        reports = {r["host_id"]: r for r in first["reports"]}
        assert set(reports) == set(HOSTS)  # one actor on each host
        for name, ip in HOSTS.items():
            report = reports[name]
            assert report["address"] == ip  # its actor listens on its host's address
            assert report["home"] == str(tmp_path / name / "home")
            assert report["cwd"].startswith(str(tmp_path / name / "tmp"))
            # TLS between hosts: the host's own certificate, signed by the fetched CA.
            assert report["cert"].startswith(str(tmp_path / name / "home" / "tls" / "joined"))
            assert report["verifies"]
            assert report["helped"] == [40, "lr = 0.1\n"]  # code and files shipped
            assert report["arrays_intact"] and report["through_shm"] == 0  # the socket
        assert not (tmp_path / "host-a" / "home" / "tls").exists()  # trusted in memory
        _kill_tree(workers["host-c"].pid)  # host-c lost whole
        wait_until(
            lambda: cluster.status()["totals"]["workers"] == 1, timeout=30, what="host-c gone"
        )
        client.stdin.write("go\n")
        client.stdin.flush()
        assert _line(client) == {"died": "RemoteActorDiedError"}
        assert _line(client) == {"new": "host-b"}
        assert client.wait(30) == 0, client.stderr.read()
    finally:
        if client is not None:
            client.kill()
            client.wait(10)
            for stream in (client.stdin, client.stdout, client.stderr):
                stream.close()
        for proc in workers.values():
            _kill_tree(proc.pid)
            proc.wait(10)
        cluster.stop()
