"""The dashboard's JSON API, pages and live updates, served by a real master of a real cluster."""

from __future__ import annotations

import asyncio
import gc
import html
import json
import os
import socket
import time

import aiohttp
import pytest

import parl_remote
from tests.dashboard.actors import EVIL, EvilActor, Talker
from tests.dashboard.conftest import fetch, start_dashboard_cluster
from tests.remote.conftest import client_env, wait_until


def _our_client(cluster) -> dict:
    clients = cluster.get("api/clients").json()["clients"]
    return next(c for c in clients if c["pid"] == os.getpid())


def _actor(cluster, actor_id: str) -> dict:
    actors = cluster.get("api/actors").json()["actors"]
    return next(a for a in actors if a["actor_id"] == actor_id)


def _log_texts(cluster, actor_id: str, offset: int = 0) -> list[str]:
    return [line["text"] for line in cluster.get(f"api/actors/{actor_id}/logs?offset={offset}")
            .json()["lines"]]  # fmt: skip


# -- JSON API -------------------------------------------------------------------------------------
def test_cluster_api_has_totals_workers_and_ten_minutes_of_load_history(module_cluster):
    cluster = module_cluster

    def worker_with_history():
        workers = cluster.get("api/cluster").json()["workers"]
        return workers and len(workers[0]["history"]) >= 2 and workers[0]

    worker = wait_until(worker_with_history, what="two load samples")
    data = cluster.get("api/cluster").json()
    assert data["totals"]["workers"] == 1
    assert data["totals"]["cpu_total"] == 3
    assert worker["hostname"] == socket.gethostname()
    assert worker["cpu_num"] == 3 and worker["mem_total"] > 0
    times = [t for t, _, _ in worker["history"]]
    assert times == sorted(times) and time.time() - times[-1] < 10
    assert all(0 <= cpu <= 100 * os.cpu_count() and mem > 0 for _, cpu, mem in worker["history"])
    # `xparl status` reads the same registry
    status = cluster.status()
    assert data["cluster_id"] == status["cluster_id"]
    for key in ("workers", "cpu_total", "cpu_used", "actors", "clients", "mem_total"):
        assert data["totals"][key] == status["totals"][key], key


def test_actors_and_clients_api_follow_the_cluster(connected):
    cluster = connected
    a, b = Talker(), Talker("hi")
    me = _our_client(cluster)
    assert me["hostname"] == socket.gethostname() and me["actors"] == 2
    assert time.time() - me["connected_at"] < 60
    ids = {a._parl_ref.actor_id, b._parl_ref.actor_id}
    mine = cluster.get(f"api/actors?client={me['client_id']}&state=live").json()["actors"]
    assert {x["actor_id"] for x in mine} == ids
    row = mine[0]
    assert row["class_name"] == "Talker" and row["client_id"] == me["client_id"]
    assert row["state"] in ("idle", "busy") and row["worker_hostname"] == socket.gethostname()
    assert row["pid"] > 0 and row["uptime_s"] >= 0
    assert cluster.get("api/actors?client=nobody").json()["actors"] == []
    bad = cluster.get("api/actors?state=sleeping")
    assert bad.status == 400 and "sleeping" in bad.text

    a.say("one call")
    wait_until(lambda: _actor(cluster, a._parl_ref.actor_id)["calls"] >= 1, what="the call counted")
    actor_id = b._parl_ref.actor_id
    del b
    gc.collect()
    dead = wait_until(
        lambda: (x := _actor(cluster, actor_id))["state"] == "dead" and x, what="b released"
    )
    assert dead["reason"] == "released by its client" and dead["ended_at"] is not None
    dead_ids = [x["actor_id"] for x in cluster.get("api/actors?state=dead").json()["actors"]]
    assert actor_id in dead_ids
    assert wait_until(lambda: _our_client(cluster)["actors"] == 1, what="the client's count")


def test_a_dead_actor_says_why(connected):
    actor = Talker()
    actor_id = actor._parl_ref.actor_id
    with pytest.raises(parl_remote.RemoteError):
        actor.exit(3)
    dead = wait_until(
        lambda: (x := _actor(connected, actor_id))["state"] == "dead" and x, what="its death"
    )
    assert "sys.exit(3)" in dead["reason"]
    # Its replacement's record names it and why it ended; the client counts its replacements.
    with pytest.raises(parl_remote.RemoteActorDiedError) as excinfo:
        actor.say("to a dead actor")
    assert excinfo.value.actor_id == actor_id
    restarts = _our_client(connected)["restarts"]
    with parl_remote.replacing(excinfo.value.actor_id):
        replacement = Talker()
    row = _actor(connected, replacement._parl_ref.actor_id)
    assert row["replaces"] == actor_id and "sys.exit(3)" in row["replaced_reason"]
    assert _actor(connected, actor_id)["replaces"] == ""  # a first actor replaces none
    assert _our_client(connected)["restarts"] == restarts + 1
    page = connected.get("actors").text
    assert f'replaces <a class="mono" href="/actors/{actor_id}/logs">{actor_id}</a>' in page
    with parl_remote.replacing("0123456789ab"):  # no actor of this client: recorded as none
        other = Talker()
    assert _actor(connected, other._parl_ref.actor_id)["replaces"] == ""
    assert _our_client(connected)["restarts"] == restarts + 1


