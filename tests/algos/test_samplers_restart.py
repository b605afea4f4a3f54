"""Samplers with `restart=True` on a real local cluster: workers killed with SIGKILL are replaced.

A worker is killed from outside (`os.kill` of its actor's pid) between collects, and from inside
(its environment kills its own process) halfway through one. The batches keep their shape and
column order, the replacement's columns start from their own seed stream, it acts with the
weights last sent, and `episodes()` reports each finished episode once. An environment that
keeps raising stops the sampler after `max_restarts` replacements, its error the cause.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import time

import gymnasium as gym
import numpy as np
import pytest

import parl
from parl.samplers import (
    AsyncSampler,
    Batch,
    CentralSampler,
    ParallelSampler,
    Replacements,
    RestartWindow,
    SamplerWorkerError,
)
from parl_remote import RemoteMethodError
from tests.algos.test_samplers import ENV_FN, LinearAgent
from tests.algos.test_samplers_remote import AtStep, KillAt, no_actors, shm_names, wait_until

SIZES = {"num_workers": 2, "envs_per_worker": 2, "horizon": 6, "seed": 3}
STRIDE = 1_000_003
KINDS = [ParallelSampler, CentralSampler, AsyncSampler]


@pytest.fixture(scope="module")
def cluster():
    client = parl.connect(cpu_num=5, log_to_driver=False)
    try:
        yield client
    finally:
        parl.disconnect()


def killing_env(column: int, at: int, meeting: str | None = None) -> gym.Env:
    """CartPole whose column first reset with seed `column` kills its process at step `at`.

    With `meeting` (a folder), a process that makes it while the folder holds `armed` waits
    for another to do so too (`meet`).
    """
    if meeting is not None:
        meet(meeting)
    return KillAt(ENV_FN(), column, at)


def meet(folder: str, timeout: float = 30.0) -> None:
    """Where `folder` holds `armed`: wait until two processes are here (`here-PID` files).

    Workers replaced at once meet as they make their environments; made one after the other,
    the first waits alone until `timeout`, and says so (`alone-PID`).
    """
    if not os.path.exists(os.path.join(folder, "armed")):
        return
    open(os.path.join(folder, f"here-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + timeout
    while sum(name.startswith("here-") for name in os.listdir(folder)) < 2:
        if time.monotonic() > deadline:
            open(os.path.join(folder, f"alone-{os.getpid()}"), "w").close()
            return
        time.sleep(0.01)


def first_obs(seed: int) -> np.ndarray:
    return ENV_FN().reset(seed=seed)[0]


class Lengths:
    """Every column's steps since its episode began, from the batches; the episodes they end."""

    def __init__(self, width: int) -> None:
        self.steps = [0] * width
        self.ended: list[int] = []

    def add(self, batch: Batch, first_column: int = 0, fresh: tuple[int, ...] = ()) -> None:
        for k in fresh:  # a replacement's column: its episode begins with this batch
            self.steps[k] = 0
        for t in range(len(batch.actions)):
            for j in range(batch.actions.shape[1]):
                k = first_column + j
                self.steps[k] += 1
                if batch.terminated[t, j] or batch.truncated[t, j]:
                    self.ended.append(self.steps[k])
                    self.steps[k] = 0


def segment_names(sampler, w: int) -> set[str]:
    return {segment.name for segment in sampler._group.segments[w] or ()}


def kill_worker(sampler, w: int) -> int:
    pid = sampler._group.where[w][0]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("kind", [ParallelSampler, CentralSampler])
