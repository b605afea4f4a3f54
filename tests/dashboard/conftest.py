"""Real clusters whose master serves the dashboard, and a small HTTP client to read it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from multidict import CIMultiDict

from parl_remote.engines.xparl import _cluster
from tests.remote.conftest import Cluster, connected


@dataclass
class Reply:
    """An HTTP answer, read whole."""

    status: int
    headers: CIMultiDict
    text: str

    def json(self) -> Any:
        import json

        return json.loads(self.text)


def fetch(url: str, *, method: str = "GET", timeout: float = 10.0, **kwargs: Any) -> Reply:
    """One HTTP request with aiohttp's client; redirects are not followed, cookies not kept."""

    async def go() -> Reply:
        async with (
            aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as session,
            session.request(method, url, allow_redirects=False, **kwargs) as response,
        ):
            return Reply(response.status, CIMultiDict(response.headers), await response.text())

    return asyncio.run(go())


@dataclass
class DashboardCluster(Cluster):
    """A test cluster whose master serves the dashboard at `url` (always via 127.0.0.1)."""

    url: str = ""

    @property
    def token(self) -> str:
        return self.env["PARL_CLUSTER_TOKEN"]

    def get(self, path: str, **kwargs: Any) -> Reply:
        return fetch(self.url + path.lstrip("/"), **kwargs)


def start_dashboard_cluster(
    tmp_path, workers=(3,), *, host: str = "127.0.0.1", extra_env: dict | None = None
) -> DashboardCluster:
    """A master on `host` serving the dashboard on a free port, and `workers` on this machine."""
    env = dict(
        os.environ,
        PARL_CLUSTER_TOKEN=secrets.token_hex(16),
        PARL_HOME=str(tmp_path / "parl-home"),
        **(extra_env or {}),
    )
    cluster = DashboardCluster("127.0.0.1:0", 0, env, str(tmp_path))
    try:
        cluster.master = _cluster.spawn(
            "parl_remote.master._master",
            ["--host", host, "--port", "0", "--monitor_port", "0"],
            log=os.path.join(tmp_path, "master.log"),
            env=env,
        )
        cluster.port = int(cluster.master.ready["port"])  # the master's choice: none can race
        cluster.address = f"127.0.0.1:{cluster.port}"
        dashboard = cluster.master.ready.get("dashboard")
        assert dashboard, f"the master serves no dashboard:\n{cluster.log()}"
        cluster.url = f"http://127.0.0.1:{urlsplit(dashboard).port}/"
        for cpu_num in workers:
            cluster.add_worker(cpu_num)
    except BaseException:
        cluster.stop()
        raise
    return cluster


CHROMIUM = "/usr/bin/chromium"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (which never downloads a browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory):
    """A cluster with one worker of 3 slots, for one test module (`connected` joins it)."""
    cluster = start_dashboard_cluster(tmp_path_factory.mktemp("dashboard"), workers=(3,))
    yield cluster
    cluster.stop()


__all__ = ["connected"]  # the remote tests' fixture, here on `module_cluster` above


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so fixtures can tell that a test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report
