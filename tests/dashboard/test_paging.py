"""The dashboard's tables are paged on the server: a page holds PER_PAGE rows and links on."""

from __future__ import annotations

import pytest

from parl_dashboard import _html
from parl_dashboard._data import PER_PAGE, actors_data, clients_data, cluster_data
from parl_dashboard._live import View
from parl_remote.master._registry import ActorInfo, ClientInfo, Registry, WorkerInfo

pytestmark = pytest.mark.xparl_only  # the xparl master's registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    registry = Registry("cluster")
    for i in range(2 * PER_PAGE + 7):
        registry.add_worker(WorkerInfo(f"w{i:03d}", f"box{i}", "10.0.0.1", 1, 2, [], 100))
    registry.add_client(ClientInfo("c0", "laptop", 7, False))
    registry.add_client(ClientInfo("c1", "laptop", 8, False))
    for i in range(PER_PAGE + 10):
        registry.add_actor(ActorInfo(f"a{i:03d}", "Learner", f"c{i % 2}", f"w{i:03d}"))
    for i in range(5):
        registry.end_actor(registry.actors[f"a{i:03d}"], "released by its client")
    return registry


def test_the_cluster_page_lists_a_page_of_workers_with_the_totals_of_all(registry):
    first, last = cluster_data(registry), cluster_data(registry, 3)
    assert [w["worker_id"] for w in first["workers"]] == [f"w{i:03d}" for i in range(PER_PAGE)]
    assert [w["worker_id"] for w in last["workers"]] == [
        f"w{i:03d}" for i in range(2 * PER_PAGE, 2 * PER_PAGE + 7)
    ]
    assert first["totals"]["workers"] == 2 * PER_PAGE + 7
    assert first["page"] == {"page": 1, "per_page": PER_PAGE, "pages": 3, "total": 107}
    assert cluster_data(registry, 4)["workers"] == []
    html = _html.cluster_fragments(first)["workers"]
    assert html.count('<tr id="worker-') == PER_PAGE
    assert 'href="/?page=2" rel="next"' in html and 'rel="prev"' not in html
    assert "page 1 of 3 · workers 1-50 of 107" in html
    middle = _html.cluster_fragments(cluster_data(registry, 2))["workers"]
    assert 'href="/?page=1" rel="prev"' in middle and 'href="/?page=3" rel="next"' in middle
    beyond = _html.cluster_fragments(cluster_data(registry, 9))["workers"]
    assert "No worker on this page." in beyond


def test_the_actors_page_filters_then_pages_and_counts_every_match(registry):
    data = actors_data(registry)
    assert (data["live"], data["ended"], data["page"]["total"]) == (55, 5, 60)
    assert [a["actor_id"] for a in data["actors"][:2]] == ["a005", "a006"]  # live, oldest first
    assert data["actors"][0]["worker_hostname"] == "box5"
    rest = actors_data(registry, page=2)["actors"]
    assert [a["actor_id"] for a in rest] == [
        *(f"a{i:03d}" for i in range(PER_PAGE + 5, PER_PAGE + 10)),
        *(f"a{i:03d}" for i in reversed(range(5))),  # then ended, latest first
    ]
    mine = actors_data(registry, client="c1", state="live")
    assert mine["page"]["total"] == mine["live"] == 28 and mine["ended"] == 0
    assert all(a["client_id"] == "c1" for a in mine["actors"])
    fragments = _html.actor_fragments(actors_data(registry, state="live"), state="live")
    assert fragments["actor-counts"] == "55 live · 0 recently ended"
    assert 'href="/actors?state=live&amp;page=2" rel="next"' in fragments["actors"]
    assert "actors 1-50 of 55" in fragments["actors"]


def test_clients_are_paged_too_and_a_short_table_has_no_pager(registry):
    data = clients_data(registry)
    assert [c["client_id"] for c in data["clients"]] == ["c0", "c1"]
    assert data["page"]["pages"] == 1
    assert "pager" not in _html.clients_fragments(data)["clients"]


def test_a_view_reads_its_page_from_the_query_and_refuses_a_bad_one():
    view = View.from_query({"view": "actors", "state": "live", "page": "3"})
    assert view.page == 3 and view.query() == {"view": "actors", "state": "live", "page": "3"}
    assert View.from_query({"view": "cluster"}).query() == {"view": "cluster"}
    for bad in ("0", "-1", "two", "99999999999"):
        with pytest.raises(ValueError, match=r"page=.* is not a page number"):
            View.from_query({"view": "cluster", "page": bad})
