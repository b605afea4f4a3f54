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
    client = parl.connect(cpu_num=6, log_to_driver=False)
    try:
        yield client
    finally:
        parl.disconnect()


def shm_fds() -> dict[str, str]:
    """The samplers' segments this process owns (other test processes make their own
    meanwhile): a memfd's name -> the path of this process's descriptor of it.

    A segment's owner holds its descriptor until it closes it (mappings hold none: what an
    array still maps is in `/proc/self/maps`, not here)."""
    prefix, found = f"/memfd:parl-sampler-{os.getpid()}-", {}
    for fd in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{fd}"
        try:
            target = os.readlink(path)
        except OSError:
            continue
        if target.startswith(prefix):
            found[target[len("/memfd:") :].removesuffix(" (deleted)")] = path
    return found


def shm_names() -> set[str]:
    """The names of the samplers' segments this process owns (`shm_fds`)."""
    return set(shm_fds())


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
        CentralSampler(ENV_FN, LinearAgent(), **SIZES) as central,
        CentralSampler(ENV_FN, LinearAgent(), **SIZES, alternating=True) as alternating,
    ):
        assert parallel.shared_memory == central.shared_memory == [True, True]
        for sampler in (central, alternating):  # steps signalled, not called
            assert all(signal is not None for signal in sampler._group.signals)
        fds = shm_fds()
        ours = shm_names() - before
        assert len(ours) == 3 * 2  # one segment a worker, for each cluster sampler
        for name in ours:
            assert os.stat(fds[name]).st_mode & 0o777 == 0o600
        run_alike([serial, parallel, central, alternating])
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
        assert central._group.signals == [None, None]
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


class AtStep(gym.Wrapper):
    """Calls `hit()` at step `at` of the column first reset with seed `column`."""

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
            self.hit()
        return super().step(action)

    def hit(self) -> None:
        raise NotImplementedError


