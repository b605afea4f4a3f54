"""A master listening beyond loopback guards its dashboard with the cluster token.

The master here binds every interface; the test still speaks to it only through 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import urllib.parse

import aiohttp
import pytest

from tests.dashboard.conftest import start_dashboard_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_dashboard_cluster(
        tmp_path_factory.mktemp("guarded"), workers=(1,), host="0.0.0.0"
    )
    yield cluster
    cluster.stop()


def _session_cookie(reply) -> tuple[str, str, str]:
    """The name, value and attributes of the session cookie a reply sets."""
    header = reply.headers["Set-Cookie"]
    pair, _, attributes = header.partition(";")
    name, _, value = pair.partition("=")
    return name.strip(), value.strip(), attributes


def test_without_the_token_there_is_only_the_login_form(cluster):
    status = cluster.status()
    for path in ["", "actors", "clients", "actors/0123456789ab/logs"]:
        page = cluster.get(path)
        assert page.status == 401, path
        assert 'action="/login"' in page.text and 'type="password"' in page.text
        assert status["cluster_id"] not in page.text
    for path in ["api/cluster", "api/actors", "api/clients", "api/actors/0123456789ab/logs"]:
        reply = cluster.get(path)
        assert reply.status == 401 and "cluster token" in reply.json()["error"], path
    assert cluster.get("live?view=cluster").status == 401
    assert cluster.get("static/style.css").status == 200  # the login form has its style
    wrong = cluster.get("?token=" + "0" * len(cluster.token))
    assert wrong.status == 401 and "not this cluster&#x27;s token" in wrong.text
    assert cluster.get("api/cluster", headers={"Authorization": "Bearer nope"}).status == 401


def test_token_in_the_url_sets_an_http_only_cookie_and_drops_the_token(cluster):
    reply = cluster.get(f"actors?state=live&token={cluster.token}")
    assert reply.status == 303
    assert reply.headers["Location"] == "/actors?state=live"
    name, value, attributes = _session_cookie(reply)
    assert value and cluster.token not in value
    assert "HttpOnly" in attributes and "SameSite=Strict" in attributes
    cookie = {"Cookie": f"{name}={value}"}
    page = cluster.get("actors?state=live", headers=cookie)
    assert page.status == 200 and "<h1>Actors</h1>" in page.text
    assert cluster.get("api/cluster", headers=cookie).json()["totals"]["workers"] == 1
    # any Host name is fine once the token is known
    assert cluster.get("", headers={**cookie, "Host": "cluster.example:80"}).status == 200
    assert cluster.get("", headers={"Cookie": f"{name}=forged"}).status == 401


def test_the_login_form_checks_the_token_and_stays_on_this_site(cluster):
    ok = cluster.get("login", method="POST", data={"token": cluster.token, "next": "/clients"})
    assert ok.status == 303 and ok.headers["Location"] == "/clients"
    name, value, _ = _session_cookie(ok)
    assert cluster.get("clients", headers={"Cookie": f"{name}={value}"}).status == 200
    away = cluster.get(
        "login", method="POST", data={"token": cluster.token, "next": "//attacker.example/"}
    )
    assert away.status == 303 and away.headers["Location"] == "/"
    bad = cluster.get("login", method="POST", data={"token": "guess", "next": "/"})
    assert bad.status == 401 and "Set-Cookie" not in bad.headers
    assert "not this cluster" in bad.text


def test_scripts_use_a_bearer_token_or_the_query(cluster):
    bearer = cluster.get("api/actors", headers={"Authorization": f"Bearer {cluster.token}"})
    assert bearer.status == 200 and bearer.json()["actors"] == []
    query = cluster.get("api/clients?" + urllib.parse.urlencode({"token": cluster.token}))
    assert query.status == 200 and query.json()["clients"] == []
    assert "HttpOnly" in query.headers["Set-Cookie"]


def test_live_updates_need_the_cookie_too(cluster):
    login = cluster.get(f"?token={cluster.token}")
    name, value, _ = _session_cookie(login)

    async def scenario():
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(cluster.url + "live?view=cluster")
            async with session.ws_connect(
                cluster.url + "live?view=cluster", headers={"Cookie": f"{name}={value}"}
            ) as ws:
                return refused.value.status, await ws.receive_json(timeout=5)

    status, first = asyncio.run(scenario())
    assert status == 401
    assert 'id="total-workers">1<' in first["replace"]["totals"]


def test_the_master_reports_a_reachable_dashboard_address(cluster):
    url = urllib.parse.urlsplit(cluster.master.ready["dashboard"])
    assert url.scheme == "http" and url.hostname not in ("0.0.0.0", "", None)
