"""The dashboard as a person sees it: Debian's Chromium, headless, driven by Playwright.

A person opens the cluster page, and the test creates actors: the counts change without a
reload. They open an actor's log and see what it prints appear, and the traceback of what it
raised; they see a dead actor marked with why it died. On a cluster of a few hundred
simulated workers (real connections on loopback that register and heartbeat as workers do,
with no process behind their slots) they page through the workers' table, and a page other
than the first still follows the cluster live. A failing test leaves a screenshot
(`failure.png`) in its tmp dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Iterator

import pytest

import parl_remote
from parl_dashboard._data import PER_PAGE
from parl_remote.wire._transport import AsyncConnection, open_async
from parl_remote.wire.protocol import messages as m
from tests.dashboard.actors import EVIL, EvilActor, Talker
from tests.dashboard.conftest import CHROMIUM, DashboardCluster, chromium, start_dashboard_cluster
from tests.remote.conftest import wait_until

LIVE_S = 2.0  # pages change within this long of the cluster changing
WORKERS = 2 * PER_PAGE + 10  # the large cluster's: three pages of workers, the last of ten

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"no Chromium at {CHROMIUM}: install Debian's chromium package (.ci/run does)",
)


@pytest.fixture
def browser_page(request, tmp_path):
    """A fresh headless Chromium page; on failure, a screenshot of it in the tmp dir."""
    problems: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(10_000)
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on(
            "console",
            lambda msg: msg.type == "error" and problems.append(f"console: {msg.text}"),
        )
        page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"),
                                          dialog.dismiss()))  # fmt: skip
        yield page, problems
        report = getattr(request.node, "report_call", None)
        if report is None or report.failed:
            path = tmp_path / "failure.png"
            page.screenshot(path=str(path), full_page=True)
            print(f"screenshot of the failure: {path}")


def test_a_person_watches_actors_come_print_and_die(connected, browser_page):
    from playwright.sync_api import expect

    page, problems = browser_page
    cluster = connected
    page.goto(cluster.url)
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#total-actors")).to_have_text("0")
    expect(page.locator("#total-workers")).to_have_text("1")
    expect(page.locator("svg.chart")).to_have_count(1)
    page.evaluate("window.sameDocument = true")  # gone if the page reloads

    talkers = [Talker(), Talker()]
    expect(page.locator("#total-actors")).to_have_text("2", timeout=LIVE_S * 1000)
    expect(page.locator("#total-slots")).to_have_text("2/3")
    expect(page.locator("#total-clients")).to_have_text("1")
    evil = EvilActor()
    expect(page.locator("#total-actors")).to_have_text("3", timeout=LIVE_S * 1000)
    assert page.evaluate("window.sameDocument") is True

    # The actors page lists them; the odd class name shows as text.
    page.get_by_role("link", name="Actors", exact=True).click()
    evil_row = page.locator(f"#actor-{evil._parl_ref.actor_id}")
    expect(evil_row.locator(".cls")).to_have_text(EVIL)
    first_id = talkers[0]._parl_ref.actor_id
    row = page.locator(f"#actor-{first_id}")
    expect(row.locator(".cls")).to_have_text("Talker")
    expect(row.locator(".state")).to_have_text(re.compile("idle|busy"))

    # Its log: the greeting, then a line printed now, then an exception, all live.
    row.get_by_role("link", name="logs").click()
    expect(page).to_have_url(re.compile(f"/actors/{first_id}/logs$"))
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#log")).to_contain_text("hello from the actor")
    page.evaluate("window.sameDocument = true")
    talkers[0].say("a line the actor printed just now")
    expect(page.locator("#log")).to_contain_text(
        "a line the actor printed just now", timeout=LIVE_S * 1000
    )
    with pytest.raises(ValueError, match="it broke"):
        talkers[0].fail("it broke")
    exception = page.locator("#log .exc")
    expect(exception).to_contain_text("Traceback (most recent call last)")
    expect(exception).to_contain_text("ValueError: it broke")
    assert page.evaluate("window.sameDocument") is True
    download = page.get_by_role("link", name=re.compile("Download the whole log"))
    assert download.get_attribute("href") == f"/api/actors/{first_id}/logs.txt"

    # A dead actor, marked with why, on the open actors page.
    page.goto(cluster.url + "actors")
    expect(page.locator("#live-status")).to_have_text("live")
    second = page.locator(f"#actor-{talkers[1]._parl_ref.actor_id}")
    expect(second.locator(".state")).to_have_text(re.compile("idle|busy"))
    with pytest.raises(parl_remote.RemoteError):
        talkers[1].exit(7)
    expect(second.locator(".state")).to_have_text("dead", timeout=LIVE_S * 1000)
    expect(second.locator(".why")).to_contain_text("sys.exit(7)")
    expect(page.locator("#actor-counts")).to_contain_text("2 live · 1 recently ended")

    # Filtering by state keeps the dead one only.
    page.select_option("select[name=state]", "dead")
    expect(page).to_have_url(re.compile(r"state=dead"))
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr .state")).to_have_text("dead")
    assert problems == []


def test_a_link_pressed_while_its_table_changes_still_opens(connected, browser_page):
    """A live table swapped between a press on one of its links and the release: the click
    is not lost (the swap waits for the release, then is made)."""
    from playwright.sync_api import expect

    page, problems = browser_page
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
    talker = Talker()
    page.goto(connected.url + "actors")
    expect(page.locator("#live-status")).to_have_text("live")
    row = page.locator(f"#actor-{talker._parl_ref.actor_id}")
    expect(row.locator(".state")).to_have_text(re.compile("idle|busy"))
    box = row.get_by_role("link", name="logs").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    other = Talker()  # the table changes while the button is down
    other_id = other._parl_ref.actor_id
    # The page's frames reach `frames` while Playwright runs: each poll lets it run a while.
    wait_until(
        lambda: page.wait_for_timeout(20) or any(other_id in str(f) for f in frames),
        what="the table's new row, sent to the page",
    )
    page.mouse.up()
    expect(page).to_have_url(re.compile(f"/actors/{talker._parl_ref.actor_id}/logs$"))
    page.go_back()
    expect(page.locator(f"#actor-{other_id}")).to_have_count(1)  # the swap was made after
    assert problems == []


class SimulatedWorkers:
    """Worker connections on a loop of their own, in a thread: register, then heartbeat."""

    def __init__(self, cluster: DashboardCluster) -> None:
        self.cluster = cluster
        self.loop = asyncio.new_event_loop()
        self.conns: list[AsyncConnection] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._beating = asyncio.run_coroutine_threadsafe(self._beat(), self.loop)

    def add(self, first: int, count: int) -> None:
        """Register workers `sim-<first>` ... `sim-<first + count - 1>`."""
        asyncio.run_coroutine_threadsafe(self._open(first, count), self.loop).result(60)

    async def _open(self, first: int, count: int) -> None:
        gate = asyncio.Semaphore(16)
        token = self.cluster.token.encode()

        async def one(i: int) -> None:
            async with gate:
                conn = await open_async(
                    "127.0.0.1",
                    self.cluster.port,
                    token=token,
                    role="worker",
                    on_message=lambda conn, msg, buffers: None,
                    timeout=30,
                )
            conn.send(
                m.RegisterWorker(
                    f"sim-{i:04d}", "sim-host", "127.0.0.1", os.getpid(), 4, [], [], 8 << 30
                )
            )
            self.conns.append(conn)

        await asyncio.gather(*(one(i) for i in range(first, first + count)))

    async def _beat(self) -> None:
        beat = m.WorkerHeartbeat(12.5, 2 << 30, 8 << 30, 0.5)
        while True:
            for conn in list(self.conns):
                if not conn.closed:
                    conn.send(beat, batch=True)
            await asyncio.sleep(1.0)

    def close(self) -> None:
        """Close every connection and stop the loop."""

        def stop() -> None:
            self._beating.cancel()
            for conn in self.conns:
                conn.close()
            self.loop.call_soon(self.loop.stop)

        self.loop.call_soon_threadsafe(stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def large_cluster(tmp_path) -> Iterator[tuple[DashboardCluster, SimulatedWorkers]]:
    cluster = start_dashboard_cluster(tmp_path, workers=())
    sims = SimulatedWorkers(cluster)
    try:
        sims.add(0, WORKERS)
        wait_until(
            lambda: cluster.get("api/cluster").json()["totals"]["workers"] == WORKERS,
            what=f"{WORKERS} simulated workers to register",
        )
        yield cluster, sims
    finally:
        with contextlib.suppress(Exception):
            sims.close()
        cluster.stop()


def _api(page, cluster: DashboardCluster, path: str) -> dict:
    """The dashboard's API, asked through the browser's own HTTP client."""
    reply = page.request.get(cluster.url + path)
    assert reply.ok, reply.status
    return reply.json()


def _rows(page) -> list[str]:
    return page.locator("#workers tbody tr").evaluate_all("rows => rows.map(r => r.id)")


@pytest.mark.slow  # 110 simulated workers and a browser: longer than the default suite affords
@pytest.mark.xparl_only  # simulated xparl workers
def test_a_person_pages_through_the_workers_of_a_large_cluster(large_cluster, browser_page):
    from playwright.sync_api import expect

    cluster, sims = large_cluster
    page, problems = browser_page
    page.goto(cluster.url)
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#total-workers")).to_have_text(str(WORKERS))
    expect(page.locator("#total-slots")).to_have_text(f"0/{4 * WORKERS}")
    expect(page.locator("#workers tbody tr")).to_have_count(PER_PAGE)
    expect(page.locator("svg.chart")).to_have_count(PER_PAGE)
    pager = page.locator("#workers .pager")
    expect(pager).to_contain_text(f"page 1 of 3 · workers 1-{PER_PAGE} of {WORKERS}")
    first = _rows(page)
    api = [f"worker-{w['worker_id']}" for w in _api(page, cluster, "api/cluster")["workers"]]
    assert first == api  # the page and the API list the same page

    pager.get_by_role("link", name=re.compile("next")).click()
    expect(page).to_have_url(re.compile(r"/\?page=2$"))
    expect(page.locator("#live-status")).to_have_text("live")
    expect(pager).to_contain_text(f"page 2 of 3 · workers {PER_PAGE + 1}-{2 * PER_PAGE} of")
    expect(page.locator("#workers tbody tr")).to_have_count(PER_PAGE)
    second = _rows(page)
    assert not set(first) & set(second)
    api = _api(page, cluster, "api/cluster?page=2")["workers"]
    assert second == [f"worker-{w['worker_id']}" for w in api]

    # page 2 follows the cluster live: a new worker changes its totals and pager, not its rows
    page.evaluate("window.sameDocument = true")
    sims.add(WORKERS, 1)
    expect(page.locator("#total-workers")).to_have_text(str(WORKERS + 1), timeout=LIVE_S * 1000)
    expect(pager).to_contain_text(f"of {WORKERS + 1}")
    assert _rows(page) == second and page.evaluate("window.sameDocument") is True

    page.goto(cluster.url + "?page=3")
    expect(page.locator("#workers tbody tr")).to_have_count(11)
    expect(pager.get_by_role("link", name=re.compile("next"))).to_have_count(0)
    pager.get_by_role("link", name=re.compile("previous")).click()
    expect(page).to_have_url(re.compile(r"/\?page=2$"))
    assert problems == []
