"""The dashboard as a person sees it: Debian's Chromium, headless, driven by Playwright.

A person opens the cluster page, and the test creates actors: the counts change without a
reload. They open an actor's log and see what it prints appear, and the traceback of what it
raised; they see a dead actor marked with why it died. A failing test leaves a screenshot
(`failure.png`) in its tmp dir.
"""

from __future__ import annotations

import os
import re

import pytest

import parl_remote
from tests.dashboard.actors import EVIL, EvilActor, Talker
from tests.dashboard.conftest import CHROMIUM, chromium

LIVE_S = 2.0  # pages change within this long of the cluster changing

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
