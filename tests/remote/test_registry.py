"""The registry: every change goes through a method that tells the listeners."""

from __future__ import annotations

import dataclasses
import itertools
import random
from unittest.mock import ANY

import pytest

from parl_remote.cli import STATUS_PAGE, format_status
from parl_remote.master._registry import ActorInfo, ClientInfo, Registry, WorkerInfo
from parl_remote.wire.protocol import messages as m

pytestmark = pytest.mark.xparl_only  # the xparl master's registry


def test_every_change_notifies_the_listeners():
    registry = Registry("cluster")
    calls = []
    unsubscribe = registry.subscribe(lambda: calls.append(1))

    def notified(change) -> bool:
        before = len(calls)
        change()
        return len(calls) > before

    worker = WorkerInfo("w1", "box", "10.0.0.1", 1, 2, ["0", "1"], 100)
    worker.free_gpus = ["0", "1"]
    client = ClientInfo("c1", "laptop", 7, False)
    actor = ActorInfo("a1", "Learner", "c1", "w1", gpus=["1"])
    beat = m.WorkerHeartbeat(50.0, 10, 100, 0.5, [m.ActorStats("a1", 99.0, 5, 3, 1, True)])
    assert notified(lambda: registry.set_master_info(host="127.0.0.1", port=1, pid=2))
    assert notified(lambda: registry.add_worker(worker))
    assert notified(lambda: registry.add_client(client))
    assert notified(lambda: registry.add_actor(actor))
    assert worker.actors == {"a1"} and worker.free_gpus == ["0"] and client.actors == {"a1"}
    assert notified(lambda: registry.actor_started(actor, 4321, 99))
    assert notified(lambda: registry.actor_initialized(actor))
    assert actor.state == "idle"
    assert notified(lambda: registry.worker_heartbeat(worker, beat))
    assert (actor.state, actor.calls, worker.cpu_percent, len(worker.history)) == ("busy", 3, 50, 1)
    assert notified(lambda: registry.add_logs([("a1", "stdout", "hello")]))
    assert notified(lambda: registry.release_actor(actor, "released by its client"))
    assert notified(lambda: registry.release_actor(actor, "a later reason"))
    assert actor.released and actor.reason == "released by its client"
    assert notified(lambda: registry.end_actor(actor, "its process exited"))
    assert worker.actors == set() and worker.free_gpus == ["0", "1"] and client.actors == set()
    assert notified(lambda: registry.remove_client(client))
    assert notified(lambda: registry.remove_worker(worker))
    assert registry.workers == {} and registry.clients == {} and registry.actors == {}
    unsubscribe()
    assert not notified(lambda: registry.add_worker(worker))


def test_a_reconnecting_client_keeps_its_actors():
    registry = Registry("cluster")
    registry.add_worker(WorkerInfo("w1", "box", "10.0.0.1", 1, 2, [], 100))
    registry.add_actor(ActorInfo("a1", "Learner", "c1", "w1"))  # adopted: its client is away
    registry.add_client(ClientInfo("c1", "laptop", 7, False))
    assert registry.clients["c1"].actors == {"a1"}
    again = ClientInfo("c1", "laptop", 7, False)
    registry.add_client(again)
    assert registry.clients["c1"] is again and again.actors == {"a1"}


def test_logs_are_numbered_and_bounded_per_actor():
    registry = Registry("cluster", log_lines_per_actor=3)
    assert registry.read_log("a1") is None
    registry.add_logs([("a1", "stdout", f"line {i}") for i in range(5)])
    page = registry.read_log("a1")
    assert (page.first, page.last, page.retained) == (3, 5, 3)
    assert [(n, text) for n, _, _, text in page.lines] == [
        (3, "line 2"),
        (4, "line 3"),
        (5, "line 4"),
    ]
    assert [n for n, *_ in registry.read_log("a1", offset=4).lines] == [5]
    assert registry.read_log("a1", limit=0).lines == ()