def test_logs_api_returns_the_lines_after_an_offset(connected):
    cluster = connected
    actor = Talker()
    actor_id = actor._parl_ref.actor_id
    actor.say("line 1", "line 2", "line 3")
    actor.warn("trouble")
    texts = wait_until(
        lambda: len(t := _log_texts(cluster, actor_id)) >= 5 and t, what="five log lines"
    )
    assert texts == ["hello from the actor", "line 1", "line 2", "line 3", "trouble"]
    data = cluster.get(f"api/actors/{actor_id}/logs?offset=2").json()
    assert data["first"] == 1 and data["last"] == 5
    assert [line["n"] for line in data["lines"]] == [3, 4, 5]
    assert [line["stream"] for line in data["lines"]] == ["stdout", "stdout", "stderr"]
    assert all(time.time() - line["time"] < 60 for line in data["lines"])
    assert cluster.get(f"api/actors/{actor_id}/logs?offset=5").json()["lines"] == []
    assert cluster.get("api/actors/0123456789ab/logs").status == 404
    assert cluster.get(f"api/actors/{actor_id}/logs?offset=x").status == 400

    download = cluster.get(f"api/actors/{actor_id}/logs.txt")
    assert download.status == 200
    assert download.headers["Content-Type"].startswith("text/plain")
    assert f'filename="actor-{actor_id}.log"' in download.headers["Content-Disposition"]
    lines = download.text.splitlines()
    assert len(lines) == 5
    assert lines[0].endswith("[stdout] hello from the actor")
    assert lines[4].endswith("[stderr] trouble")


def test_the_oldest_lines_go_over_the_limit_and_readers_see_the_gap(tmp_path):
    cluster = start_dashboard_cluster(
        tmp_path, workers=(1,), extra_env={"PARL_LOG_LINES_PER_ACTOR": "5"}
    )
    try:
        with client_env(cluster):
            parl_remote.connect(cluster.address)
            actor = Talker()
            actor_id = actor._parl_ref.actor_id
            actor.say(*(f"line {i}" for i in range(1, 8)))
            data = wait_until(
                lambda: (d := cluster.get(f"api/actors/{actor_id}/logs").json())["last"] == 8 and d,
                what="eight lines",
            )
            assert (data["first"], data["last"]) == (4, 8)
            assert [x["text"] for x in data["lines"]] == [f"line {i}" for i in range(3, 8)]
            page = cluster.get(f"actors/{actor_id}/logs").text
            assert "3 earlier lines are no longer retained" in page
            assert "Download the whole log (5 lines)" in page
            assert len(cluster.get(f"api/actors/{actor_id}/logs.txt").text.splitlines()) == 5
    finally:
        cluster.stop()


def test_a_raised_exception_is_in_the_log_with_its_traceback(connected):
    cluster = connected
    actor = Talker()
    actor_id = actor._parl_ref.actor_id
    with pytest.raises(ValueError, match="boom"):
        actor.fail("boom")

    def exception_entry():
        lines = cluster.get(f"api/actors/{actor_id}/logs").json()["lines"]
        return next((x for x in lines if x["stream"] == "exception"), None)

    entry = wait_until(exception_entry, what="the exception in the log")
    assert entry["text"].startswith("Talker.fail() raised:\nTraceback (most recent call last):")
    assert "raise ValueError(message)" in entry["text"]
    assert entry["text"].endswith("ValueError: boom")
    page = cluster.get(f"actors/{actor_id}/logs").text
    assert 'class="ln exc"' in page and "ValueError: boom" in page
    assert wait_until(lambda: _actor(cluster, actor_id)["errors"] == 1, what="the error counted")


# -- pages ----------------------------------------------------------------------------------------
def test_every_page_renders_and_links_to_its_assets(connected):
    cluster = connected
    actor = Talker()
    actor_id = actor._parl_ref.actor_id
    for path, heading in [
        ("", "<h1>Cluster</h1>"),
        ("actors?state=live", "<h1>Actors</h1>"),
        ("clients", "<h1>Clients</h1>"),
        (f"actors/{actor_id}/logs", "Logs of"),
    ]:
        page = cluster.get(path)
        assert page.status == 200, path
        assert page.headers["Content-Type"].startswith("text/html")
        assert heading in page.text
        assert "script-src" not in page.headers["Content-Security-Policy"]  # default-src 'self'
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert "<script>" not in page.text and "style=" not in page.text  # no inline code
    cluster_page = cluster.get("").text
    assert 'id="total-actors"' in cluster_page and '<svg class="chart"' in cluster_page
    assert socket.gethostname() in cluster_page
    actors_page = cluster.get("actors").text
    assert f'href="/actors/{actor_id}/logs"' in actors_page
    assert "hello from the actor" in wait_until(
        lambda: "hello from the actor" in (p := cluster.get(f"actors/{actor_id}/logs").text) and p,
        what="the log line on the page",
    )
    for asset, kind in [
        ("app.js", "javascript"),
        ("style.css", "text/css"),
        ("favicon.svg", "svg"),
    ]:
        reply = cluster.get(f"static/{asset}")
        assert reply.status == 200 and kind in reply.headers["Content-Type"], asset
    missing = cluster.get("actors/0123456789ab/logs")
    assert missing.status == 404 and "knows no actor" in missing.text


