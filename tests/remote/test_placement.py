"""Placement decisions, tested without sockets: plain registry records in, messages out."""

from __future__ import annotations

import random

import pytest

from parl_remote.master._placement import Placement, Send, choose_worker
from parl_remote.master._registry import ActorInfo, ClientInfo, Registry, WorkerInfo
from parl_remote.wire.protocol import messages as m

pytestmark = pytest.mark.xparl_only  # the xparl master's placement


class Conn:
    """Stands for a peer's connection: placement only names it as a destination."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Conn({self.name})"


def worker(worker_id: str, cpu_num: int = 2, gpus: tuple[str, ...] = ()) -> WorkerInfo:
    info = WorkerInfo(
        worker_id, f"host-{worker_id}", "10.0.0.1", 1, cpu_num, list(gpus), 0, conn=Conn(worker_id)
    )
    info.free_gpus = list(gpus)
    return info


@pytest.fixture
def registry() -> Registry:
    registry = Registry("cluster")
    registry.add_client(ClientInfo("c1", "laptop", 7, False, conn=Conn("c1")))
    return registry


def ask(placement: Placement, request_id: int = 1, *, n_gpu: int = 0, wait_s: float = 5.0):
    client = placement.registry.clients["c1"]
    msg = m.CreateActor(request_id, "Learner", n_gpu=n_gpu, wait_s=wait_s)
    return placement.request(client.conn, client, msg, now=100.0)


def test_the_worker_with_most_vacant_slots_wins_and_cpu_actors_spare_gpus():
    small, big, gpu = worker("small", 1), worker("big", 3), worker("gpu", 3, ("0", "1"))
    assert choose_worker([small, big, gpu], n_gpu=0) is big
    assert choose_worker([small, big, gpu], n_gpu=1) is gpu
    assert choose_worker([small, big], n_gpu=1) is None
    big.conn = None  # lost its connection: never chosen
    big.actors = {"a", "b", "c"}
    assert choose_worker([small, big], n_gpu=0) is small
    small.actors = {"d"}
    assert choose_worker([small, big], n_gpu=0) is None


def test_a_request_with_a_free_slot_starts_an_actor_there(registry):
    registry.add_worker(worker("w1", 2, ("0", "1")))
    placement = Placement(registry)
    [send] = ask(placement, n_gpu=1)
    assert send.to is registry.workers["w1"].conn
    start = send.message
    assert isinstance(start, m.StartActor) and start.class_name == "Learner"
    assert start.gpus == ["0"] and start.client_id == "c1"
    actor = registry.actors[start.actor_id]
    assert registry.workers["w1"].actors == {actor.actor_id}
    assert registry.workers["w1"].free_gpus == ["1"]
    assert registry.clients["c1"].actors == {actor.actor_id}
    assert placement.starting[actor.actor_id].msg.request_id == 1
    assert placement.next_deadline() is None


def test_the_client_gets_the_address_once_the_process_took_the_actor(registry):
    registry.add_worker(worker("w1"))
    placement = Placement(registry)
    [start] = ask(placement, 7)
    actor_id = start.message.actor_id
    [reply] = placement.started(registry.workers["w1"], actor_id, port=4321, pid=99)
    assert reply == Send(
        registry.clients["c1"].conn, m.ActorAssigned(7, actor_id, "10.0.0.1", 4321, 99, "w1")
    )
    assert (registry.actors[actor_id].port, registry.actors[actor_id].pid) == (4321, 99)
    # a second report (or one for an actor nobody waits for) stops that process
    [stop] = placement.started(registry.workers["w1"], actor_id, port=4321, pid=99)
    assert stop.to is registry.workers["w1"].conn and isinstance(stop.message, m.StopActor)


def test_a_request_waits_for_a_slot_until_its_deadline(registry):
    placement = Placement(registry)
    assert ask(placement, 1, wait_s=5.0) == []
    assert ask(placement, 2, wait_s=2.0) == []
    assert placement.next_deadline() == 102.0
    assert placement.expire(101.9) == []
    [failed] = placement.expire(102.0)
    assert failed.to is registry.clients["c1"].conn
    assert failed.message.request_id == 2 and failed.message.kind == "resource"
    assert "the cluster has 0 CPU slots on 0 workers, 0 in use" in failed.message.reason
    assert "within 2 s" in failed.message.reason
    assert placement.next_deadline() == 105.0
    registry.add_worker(worker("w1"))
    [start] = placement.place_pending()
    assert start.message.actor_id in registry.actors
    assert placement.next_deadline() is None and placement.expire(1e9) == []


def test_an_expired_gpu_request_says_no_worker_offers_that_many(registry):
    registry.add_worker(worker("w1", 4, ("0",)))
    placement = Placement(registry)
    assert ask(placement, n_gpu=2, wait_s=0.0) == []
    [failed] = placement.expire(100.0)
    assert "no free CPU slot with 2 GPUs for Learner" in failed.message.reason
    assert "no worker offers 2 GPUs" in failed.message.reason


def test_a_failed_start_frees_the_slot_for_the_next_request(registry):
    registry.add_worker(worker("w1", 1))
    placement = Placement(registry)
    [first] = ask(placement, 1)
    assert ask(placement, 2) == []  # the only slot is taken
    failed, retried = placement.start_failed(first.message.actor_id, "no warm process")
    assert failed.message == m.CreateFailed(1, "error", "no warm process")
    assert isinstance(retried.message, m.StartActor)
    assert first.message.actor_id not in registry.actors
    assert registry.find_actor(first.message.actor_id).reason == "no warm process"
    assert list(registry.workers["w1"].actors) == [retried.message.actor_id]


def test_an_actor_that_dies_while_starting_fails_its_request(registry):
    registry.add_worker(worker("w1", 1))
    placement = Placement(registry)
    [start] = ask(placement, 3)
    actor = registry.actors[start.message.actor_id]
    [failed] = placement.actor_ended(actor, "it was killed by signal 9")
    assert failed.message == m.CreateFailed(
        3, "error", "the actor's process died: it was killed by signal 9"
    )
    assert registry.workers["w1"].vacant == 1 and actor.state == "dead"
    assert placement.actor_ended(actor, "again") == []


def test_a_gone_client_leaves_no_waiting_requests(registry):
    placement = Placement(registry)
    ask(placement, 1)
    placement.client_gone(registry.clients["c1"])
    assert placement.next_deadline() is None
    registry.add_worker(worker("w1"))
    assert placement.place_pending() == []


@pytest.mark.parametrize("seed", range(5))
def test_the_vacancy_index_chooses_as_a_scan_of_every_worker_would(seed):
    """Random clusters changed through the registry: the index and `choose_worker` agree."""
    rng = random.Random(seed)
    registry = Registry("cluster")
    registry.add_client(ClientInfo("c1", "laptop", 7, False, conn=Conn("c1")))
    actors: list[ActorInfo] = []
    for step in range(600):
        op = rng.random()
        workers = list(registry.workers.values())
        if op < 0.15 or not workers:
            n_gpus = rng.choice((0, 0, 0, 1, 2))
            new = worker(f"w{step}", rng.randint(1, 4), tuple(str(g) for g in range(n_gpus)))
            if workers and rng.random() < 0.1:  # the id of a registered worker, re-registering
                new.worker_id = rng.choice(workers).worker_id
                registry.remove_worker(new)
            registry.add_worker(new)
        elif op < 0.2:
            registry.remove_worker(rng.choice(workers))
        elif op < 0.6:
            host = choose_worker(workers, n_gpu := rng.choice((0, 0, 1)))
            if host is not None:
                actor = ActorInfo(
                    f"a{step}", "Learner", "c1", host.worker_id, gpus=host.free_gpus[:n_gpu]
                )
                registry.add_actor(actor)
                actors.append(actor)
        elif actors:
            registry.end_actor(actors.pop(rng.randrange(len(actors))), "released")
        if rng.random() < 0.02 and workers:  # a worker without a connection is never chosen
            lost = rng.choice(workers)
            lost.conn = None if lost.conn is not None else Conn(lost.worker_id)
        for n_gpu in (0, 1, 2):
            expected = choose_worker(registry.workers.values(), n_gpu)
            assert registry.vacancy.choose(n_gpu) is expected, (step, n_gpu)


def test_requests_without_gpus_wait_in_order_behind_one_that_found_no_slot(registry):
    registry.add_worker(worker("w1", 1, ("0",)))
    placement = Placement(registry)
    [first] = ask(placement, 1)
    assert ask(placement, 2) == [] and ask(placement, 3) == []
    assert placement.place_pending() == []
    assert [r.msg.request_id for r in placement.pending] == [2, 3]
    failed, retried = placement.start_failed(first.message.actor_id, "no warm process")
    assert failed.message.request_id == 1
    assert isinstance(retried.message, m.StartActor) and retried.to is registry.workers["w1"].conn
    assert [r.msg.request_id for r in placement.pending] == [3]
    assert placement.starting[retried.message.actor_id].msg.request_id == 2
