"""Every entry point on a platform without `os.sched_getaffinity` (macOS), and an embedded
cluster with TLS: real processes, started as a user starts them."""

from __future__ import annotations

import os
import textwrap

from parl_remote.engines.xparl import _cluster
from tests.remote.conftest import free_port, run_script, wait_until
from tests.remote.test_cluster import xparl

NO_AFFINITY = """
    import os

    if hasattr(os, "sched_getaffinity"):
        del os.sched_getaffinity  # as on macOS
"""

CLIENT = """
    import os
    import parl_remote

    @parl_remote.remote_class
    class Probe:
        def affinity(self):
            return hasattr(os, "sched_getaffinity")

    parl_remote.connect({address})
    assert not hasattr(os, "sched_getaffinity")
    print("actor has sched_getaffinity:", Probe().affinity())
"""


def _status(env: dict) -> str:
    shown = xparl("status", env=env)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_every_entry_point_works_without_sched_getaffinity(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(NO_AFFINITY))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PARL_CLUSTER_TOKEN"}
    path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(PARL_HOME=str(home), PYTHONPATH=os.pathsep.join(path))
    port = free_port()
    address = f"127.0.0.1:{port}"
    worker = None
    try:
        started = xparl("start", "--port", str(port), "--monitor_port", "0", env=env)
        assert started.returncode == 0, started.stderr
        env["PARL_CLUSTER_TOKEN"] = (home / "token").read_text().strip()
        joined = xparl("connect", "--address", address, env=env)
        assert joined.returncode == 0, joined.stderr
        worker = _cluster.spawn(
            "parl_remote.worker._worker",
            ["--address", address],
            log=str(tmp_path / "w.log"),
            env=env,
        )
        slots = 3 * (os.cpu_count() or 1)  # each worker: os.cpu_count() without affinity
        wait_until(lambda: "workers: 3 " in _status(env), what="three workers")
        assert f"{slots} total" in _status(env)
        used = run_script(CLIENT.format(address=repr(address)), env, timeout=90)
        assert used.returncode == 0, used.stderr
        assert "actor has sched_getaffinity: False" in used.stdout
        local = run_script(
            CLIENT.format(address=""), env, timeout=90
        )  # parl.connect(): a local cluster
        assert local.returncode == 0, local.stderr
        assert "actor has sched_getaffinity: False" in local.stdout
    finally:
        if worker is not None:
            worker.stop(timeout=5)
        stopped = xparl("stop", "--port", str(port), env=env)
        assert stopped.returncode == 0, stopped.stderr


EMBEDDED_TLS = """
    import os
    import psutil
    import parl_remote
    from parl_remote._exceptions import AuthenticationError
    from parl_remote.wire._transport import SyncConnection

    client = parl_remote.connect(tls=True, cpu_num=1)

    @parl_remote.remote_class
    class Probe:
        def tls(self):
            return os.environ.get("PARL_TLS")

    assert Probe().tls() == "1"
    token = os.environ["PARL_CLUSTER_TOKEN"]
    for proc in psutil.Process().children(recursive=True):  # never on a command line
        try:
            cmdline = proc.cmdline()
        except psutil.Error:  # a short-lived child that has just exited
            continue
        assert token not in " ".join(cmdline), cmdline
    host, port = client.address.split(":")
    del os.environ["PARL_TLS"]
    try:
        SyncConnection.open(host, int(port), token=token.encode(), role="client", timeout=10)
    except AuthenticationError as exc:
        print("plaintext refused:", exc)
"""


def test_an_embedded_cluster_speaks_only_tls(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARL_TLS", "PARL_CLUSTER"))}
    env["PARL_HOME"] = str(tmp_path / "home")
    done = run_script(EMBEDDED_TLS, env, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "plaintext refused: " in done.stdout and "requires TLS" in done.stdout