class KillAt(AtStep):
    """Kills its own process with SIGKILL: a crashed worker."""

    def hit(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


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


class FailOnce(AtStep):
    """Raises an error, the first time only (in this process)."""

    failed = False

    def hit(self) -> None:
        if not FailOnce.failed:
            FailOnce.failed = True
            raise ValueError(f"column {self.column} failed at step {self.at}")


def failing_env(column: int, at: int) -> gym.Env:
    return FailOnce(gym.make("CartPole-v1", max_episode_steps=10), column, at)


class FailingAgent(LinearAgent):
    """`LinearAgent` whose `sample` raises on its `at`-th call."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.calls, self.at = 0, at

    def sample(self, obs):
        self.calls += 1
        if self.calls == self.at:
            raise ArithmeticError("the agent failed")
        return super().sample(obs)


def assert_continues(sampler, collects: int = 3) -> None:
    """Further collects work, and each starts where the one before ended."""
    previous = sampler.collect()
    for _ in range(collects - 1):
        batch = sampler.collect()
        np.testing.assert_array_equal(batch.obs[0], previous.next_obs)
        for t in range(len(batch.obs) - 1):  # every row written: obs follow the flags
            assert np.isfinite(batch.obs[t + 1]).all()
        previous = batch


@pytest.mark.parametrize("alternating", [False, True])
def test_an_error_in_a_workers_environment_or_in_the_agent_leaves_central_in_step(
    cluster, alternating
):
    # Seed 0, 2 workers x 3 envs: column 4 is worker 1's second environment.
    sizes = {"num_workers": 2, "envs_per_worker": 3, "horizon": 5, "seed": 0}
    env_fn = functools.partial(failing_env, 4, 3)
    with CentralSampler(env_fn, LinearAgent(), **sizes, alternating=alternating) as sampler:
        with pytest.raises(parl.RemoteError, match="column 4 failed at step 3"):
            sampler.collect()
        assert_continues(sampler)
    with CentralSampler(ENV_FN, FailingAgent(at=4), **sizes, alternating=alternating) as sampler:
        with pytest.raises(ArithmeticError, match="the agent failed"):
            sampler.collect()
        assert_continues(sampler)
        assert sampler._group.workers  # still open


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
        versions: list[tuple[int, int]] = []
        # Two queued rollouts a worker go out with the old weights. Batches come from whichever
        # worker finishes first, so one worker may deliver many before the other: collect (a
        # bounded number) until both have delivered one made with the new weights.
        while len(versions) < 12 or {w for w, v in versions if v == 1} != {0, 1}:
            assert len(versions) < 200, versions
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


class AffinityObs(gym.ObservationWrapper):
    """Observes the CPUs its process may run on: `[how many, the lowest]`."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0.0, 1e6, (2,), np.float32)

    def observation(self, observation):
        cpus = os.sched_getaffinity(0)
        return np.array([len(cpus), min(cpus)], np.float32)


def affinity_env() -> gym.Env:
    return AffinityObs(ENV_FN())


class FirstAction:
    """Always action 0; notes the CPUs of the thread that chooses (the caller's)."""

    def __init__(self) -> None:
        self.cpus: list[set[int]] = []

    def sample(self, obs: np.ndarray) -> np.ndarray:
        self.cpus.append(os.sched_getaffinity(0))
        return np.zeros(len(obs), np.int64)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_central_runs_each_worker_on_a_cpu_of_its_own_while_it_collects(cluster):
    mine = sorted(os.sched_getaffinity(0))
    with (
        CentralSampler(affinity_env, FirstAction(), **SIZES, pin_workers=True) as pinned,
        CentralSampler(affinity_env, FirstAction(), **SIZES, pin_workers=False) as free,
    ):
        assert pinned.worker_cpus == {0: mine[0], 1: mine[1 % len(mine)]}
        assert free.worker_cpus == {}
        for _ in range(2):
            obs = pinned.collect().obs[1:]  # the first reset came before the first collect
            for w, cpu in pinned.worker_cpus.items():
                cols = slice(w * 2, w * 2 + 2)
                assert (obs[:, cols, 0] == 1).all() and (obs[:, cols, 1] == cpu).all()
        assert (free.collect().obs[1:, :, 0] == len(mine)).all()
        # The caller chooses on the last worker's CPU (woken last), and gets its own back.
        assert pinned.agent.cpus == [{pinned.worker_cpus[1]}] * (2 * SIZES["horizon"])
        assert free.agent.cpus == [set(mine)] * SIZES["horizon"]
        assert sorted(os.sched_getaffinity(0)) == mine
    # Alternating groups step while the caller chooses: it stays free.
    with CentralSampler(
        affinity_env, FirstAction(), **SIZES, pin_workers=True, alternating=True
    ) as alternating:
        alternating.collect()
        assert alternating.worker_cpus and alternating.agent.cpus
        assert all(cpus == set(mine) for cpus in alternating.agent.cpus)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_a_workers_cpus_come_back_after_a_collect_and_a_cpu_it_may_not_use_is_ignored():
    from parl_algos.samplers._worker import _on_cpu

    mine = os.sched_getaffinity(0)
    with _on_cpu(min(mine)):
        assert os.sched_getaffinity(0) == {min(mine)}
    assert os.sched_getaffinity(0) == mine
    with _on_cpu(max(mine) + 1), _on_cpu(None):
        assert os.sched_getaffinity(0) == mine


def test_workers_are_pinned_by_default_only_where_cpus_are_scarce(monkeypatch):
    from parl_algos.samplers._central import _worker_cpus

    signals = [object(), object()]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5}, raising=False)
    assert _worker_cpus(signals, None) == {0: 4, 1: 5}  # two workers and this process, 2 CPUs
    assert _worker_cpus([None, object()], None) == {1: 4}  # only a worker on this host
    assert _worker_cpus(signals, False) == {}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert _worker_cpus(signals, None) == {}  # a CPU for each, and one left for this process
    assert _worker_cpus(signals, True) == {0: 0, 1: 1}
