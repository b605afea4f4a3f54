"""Many actors at once: threads owning and sharing actors, and async code driving 32 of them."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

import parl
from tests.remote.conftest import client_env, make_cluster

pytestmark = pytest.mark.xparl_only  # xparl workers (8 actors on a 2-CPU Ray would wait forever)


@parl.remote_class
class Counter:
    def __init__(self):
        self.n = 0

    def incr(self, by=1):
        self.n += by
        return self.n

    def pid(self):
        return os.getpid()

    async def slow_double(self, x):
        await asyncio.sleep(0.05)
        return 2 * x


def test_8_threads_times_8_actors(tmp_path):
    cluster = make_cluster(tmp_path, workers=(8,))
    try:
        with client_env(cluster):
            parl.connect(cluster.address)
            actors = [Counter() for _ in range(8)]
            assert len({a.pid() for a in actors}) == 8
            errors = []

            def work(index: int) -> None:
                try:
                    own = actors[index]
                    for i in range(50):
                        own.incr()
                        actors[(index + i) % 8].incr(1000)  # shared with every other thread
                except Exception as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors
            assert not any(t.is_alive() for t in threads)
            # 8 threads x 50 own calls, plus 8 x 50 shared calls of 1000 spread evenly
            assert sum(a.incr(0) for a in actors) == 8 * 50 + 8 * 50 * 1000
    finally:
        cluster.stop()


def test_async_code_drives_32_actors_with_gather(tmp_path):
    cluster = make_cluster(tmp_path, workers=(32,))
    try:
        with client_env(cluster):
            parl.connect(cluster.address)

            async def main():
                actors = await asyncio.gather(*[Counter.aio() for _ in range(32)])
                pids = await asyncio.gather(*[a.pid() for a in actors])
                doubled = await asyncio.gather(*[a.slow_double(i) for i, a in enumerate(actors)])
                counts = await asyncio.gather(
                    *[a.incr(i) for i, a in enumerate(actors) for _ in range(3)]
                )
                return pids, doubled, counts

            pids, doubled, counts = asyncio.run(main())
            assert len(set(pids)) == 32
            assert doubled == [2 * i for i in range(32)]
            assert counts == [(k + 1) * i for i in range(32) for k in range(3)]
    finally:
        cluster.stop()


def test_a_second_worker_joins_and_takes_actors(tmp_path):
    cluster = make_cluster(tmp_path, workers=(1,))
    try:
        with client_env(cluster, PARL_RESOURCE_WAIT_S=20):
            parl.connect(cluster.address)
            first = Counter()
            cluster.add_worker(cpu_num=1)  # a worker joining a running cluster
            second = Counter()
            status = cluster.status()
            assert status["totals"]["workers"] == 2
            assert sorted(w["cpu_used"] for w in status["workers"]) == [1, 1]
            assert first.incr() == 1 and second.incr() == 1
    finally:
        cluster.stop()
