"""How the dashboard comes up: `xparl start`, `parl.connect()`, and masters that cannot serve it."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import textwrap

from parl_dashboard import is_loopback
from parl_dashboard._html import fmt_age, fmt_bytes, load_chart
from parl_remote.engines.xparl import _cluster
from tests.conftest import run_python
from tests.dashboard.conftest import fetch
from tests.remote.conftest import free_port


def _xparl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parl_remote.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_xparl_start_prints_the_dashboard_url_and_serves_it(tmp_path):
    env = dict(os.environ, PARL_HOME=str(tmp_path / "home"))
    env.pop("PARL_CLUSTER_TOKEN", None)
    port, monitor = free_port(), free_port()
    started = _xparl(
        "start", "--port", str(port), "--monitor_port", str(monitor), "--cpu_num", "1", env=env
    )
    try:
        assert started.returncode == 0, started.stderr
        assert f"Dashboard: http://127.0.0.1:{monitor}/" in started.stdout
        totals = fetch(f"http://127.0.0.1:{monitor}/api/cluster").json()["totals"]
        assert totals["cpu_total"] in (0, 1)  # the local worker may still be registering
    finally:
        stopped = _xparl("stop", "--port", str(port), env=env)
    assert stopped.returncode == 0, stopped.stderr


def test_the_local_cluster_of_connect_serves_and_logs_the_dashboard():
    result = run_python(
        textwrap.dedent(
            """
            import json, logging, urllib.request
            logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
            import parl_remote
            client = parl_remote.connect(cpu_num=1)
            url = client.cluster.dashboard_url
            with urllib.request.urlopen(url + "api/cluster") as reply:
                print("TOTALS", json.load(reply)["totals"]["cpu_total"] in (0, 1))
            parl_remote.disconnect()
            """
        ),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "TOTALS True" in result.stdout
    assert "parl_remote.engines.xparl._client: PARL dashboard: http://127.0.0.1:" in result.stderr


def _bare_master(tmp_path, monitor_port: int, extra_env: dict | None = None):
    env = dict(os.environ, PARL_CLUSTER_TOKEN=secrets.token_hex(8), **(extra_env or {}))
    return _cluster.spawn(
        "parl_remote.master._master",
        ["--port", "0", "--monitor_port", str(monitor_port)],
        log=str(tmp_path / "master.log"),
        env=env,
    )


def test_a_master_without_parl_dashboard_serves_without_a_dashboard(tmp_path):
    shadow = tmp_path / "shadow" / "parl_dashboard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('parl-dashboard is not installed')\n")
    path = os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])
    master = _bare_master(tmp_path, 0, {"PYTHONPATH": path})
    try:
        assert master.ready["dashboard"] is None and master.ready["port"] > 0
    finally:
        master.stop()
    assert "no dashboard: parl-dashboard is not installed" in (tmp_path / "master.log").read_text()


def test_a_taken_monitor_port_leaves_the_master_serving(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        master = _bare_master(tmp_path, taken.getsockname()[1])
        try:
            assert master.ready["dashboard"] is None and master.alive()
        finally:
            master.stop()
    assert "no dashboard: it could not listen" in (tmp_path / "master.log").read_text()


def test_loopback_names():
    for host in ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]", "app.localhost"]:
        assert is_loopback(host), host
    for host in ["0.0.0.0", "", None, "::", "10.0.0.1", "example.com", "localhost.example.com"]:
        assert not is_loopback(host), host


def test_the_load_chart_spans_the_last_ten_minutes():
    now = 10_000.0
    history = [[now - 900, 100.0, 0], [now - 600, 0.0, 50], [now - 300, 50.0, 100], [now, 100.0, 0]]
    svg = load_chart(history, mem_total=100, now=now)
    cpu = svg.split('class="cpu" points="')[1].split('"')[0].split()
    mem = svg.split('class="mem" points="')[1].split('"')[0].split()
    assert cpu == ["0.0,59.0", "150.0,30.0", "300.0,1.0"]  # the sample 15 minutes ago is out
    assert mem == ["0.0,30.0", "150.0,1.0", "300.0,59.0"]
    assert "CPU peak 100% over the last 10 minutes" in svg


def test_people_sized_numbers():
    assert [fmt_age(s) for s in (5, 65, 3 * 3600 + 120, 2 * 86400 + 3600)] == [
        "5s",
        "1m 05s",
        "3h 02m",
        "2d 01h",
    ]
    assert [fmt_bytes(n) for n in (512, 3_400_000, 15.8e9)] == ["512 B", "3.4 MB", "15.8 GB"]