def test_a_synchronous_sampler_replaces_a_killed_worker_and_keeps_its_columns(
    cluster, kind, caplog, tmp_path
):
    before = shm_names()
    wait_until(lambda: no_actors(cluster), what="a cluster without actors")
    caplog.set_level(logging.WARNING, logger="parl_algos.samplers._group")
    learner, old = LinearAgent(), LinearAgent().w
    n, seed = SIZES["envs_per_worker"], SIZES["seed"]
    # Column 3 (worker 1's second environment, first reset with seed 3 + 3) kills its own
    # process at its 9th step: halfway through the second collect.
    env_fn = functools.partial(killing_env, seed + 3, 9, str(tmp_path))
    with kind(env_fn, learner, **SIZES, restart=True) as sampler:
        lengths = Lengths(sampler.batch_size)
        first = sampler.collect()
        lengths.add(first)
        dead = sampler._group.where[1][0]
        dead_segments = segment_names(sampler, 1)
        batch = sampler.collect()  # worker 1 dies during it: its share is collected again
        assert sampler.restarts == 1 and sampler._group.where[1][0] != dead
        assert batch.obs.shape == first.obs.shape and batch.actions.shape == first.actions.shape
        np.testing.assert_array_equal(batch.obs[0, :n], first.next_obs[:n])  # worker 0 went on
        for j in range(n):  # worker 1's columns: fresh environments of their own seed stream
            np.testing.assert_array_equal(batch.obs[0, n + j], first_obs(seed + n + j + STRIDE))
        lengths.add(batch, fresh=(n, n + 1))
        # Killed from outside between collects, after the learner's weights changed.
        learner.set_weights({"w": -old})
        sampler.sync_weights()
        kill_worker(sampler, 1)
        dead_segments |= segment_names(sampler, 1)
        batch = sampler.collect()
        lengths.add(batch, fresh=(n, n + 1))
        assert sampler.restarts == 2
        for j in range(n):
            np.testing.assert_array_equal(batch.obs[0, n + j], first_obs(seed + n + j + 2 * STRIDE))
        scores = (batch.obs[..., None] * -old).sum(axis=2)  # every column acts on the new weights
        np.testing.assert_array_equal(batch.actions, scores.argmax(axis=-1))
        # Both workers killed between collects: both replaced at once (the new processes meet
        # as they make their environments), each its own next seed stream, and the batch
        # keeps its shape and column order.
        dead_segments |= segment_names(sampler, 0) | segment_names(sampler, 1)
        open(tmp_path / "armed", "w").close()
        kill_worker(sampler, 0)
        kill_worker(sampler, 1)
        batch = sampler.collect()
        os.remove(tmp_path / "armed")
        assert not list(tmp_path.glob("alone-*")) and len(list(tmp_path.glob("here-*"))) == 2
        lengths.add(batch, fresh=tuple(range(2 * n)))
        assert sampler.restarts == 4 and batch.obs.shape == first.obs.shape
        for j in range(n):
            np.testing.assert_array_equal(batch.obs[0, j], first_obs(seed + j + STRIDE))
            np.testing.assert_array_equal(batch.obs[0, n + j], first_obs(seed + n + j + 3 * STRIDE))
        scores = (batch.obs[..., None] * -old).sum(axis=2)
        np.testing.assert_array_equal(batch.actions, scores.argmax(axis=-1))
        for _ in range(2):
            lengths.add(sampler.collect())
        episodes = sampler.episodes()
        # Each finished episode once, none of the dead worker's half episodes.
        assert sorted(e.length for e in episodes) == sorted(lengths.ended)
        assert len(dead_segments) == 4 * sampler._slots
        assert not dead_segments & shm_names()  # the dead workers' segments are freed
        assert segment_names(sampler, 1) <= shm_names()
    lines = [r.getMessage() for r in caplog.records if "replaced in" in r.getMessage()]
    assert len(lines) == 4 and all("SIGKILL" in line for line in lines[1:])
    assert all(f"{kind.__name__}: worker 1 (pid " in line for line in lines[:2])
    assert sorted(line.split(" (pid ")[0] for line in lines[2:]) == [
        f"{kind.__name__}: worker {w}" for w in (0, 1)
    ]
    assert f"(pid {dead} on " in lines[0] and "died: " in lines[0]
    assert shm_names() == before
    wait_until(lambda: no_actors(cluster), what="every slot to be free again")


