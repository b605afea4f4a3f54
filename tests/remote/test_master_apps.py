"""Master apps: the master serves whatever is registered under `parl_remote.master_apps`."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import textwrap
import urllib.request

import pytest

from parl_remote import Registry
from parl_remote.engines.xparl import _cluster
from parl_remote.master._apps import serve_master_app
from tests.remote.conftest import free_port

pytestmark = pytest.mark.xparl_only  # apps the xparl master serves

_APP = '''
"""A master app of a distribution other than parl-dashboard."""
from aiohttp import web


def factory(registry, *, host, token):
    async def hello(request):
        status = registry.snapshot()
        return web.Response(text=f"cluster {status.cluster_id} on {host}, {status.totals.workers}")

    app = web.Application()
    app.router.add_get("/", hello)
    return app
'''


def test_the_master_serves_an_app_another_distribution_registered(tmp_path):
    site = tmp_path / "site"
    (site / "hello_app-0.1.dist-info").mkdir(parents=True)
    (site / "hello_app.py").write_text(_APP)
    (site / "hello_app-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hello-app\nVersion: 0.1\n"
    )
    # named to sort before "dashboard": the monitor port serves the first app by name
    (site / "hello_app-0.1.dist-info" / "entry_points.txt").write_text(
        textwrap.dedent(
            """
            [parl_remote.master_apps]
            aaa-hello = hello_app:factory
            """
        )
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PARL_CLUSTER_TOKEN=secrets.token_hex(8), PYTHONPATH=path)
    master = _cluster.spawn(
        "parl_remote.master._master",
        ["--port", "0", "--monitor_port", str(free_port())],
        log=str(tmp_path / "master.log"),
        env=env,
    )
    try:
        url = master.ready["dashboard"]
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    finally:
        master.stop()
    assert text.startswith("cluster ") and text.endswith(" on 127.0.0.1, 0")
    log = (tmp_path / "master.log").read_text()
    assert f"aaa-hello at {url}" in log
    assert "dashboard at" not in log  # one app on the monitor port


def test_with_no_app_registered_the_master_serves_without_one(caplog):
    registry = Registry("cluster")
    with caplog.at_level(logging.INFO, logger="parl_remote.master._apps"):
        served = asyncio.run(
            serve_master_app(registry, "127.0.0.1", 0, None, group="parl_remote.no_such_group")
        )
    assert served is None
    assert "nothing is registered under the entry-point group parl_remote.no_such_group" in (
        caplog.text
    )