def test_readers_get_frozen_records_and_the_status_reply_plain_data():
    registry = Registry("cluster")
    registry.set_master_info("127.0.0.1", 8010, 42)
    worker = WorkerInfo("w1", "box", "10.0.0.1", 1, 2, ["0"], 100)
    worker.free_gpus = ["0"]
    registry.add_worker(worker)
    registry.add_client(ClientInfo("c1", "laptop", 7, False))
    registry.add_actor(ActorInfo("a1", "Learner", "c1", "w1", gpus=["0"]))
    registry.add_actor(ActorInfo("a2", "Learner", "c1", "w1"))
    registry.end_actor(registry.actors["a2"], "released by its client")
    snapshot = registry.snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.cluster_id = "other"  # type: ignore[misc]
    assert snapshot.totals.cpu_used == 1 and snapshot.totals.ended_actors == 1
    assert snapshot.workers[0].free_gpus == () and snapshot.actors[0].gpus == ("0",)
    assert [a.actor_id for a in snapshot.ended_actors] == ["a2"]
    assert registry.snapshot(ended=0).ended_actors == ()
    assert registry.actor_status("a2").reason == "released by its client"
    assert registry.actor_status("nobody") is None
    plain = snapshot.as_dict()
    assert plain["master"] == {"host": "127.0.0.1", "port": 8010, "pid": 42, "uptime_s": ANY}
    assert plain["workers"][0]["gpus"] == ["0"] and plain["actors"][0]["state"] == "starting"
    assert plain["clients"] == [
        {
            "client_id": "c1",
            "hostname": "laptop",
            "pid": 7,
            "actors": 1,
            "connected_at": ANY,
            "restarts": 0,
        }
    ]
    assert m.decoder.decode(m.encoder.encode(m.StatusReply(1, plain))).status == plain
    # A replacement names the actor it replaced and why that one ended; the client counts it.
    client = registry.clients["c1"]
    for new, old in (("a3", "a2"), ("a4", "a3"), ("a5", "nobody")):
        actor = ActorInfo(new, "Learner", "c1", "w1")
        registry.replaced(actor, old, client)
        registry.add_actor(actor)
    registry.end_actor(registry.actors["a3"], "its process was killed by SIGKILL")
    a3, a4, a5 = (registry.actor_status(a) for a in ("a3", "a4", "a5"))
    assert (a3.replaces, a3.replaced_reason) == ("a2", "released by its client")
    assert (a4.replaces, a4.replaced_reason) == ("a3", "its process was killed by SIGKILL")
    assert (a5.replaces, a5.replaced_reason) == ("", "")  # no such actor of this client
    assert registry.actors["a4"].replaced is not None and registry.find_actor("a3").replaced is None
    assert client.status().restarts == 2


def _many(workers: int, actors: int) -> Registry:
    registry = Registry("cluster")
    for i in range(workers):
        registry.add_worker(WorkerInfo(f"w{i:03d}", f"box{i}", "10.0.0.1", 1, 4, [], 100))
    for i in range(3):
        registry.add_client(ClientInfo(f"c{i}", "laptop", 7, False))
    for i in range(actors):
        registry.add_actor(ActorInfo(f"a{i:03d}", "Learner", f"c{i % 3}", f"w{i % workers:03d}"))
    return registry


def test_a_snapshot_is_a_page_of_each_list_with_totals_of_the_whole_cluster():
    registry = _many(workers=45, actors=30)
    page = registry.snapshot(offset=20, limit=20)
    assert [w.worker_id for w in page.workers] == [f"w{i:03d}" for i in range(20, 40)]
    assert [a.actor_id for a in page.actors] == [f"a{i:03d}" for i in range(20, 30)]
    assert page.clients == () and (page.offset, page.limit) == (20, 20)
    assert (page.totals.workers, page.totals.actors, page.totals.clients) == (45, 30, 3)
    assert page.totals.cpu_total == 180 and page.totals.cpu_used == 30
    assert [w.worker_id for w in registry.snapshot(offset=40, limit=20).workers][-1] == "w044"
    assert len(registry.snapshot().workers) == 45  # no limit: every record
    assert registry.snapshot(limit=0).workers == ()
    assert registry.snapshot(offset=20, limit=20).as_dict()["limit"] == 20