def test_async_replaces_a_killed_worker_and_drops_its_batches(cluster):
    before = shm_names()
    wait_until(lambda: no_actors(cluster), what="a cluster without actors")
    learner, old = LinearAgent(), LinearAgent().w
    n, seed = SIZES["envs_per_worker"], SIZES["seed"]
    with AsyncSampler(ENV_FN, learner, **SIZES, restart=True) as sampler:
        lengths = Lengths(sampler.num_workers * n)
        seen = {0: 0, 1: 0}
        while min(seen.values()) < 2:  # bounded: the batches come from either worker
            assert sum(seen.values()) < 100, seen
            batch = sampler.collect()
            lengths.add(batch, batch.worker * n)
            seen[batch.worker] += 1
        learner.set_weights({"w": -old})
        sampler.sync_weights()
        kill_worker(sampler, 1)
        # The death is seen, and worker 1 replaced, by its waiter: no batch is asked meanwhile.
        wait_until(lambda: sampler.restarts == 1, 60, what="worker 1 replaced without a collect")
        replaced = None
        for _ in range(200):  # until the new worker 1's first batch
            batch = sampler.collect()
            fresh = ()
            if batch.worker == 1 and sampler.restarts == 1 and replaced is None:
                fresh = (n, n + 1)
                replaced = batch
            lengths.add(batch, batch.worker * n, fresh)
            if replaced is not None:
                break
        assert replaced is not None and sampler.restarts == 1
        assert replaced.obs.shape == (SIZES["horizon"], n, 4)
        assert replaced.weights_version == 1
        for j in range(n):
            np.testing.assert_array_equal(replaced.obs[0, j], first_obs(seed + n + j + STRIDE))
        scores = (replaced.obs[..., None] * -old).sum(axis=2)
        np.testing.assert_array_equal(replaced.actions, scores.argmax(axis=-1))
        assert sorted(e.length for e in sampler.episodes()) == sorted(lengths.ended)
    assert shm_names() == before
    wait_until(lambda: no_actors(cluster), what="every slot to be free again")


class AlwaysFail(AtStep):
    """Raises at step `at` of the column first reset with seed `column`, whatever its stream."""

    def reset(self, *, seed=None, options=None):
        if self.first_seed is None and seed is not None:
            self.first_seed = seed % STRIDE
        return gym.Wrapper.reset(self, seed=seed, options=options)

    def hit(self) -> None:
        raise ValueError(f"column {self.column} failed at step {self.at}")


def always_failing_env(column: int, at: int) -> gym.Env:
    return AlwaysFail(ENV_FN(), column, at)


@pytest.mark.parametrize("kind", KINDS)
def test_an_environment_that_keeps_raising_stops_after_max_restarts_with_its_error(cluster, kind):
    before = shm_names()
    wait_until(lambda: no_actors(cluster), what="a cluster without actors")
    env_fn = functools.partial(always_failing_env, SIZES["seed"] + 2, 3)  # worker 1's first
    with kind(env_fn, LinearAgent(), **SIZES, restart=True, max_restarts=2) as sampler:
        with pytest.raises(
            SamplerWorkerError, match=r"worker 1's environment failed 3 times"
        ) as excinfo:
            # AsyncSampler's batches of worker 0 come meanwhile, as many as worker 1's
            # replacements take to start: bounded by time, not by a count of batches
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                sampler.collect()
        cause = excinfo.value.__cause__
        assert isinstance(cause, parl.RemoteError) and isinstance(cause, ValueError)
        assert f"column {SIZES['seed'] + 2} failed at step 3" in str(cause)
        notes = "\n".join(getattr(cause, "__notes__", []))
        assert "remote traceback" in notes and "in hit" in notes  # the environment's own
        assert sampler.restarts == 2
        with pytest.raises(RuntimeError, match="closed"):
            sampler.collect()
    assert shm_names() == before
    wait_until(lambda: no_actors(cluster), what="every slot to be free again")


@pytest.mark.parametrize("bad", [{"max_restarts": -1}, {"restart_timeout": 0}])
def test_restart_arguments_are_checked(cluster, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES, restart=True, **bad)


def test_a_restart_window_allows_max_restarts_within_it_and_forgets_older_ones(monkeypatch):
    from parl_algos.samplers import _group

    now = [1000.0]
    monkeypatch.setattr(_group.time, "monotonic", lambda: now[0])
    window = RestartWindow(max_restarts=2, window_s=600.0)
    assert window.failed() and window.failed()  # two replacements
    assert not window.failed() and window.failures == 3  # the third failure stops
    now[0] += 599.0
    assert not window.failed()  # both still within the window
    now[0] += 2.0  # the first two are older than the window now
    assert window.failed() and window.failures == 1
    assert RestartWindow(max_restarts=0).failed() is False  # no replacement at all


