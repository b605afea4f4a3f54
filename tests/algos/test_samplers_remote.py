"""The samplers on a real local cluster: the same batches as in one process, weights, failures.

One cluster of real processes (`parl.connect(cpu_num=...)`) serves the module and is stopped at
its end, even on failure. `ParallelSampler` and `CentralSampler` must return, collect after
collect, the very batches `SerialSampler` returns; through shared memory on this host and
through the ordinary call path when the workers look like another host's.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest

import parl
from parl.samplers import AsyncSampler, Batch, CentralSampler, ParallelSampler, SerialSampler
from tests.algos.test_samplers import ENV_FN, LinearAgent

SIZES = {"num_workers": 2, "envs_per_worker": 2, "horizon": 6, "seed": 3}


@pytest.fixture(scope="module")
def cluster():
    client = parl.connect(cpu_num=4, log_to_driver=False)
    try:
        yield client
    finally:
        parl.disconnect()


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return value


def no_actors(client) -> bool:
    totals = client.status()["totals"]
    return totals["actors"] == 0 and totals["cpu_used"] == 0


def assert_same(a: Batch, b: Batch) -> None:
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "next_obs"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name  # bit for bit
    assert a.extras.keys() == b.extras.keys()
    for name in a.extras:
        assert a.extras[name].tobytes() == b.extras[name].tobytes(), name
    assert list(a.final_obs) == list(b.final_obs)
    for key in a.final_obs:
        assert a.final_obs[key].tobytes() == b.final_obs[key].tobytes(), key


def run_alike(samplers, collects: int = 4) -> None:
    """Every sampler returns the same batches and episodes as the first, collect after collect."""
    for _ in range(collects):
        batches = [s.collect() for s in samplers]
        for batch in batches[1:]:
            assert_same(batches[0], batch)
    episodes = [s.episodes() for s in samplers]
    assert episodes[0] and all(e == episodes[0] for e in episodes)


def test_serial_parallel_and_central_return_identical_batches(cluster):
    before = shm_names()
    with (
        SerialSampler(ENV_FN, LinearAgent(), **SIZES) as serial,
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as parallel,
        CentralSampler(ENV_FN, LinearAgent(), **SIZES, alternating=True) as central,
    ):
        assert parallel.shared_memory == central.shared_memory == [True, True]
        ours = shm_names() - before
        assert len(ours) == 2 * 2  # one segment a worker, for each cluster sampler
        for name in ours:
            assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600
        run_alike([serial, parallel, central])
    assert shm_names() == before
    wait_until(lambda: no_actors(cluster), what="the workers to be freed")


def test_workers_on_another_host_use_the_ordinary_call_path(cluster, monkeypatch):
    # The workers' processes were started before this: they report the real host id.
    monkeypatch.setenv("PARL_HOST_ID", "elsewhere")
    before = shm_names()
    with (
        SerialSampler(ENV_FN, LinearAgent(), **SIZES) as serial,
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as parallel,
        CentralSampler(ENV_FN, LinearAgent(), **SIZES) as central,
    ):
        assert parallel.shared_memory == central.shared_memory == [False, False]
        assert shm_names() == before
        run_alike([serial, parallel, central], collects=2)


def test_sync_weights_reaches_every_workers_copy(cluster):
    learner, reference = LinearAgent(), LinearAgent()
    old = LinearAgent().w
    with (
        ParallelSampler(ENV_FN, learner, **SIZES) as parallel,
        SerialSampler(ENV_FN, reference, **SIZES) as serial,
    ):
        assert_same(serial.collect(), parallel.collect())
        learner.set_weights({"w": -old})  # the learner learned: the opposite policy
        assert_same(serial.collect(), parallel.collect())  # not synced: the workers act as before
        parallel.sync_weights()
        reference.set_weights({"w": -old})
        assert parallel.weights_version == 1
        new = parallel.collect()
        assert_same(serial.collect(), new)
        scores_old = (new.obs[..., None] * old).sum(axis=2)
        assert (new.actions != scores_old.argmax(axis=-1)).all()  # every action changed


class KillAt(gym.Wrapper):
    """Kills its own process with SIGKILL at step `at` of column `column`: a crashed worker."""

    def __init__(self, env: gym.Env, column: int, at: int) -> None:
        super().__init__(env)
        self.column, self.at, self.steps, self.first_seed = column, at, 0, None

    def reset(self, *, seed=None, options=None):
        if self.first_seed is None:
            self.first_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.first_seed == self.column and self.steps == self.at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def killing_env(column: int, at: int) -> gym.Env:
    return KillAt(gym.make("CartPole-v1"), column, at)


@pytest.mark.parametrize("kind", [ParallelSampler, CentralSampler, AsyncSampler])
def test_a_worker_killed_mid_collect_is_named_and_nothing_leaks(cluster, kind):
    before = shm_names()
    wait_until(lambda: no_actors(cluster), what="a cluster without actors")
    # Seed 0: column 5 is worker 1's second environment; it dies at its 8th step.
    env_fn = functools.partial(killing_env, 5, 8)
    sampler = kind(env_fn, LinearAgent(), num_workers=2, envs_per_worker=3, horizon=5, seed=0)
    with sampler:
        assert len(shm_names() - before) == 2 * sampler._slots
        with pytest.raises(parl.RemoteActorDiedError, match=r"worker 1 died"):
            deadline = time.monotonic() + 60  # a synchronous sampler: the second collect
            while time.monotonic() < deadline:  # AsyncSampler: once its death is known
                sampler.collect()
        assert shm_names() == before  # freed as soon as the worker was found dead
        with pytest.raises(RuntimeError, match="closed"):
            sampler.collect()
    sampler.close()  # again: nothing happens
    wait_until(lambda: no_actors(cluster), what="every slot to be free again")
    assert shm_names() == before


def test_async_batches_say_which_worker_and_which_weights(cluster):
    learner, old = LinearAgent(), LinearAgent().w
    n = SIZES["envs_per_worker"]
    with AsyncSampler(ENV_FN, learner, **SIZES) as sampler:
        assert sampler.shared_memory == [True, True]
        by_worker: dict[int, list[Batch]] = {0: [], 1: []}
        for _ in range(6):
            batch = sampler.collect()
            assert batch.obs.shape == (SIZES["horizon"], n, 4) and batch.weights_version == 0
            by_worker[batch.worker].append(batch)
        learner.set_weights({"w": -old})
        sampler.sync_weights()
        assert sampler.weights_version == 1
        versions = []
        for _ in range(12):  # two queued rollouts a worker go out with the old weights
            batch = sampler.collect()
            versions.append((batch.worker, batch.weights_version))
            by_worker[batch.worker].append(batch)
            weights = old if batch.weights_version == 0 else -old
            scores = (batch.obs[..., None] * weights).sum(axis=2)
            np.testing.assert_array_equal(batch.actions, scores.argmax(axis=-1))
        for w in (0, 1):  # a worker's versions only go up, and the new one arrives
            mine = [v for worker, v in versions if worker == w]
            assert mine == sorted(mine) and mine[-1] == 1, versions
    for w, batches in by_worker.items():
        assert batches  # every worker contributed
        for a, b in itertools.pairwise(batches):  # each worker's episodes go on batch to batch
            np.testing.assert_array_equal(b.obs[0], a.next_obs)
        first = batches[0].obs[0]
        for j in range(n):  # worker w's env j was first reset with seed + w * n + j
            env = ENV_FN()
            np.testing.assert_array_equal(first[j], env.reset(seed=SIZES["seed"] + w * n + j)[0])