def test_xparl_status_prints_the_summary_a_page_and_how_to_see_more():
    registry = _many(workers=45, actors=30)
    text = format_status(registry.snapshot(limit=STATUS_PAGE).as_dict())
    assert "workers: 45   CPU slots: 30 used, 150 vacant, 180 total   actors: 30" in text
    assert "w019" in text and "w020" not in text
    assert text.endswith(
        "shown: workers 1-20 of 45, actors 1-20 of 30 "
        "(xparl status --offset 20 for the next 20, --all for every one)"
    )
    last = format_status(registry.snapshot(offset=40, limit=STATUS_PAGE).as_dict())
    assert "w044" in last and "w039" not in last
    assert "shown: workers 41-45 of 45, clients none of 3, actors none of 30" in last
    everything = format_status(registry.snapshot().as_dict())
    assert "w044" in everything and "shown:" not in everything


def test_load_history_keeps_a_sample_every_two_seconds_for_ten_minutes():
    worker = WorkerInfo("w1", "box", "10.0.0.1", 1, 2, [], 100)
    for when in (0.0, 1.0, 1.9, 2.0, 3.0, 4.5):
        worker.record_load(when)
    assert [t for t, _, _ in worker.history] == [0.0, 2.0, 4.5]
    worker.record_load(700.0)
    assert [t for t, _, _ in worker.history] == [700.0]  # the rest are over 10 minutes old
    for when in (1000.0, 1001.0, 1002.0):
        worker.record_load(when)
    assert [t for t, _, _ in worker.history] == [700.0, 1000.0, 1002.0]