def test_replacements_count_each_actor_log_one_line_each_and_stop_past_max_restarts(caplog):
    died = parl.RemoteActorDiedError(
        "EnvWorker actor A (pid 41 on h) died: its process was killed by SIGKILL. This call did "
        "not complete"
    )
    again = parl.RemoteActorDiedError("EnvWorker actor B (pid 42 on h) died: it exited. This call")
    replacements = Replacements("R2D2: actor {i}", 2, setting="train.max_restarts")

    def no_slot(r: int) -> str:
        raise OSError("no slot")

    with pytest.raises(OSError):  # the replacement failed: none is counted
        replacements.replace(0, died, no_slot)
    assert (replacements.total, replacements.count(0)) == (0, 0)
    made: list[int] = []

    def dies_once(r: int) -> str:  # the first replacement dies as it starts
        made.append(r)
        if len(made) == 1:
            raise again
        return f"actor {r}"

    with caplog.at_level(logging.WARNING, logger="parl_algos.samplers._group"):
        assert replacements.replace(1, died, dies_once) == "actor 1"
    assert made == [1, 1]  # made again, with the same seed stream
    assert (replacements.total, replacements.count(1), replacements.count(0)) == (1, 1, 0)
    first, line = (record.getMessage() for record in caplog.records)
    assert first.startswith("R2D2: actor 1's replacement failed as it started (it exited)")
    # the line names the actor that died last: the failed replacement
    assert line.startswith("R2D2: actor 1 (pid 42 on h) died: it exited; replaced in "), line
    past = pytest.raises(parl.RemoteActorDiedError, match=r"actor 1 died 3 times within 600 s ")
    with past:  # two deaths counted already: the death and the failed start
        replacements.replace(1, died, lambda r: pytest.fail("past max_restarts nothing is made"))
    assert replacements.replace(0, died, str) == "1"  # its failed replacement was counted

    def broken(r: int) -> str:  # its environment raises as it is made
        raise RemoteMethodError("ValueError: env broke")

    past = pytest.raises(
        parl.RemoteActorDiedError, match="actor 2 failed 3 times .* RemoteMethodError: .*broke"
    )
    with past as excinfo:  # one that keeps failing as it starts: its own error, named
        replacements.replace(2, died, broken)
    assert isinstance(excinfo.value.__cause__, RemoteMethodError)
    assert replacements.total == 2


def dies_once_made(armed: str, mark: str) -> gym.Env:
    """CartPole, but the first one made once `armed` exists kills its process (makes `mark`)."""
    if os.path.exists(armed):
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return gym.make("CartPole-v1")


@pytest.mark.slow  # two actors killed and made again: the default suite's budget is spent
def test_a_replacement_killed_as_it_starts_is_made_again(cluster, tmp_path, caplog):
    wait_until(lambda: no_actors(cluster), what="a cluster without actors")
    caplog.set_level(logging.WARNING, logger="parl_algos.samplers._group")
    armed, mark = str(tmp_path / "armed"), str(tmp_path / "killed")
    env_fn = functools.partial(dies_once_made, armed, mark)
    with ParallelSampler(env_fn, LinearAgent(), **SIZES, restart=True) as sampler:
        first = sampler.collect()
        open(armed, "w").close()  # the next worker made dies making its environments
        killed = kill_worker(sampler, 1)
        batch = sampler.collect()
        assert os.path.exists(mark)  # the first replacement died as it started
        assert sampler.restarts == 1  # replacements made: the second one
        assert batch.obs.shape == first.obs.shape
        for j in range(SIZES["envs_per_worker"]):  # the first stream: the one that died
            column = SIZES["envs_per_worker"] + j  # made no environment of it
            expected = first_obs(SIZES["seed"] + column + STRIDE)
            np.testing.assert_array_equal(batch.obs[0, column], expected)
    lines = [r.getMessage() for r in caplog.records]
    assert any("worker 1's replacement failed as it started (" in line for line in lines), lines
    [line] = [line for line in lines if "; replaced in" in line]
    pid = int(re.search(r"worker 1 \(pid (\d+) on", line).group(1))
    assert pid != killed, line  # the line names the one that died last: the replacement
    # A worker killed while the sampler is first made is replaced too.
    os.remove(mark)
    caplog.clear()
    with ParallelSampler(env_fn, LinearAgent(), **SIZES, restart=True) as sampler:
        assert os.path.exists(mark) and sampler.restarts == 1
        assert sampler.collect().obs.shape == first.obs.shape
    assert sum("; replaced in" in r.getMessage() for r in caplog.records) == 1
    wait_until(lambda: no_actors(cluster), what="every slot to be free again")