def test_user_strings_are_escaped_on_every_page(connected):
    cluster = connected
    actor = EvilActor()
    actor_id = actor._parl_ref.actor_id
    actor.shout()
    line = f"{EVIL} & <b>bold</b>"
    wait_until(lambda: line in _log_texts(cluster, actor_id), what="the evil line in the log")
    assert _actor(cluster, actor_id)["class_name"] == EVIL  # the API keeps the data as it is
    for path in ["", "actors", f"actors?client={_actor(cluster, actor_id)['client_id']}",
                 f"actors/{actor_id}/logs"]:  # fmt: skip
        text = cluster.get(path).text
        assert EVIL not in text and "<b>bold" not in text, path
        if path != "":
            assert html.escape(EVIL) in text, path
    assert html.escape(line) in cluster.get(f"actors/{actor_id}/logs").text
    assert cluster.get("api/actors").headers["Content-Type"].startswith("application/json")


def test_a_loopback_dashboard_answers_only_to_loopback_names(module_cluster):
    cluster = module_cluster
    assert cluster.get("api/cluster").status == 200
    port = cluster.url.rsplit(":", 1)[1].rstrip("/")
    assert fetch(f"http://localhost:{port}/api/cluster").status == 200
    rebound = cluster.get("api/cluster", headers={"Host": f"attacker.example:{port}"})
    assert rebound.status == 403 and "loopback" in rebound.text


# -- live updates ---------------------------------------------------------------------------------
async def _next_matching(ws, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching update within {timeout} s")
        msg = await ws.receive(timeout=left)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        data = json.loads(msg.data)
        if predicate(data):
            return data


def _total_actors(data) -> str | None:
    totals = data.get("replace", {}).get("totals")
    if totals is None:
        return None
    start = totals.index('id="total-actors">') + len('id="total-actors">')
    return totals[start : totals.index("<", start)]


def test_an_open_page_is_told_of_changes_within_two_seconds(connected):
    cluster = connected

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(cluster.url + "live?view=cluster") as ws:
                first = await _next_matching(ws, _total_actors, timeout=5)
                before = int(_total_actors(first))
                actor = await asyncio.to_thread(Talker)  # returns once the actor is idle
                created = time.monotonic()
                await _next_matching(ws, lambda d: _total_actors(d) == str(before + 1), 2.0)
                cluster_latency = time.monotonic() - created

            actor_id = actor._parl_ref.actor_id
            texts = await asyncio.to_thread(
                wait_until, lambda: _log_texts(cluster, actor_id), what="the greeting"
            )
            last = len(texts)
            url = cluster.url + f"live?view=log&actor={actor_id}&offset={last}"
            async with session.ws_connect(url) as ws:
                await _next_matching(ws, lambda d: "actor-head" in d.get("replace", {}), 5)
                await asyncio.to_thread(actor.say, "<live> line")
                said = time.monotonic()
                update = await _next_matching(ws, lambda d: "append" in d, 2.0)
                log_latency = time.monotonic() - said
            assert "&lt;live&gt; line" in update["append"]["log"]
            assert update["offset"] == last + 1
            return cluster_latency, log_latency

    cluster_latency, log_latency = asyncio.run(scenario())
    assert cluster_latency < 2.0 and log_latency < 2.0


def test_live_refuses_unknown_views_and_other_sites(module_cluster):
    cluster = module_cluster
    assert cluster.get("live?view=everything").status == 400
    assert cluster.get("live?view=log").status == 400  # which actor?
    foreign = cluster.get("live?view=cluster", headers={"Origin": "http://attacker.example"})
    assert foreign.status == 403


def test_stopping_the_master_closes_open_pages_with_going_away(tmp_path):
    cluster = start_dashboard_cluster(tmp_path, workers=())
    try:

        async def scenario():
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(cluster.url + "live?view=clients") as ws,
            ):
                await ws.receive(timeout=5)  # the first update
                await asyncio.to_thread(cluster.master.stop)
                return await ws.receive(timeout=5)

        msg = asyncio.run(scenario())
        assert msg.type == aiohttp.WSMsgType.CLOSE
        assert msg.data == aiohttp.WSCloseCode.GOING_AWAY and msg.extra == "the master is stopping"
    finally:
        cluster.stop()