class _Recorder:
    """Stands for a peer's connection: keeps what the master sends on it."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.context: object = None
        self.closed = False

    def send(self, msg: object) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True


def test_the_master_pings_a_peer_every_third_of_its_timeout_and_drops_a_silent_one():
    from parl_remote._config import settings
    from parl_remote.master._master import Master

    master = Master("127.0.0.1", 0, token=None)
    conn = _Recorder()
    worker = WorkerInfo("w1", "box", "10.0.0.1", 1, 2, [], 100, conn=conn)
    conn.context = worker  # as registering sets it
    master.registry.add_worker(worker)
    beat, timeout = settings.heartbeat_s, settings.heartbeat_timeout_s
    sweeps = [worker.last_seen + k * beat for k in range(int(timeout / beat) + 1)]
    pinged = []
    for now in sweeps:
        before = len(conn.sent)
        master._check(worker, now)
        if len(conn.sent) > before:
            pinged.append(now)
    assert all(isinstance(msg, m.Ping) for msg in conn.sent)
    assert pinged[0] == sweeps[0] and len(pinged) < len(sweeps)
    gaps = [b - a for a, b in itertools.pairwise(pinged)]
    assert gaps and all(gap + beat > timeout / 3 and gap <= timeout / 3 + beat for gap in gaps)
    master._check(worker, worker.last_seen + timeout + 0.5)
    assert conn.closed and "w1" not in master.registry.workers
    told = _Recorder()  # a peer the master just sent something needs no ping
    busy = WorkerInfo("w2", "box", "10.0.0.1", 1, 2, [], 100, conn=told)
    told.context = busy
    master.registry.add_worker(busy)
    master._send(told, m.StopActor("a1", "released by its client"), busy.last_seen)
    master._check(busy, busy.last_seen + beat)  # the next sweep
    assert [type(msg) for msg in told.sent] == [m.StopActor]
    master._check(busy, busy.last_seen + timeout / 3)
    assert [type(msg) for msg in told.sent] == [m.StopActor, m.Ping]


@pytest.mark.parametrize("seed", range(3))
def test_the_totals_kept_as_things_change_are_the_sums_over_every_record(seed):
    rng = random.Random(seed)
    registry = Registry("cluster")
    registry.add_client(ClientInfo("c1", "laptop", 7, False))
    hosts = {f"box{i}": [rng.randrange(1 << 30), 8 << 30] for i in range(4)}  # used, total
    actors: list[ActorInfo] = []
    for step in range(400):
        op, workers = rng.random(), list(registry.workers.values())
        if op < 0.2 or not workers:
            hostname = rng.choice(sorted(hosts))
            new = WorkerInfo(f"w{step}", hostname, "10.0.0.1", 1, rng.randint(1, 4), [], 0)
            new.mem_used, new.mem_total = hosts[hostname]
            if workers and rng.random() < 0.2:  # a registered worker's id, registering again
                new.worker_id = rng.choice(workers).worker_id
            registry.add_worker(new)
        elif op < 0.3:
            registry.remove_worker(rng.choice(workers))
        elif op < 0.4:  # a machine's memory changes; each of its workers reports it
            hostname = rng.choice(sorted(hosts))
            hosts[hostname][0] = rng.randrange(1 << 30)
            for w in workers:
                if w.hostname == hostname:
                    beat = m.WorkerHeartbeat(10.0, hosts[hostname][0], hosts[hostname][1], 0.1)
                    registry.worker_heartbeat(w, beat)
        elif op < 0.75:
            host = rng.choice(workers)
            if host.vacant > 0:
                actor = ActorInfo(f"a{step}", "Learner", "c1", host.worker_id)
                registry.add_actor(actor)
                actors.append(actor)
        elif actors:
            registry.end_actor(actors.pop(rng.randrange(len(actors))), "released")
        workers = list(registry.workers.values())
        seen = {w.hostname for w in workers}
        totals = registry.snapshot(limit=0).totals
        assert totals.workers == len(workers)
        assert totals.cpu_total == sum(w.cpu_num for w in workers), step
        assert totals.cpu_used == sum(len(w.actors) for w in workers), step
        assert totals.mem_used == sum(hosts[h][0] for h in seen), step
        assert totals.mem_total == sum(hosts[h][1] for h in seen), step


def test_a_page_of_actors_is_what_filtering_every_record_then_slicing_gives():
    rng = random.Random(0)
    registry = _many(workers=20, actors=80)
    for actor in rng.sample(list(registry.actors.values()), 30):
        registry.end_actor(actor, "released")
    for actor in rng.sample(list(registry.actors.values()), 20):
        registry.actor_initialized(actor)  # idle; the others are still starting
    every = registry.actor_statuses()
    in_order = [a for a in every if a.state != "dead"]
    in_order += [a for a in reversed(every) if a.state == "dead"]
    for client, state in itertools.product((None, "c1", "nobody"), (None, "live", "dead", "idle")):
        matched = [
            a
            for a in in_order
            if (client is None or a.client_id == client)
            and (state is None or (a.state != "dead" if state == "live" else a.state == state))
        ]
        for offset, limit in ((0, None), (0, 7), (45, 10), (200, 5)):
            page = registry.actor_page(offset=offset, limit=limit, client=client, state=state)
            stop = None if limit is None else offset + limit
            want = [a.actor_id for a in matched[offset:stop]]
            assert [a.actor_id for a in page.actors] == want, (client, state, offset, limit)
            assert page.live == sum(a.state != "dead" for a in matched)
            assert page.ended == sum(a.state == "dead" for a in matched)
    assert registry.client_ids() == ["c0", "c1", "c2"]
    assert registry.actor_page().as_dict()["actors"][0]["gpus"] == []


def test_only_actors_ended_away_from_their_worker_are_remembered_and_only_for_a_while():
    registry = Registry("cluster", lost_for_s=60.0)
    worker = WorkerInfo("w1", "box", "10.0.0.1", 1, 4, [], 100)
    registry.add_worker(worker)
    for i in range(3):
        registry.add_actor(ActorInfo(f"a{i}", "Learner", "c1", "w1"))
    registry.end_actor(registry.actors["a0"], "its process exited")  # its worker's word
    registry.remove_worker(worker)
    registry.end_actor(registry.actors["a1"], "its worker was lost")
    assert list(registry.lost_ids) == ["a1"]  # the worker may come back with it
    registry.lost_ids["a1"] -= 61.0  # as if it ended a minute ago
    registry.end_actor(registry.actors["a2"], "its worker was lost")
    assert list(registry.lost_ids) == ["a2"]


def test_an_ended_actor_is_found_until_it_is_no_longer_among_the_kept_ones():
    from parl_remote.master._registry import _ENDED

    registry = Registry("cluster")
    for i in range(_ENDED + 2):
        registry.add_actor(ActorInfo(f"a{i}", "Learner", "c1", "w1"))
        registry.end_actor(registry.actors[f"a{i}"], "released")
    assert registry.find_actor("a0") is None and registry.find_actor("a1") is None
    assert registry.find_actor("a2").state == "dead"
    assert registry.find_actor(f"a{_ENDED + 1}").reason == "released"
    assert registry.find_actor("nobody") is None
