"""`parl.utils.NStepAdder`: n-step returns and discounts by hand, across episode ends."""

from __future__ import annotations

import numpy as np
import pytest

from parl.utils import (
    NStepAdder,
    NStepBatch,
    PrioritizedNStepBatch,
    PrioritizedReplayMemory,
    ReplayMemory,
)


def _stored(memory: ReplayMemory) -> list[tuple[float, float, float, float]]:
    """`(obs, reward, next_obs, terminal)` of every stored transition, in order."""
    n = len(memory)
    return [
        (
            float(memory.obs[i, 0]),
            round(float(memory.reward[i]), 6),
            float(memory.next_obs[i, 0]),
            float(memory.terminal[i]),
        )
        for i in range(n)
    ]


def _play(adder, rewards, end: str, start: int = 0) -> None:
    """One episode of `len(rewards)` steps, observations start, start + 1, ...; `end` says how."""
    for t, r in enumerate(rewards):
        last = t == len(rewards) - 1
        adder.append(
            [start + t],
            0,
            r,
            [start + t + 1],
            last and end == "terminated",
            truncated=last and end == "truncated",
        )


def test_returns_inside_an_episode_and_at_a_termination():
    memory = ReplayMemory(100, obs_dim=1, act_dim=0)
    adder = NStepAdder(memory, n_step=3, gamma=0.5)
    _play(adder, [1.0, 2.0, 4.0, 8.0, 16.0], end="terminated")
    assert adder.pending() == 0
    assert _stored(memory) == [
        (0.0, 1 + 0.5 * 2 + 0.25 * 4, 3.0, 0.0),  # full windows bootstrap from s_{t+3}
        (1.0, 2 + 0.5 * 4 + 0.25 * 8, 4.0, 0.0),
        (2.0, 4 + 0.5 * 8 + 0.25 * 16, 5.0, 1.0),  # the window that reaches the end: terminal
        (3.0, 8 + 0.5 * 16, 5.0, 1.0),  # shorter windows after it: the rest of the return
        (4.0, 16.0, 5.0, 1.0),
    ]


def _discounts(memory: ReplayMemory) -> list[float]:
    assert memory.discount is not None
    return [round(float(d), 6) for d in memory.discount[: len(memory)]]


def test_a_truncation_bootstraps_every_window_from_the_final_observation():
    memory = ReplayMemory(100, obs_dim=1, act_dim=0)
    adder = NStepAdder(memory, n_step=3, gamma=0.5)
    _play(adder, [1.0, 2.0, 4.0, 8.0], end="truncated")
    assert adder.pending() == 0
    assert _stored(memory) == [
        (0.0, 1 + 0.5 * 2 + 0.25 * 4, 3.0, 0.0),
        (1.0, 2 + 0.5 * 4 + 0.25 * 8, 4.0, 0.0),  # bootstraps from the final observation
        (2.0, 4 + 0.5 * 8, 4.0, 0.0),  # the last n - 1 steps: shorter windows, from it too
        (3.0, 8.0, 4.0, 0.0),
    ]
    # ... each discounted by gamma to the steps it spans: 3, 3, 2, 1.
    assert _discounts(memory) == [0.125, 0.125, 0.25, 0.5]
    # The next episode starts afresh: nothing of the truncated one leaks into its windows.
    _play(adder, [1.0, 1.0, 1.0], end="terminated", start=10)
    assert _stored(memory)[4:] == [
        (10.0, 1.75, 13.0, 1.0),
        (11.0, 1.5, 13.0, 1.0),
        (12.0, 1.0, 13.0, 1.0),
    ]
    assert _discounts(memory)[4:] == [0.125, 0.25, 0.5]


def test_episodes_shorter_than_n():
    memory = ReplayMemory(100, obs_dim=1, act_dim=0)
    adder = NStepAdder(memory, n_step=4, gamma=1.0)
    _play(adder, [1.0, 1.0], end="terminated")
    assert _stored(memory) == [(0.0, 2.0, 2.0, 1.0), (1.0, 1.0, 2.0, 1.0)]
    adder = NStepAdder(memory, n_step=4, gamma=0.9)
    _play(adder, [1.0, 1.0], end="truncated", start=5)
    assert _stored(memory)[2:] == [(5.0, 1.9, 7.0, 0.0), (6.0, 1.0, 7.0, 0.0)]
    assert _discounts(memory)[2:] == [0.81, 0.9]


def test_the_discounts_reach_the_batches_and_survive_save_and_load(tmp_path):
    for memory in (
        ReplayMemory(8, obs_dim=1, act_dim=0, seed=0),
        PrioritizedReplayMemory(8, obs_dim=1, act_dim=0, seed=0),
    ):
        _play(NStepAdder(memory, n_step=2, gamma=0.5), [1.0, 1.0, 1.0], end="truncated")
        batch = memory.sample_batch(64)
        assert type(batch) is (
            NStepBatch if type(memory) is ReplayMemory else PrioritizedNStepBatch
        )
        obs = batch.obs[:, 0].astype(int)  # obs 0 and 1 span 2 steps, obs 2 the last one
        np.testing.assert_allclose(batch.discount, np.where(obs == 2, 0.5, 0.25))
        memory.save(tmp_path / "memory")
        restored = type(memory)(8, obs_dim=1, act_dim=0)
        restored.load(tmp_path / "memory.npz")
        assert _discounts(restored) == [0.25, 0.25, 0.5]
    plain = ReplayMemory(8, obs_dim=1, act_dim=0)
    plain.append([0.0], 0, 1.0, [1.0], False)
    assert plain.discount is None and plain.sample_batch(2).discount is None
    with pytest.raises(ValueError, match="holds no discounts; got discount=0.5"):
        plain.append([0.0], 0, 1.0, [1.0], False, discount=0.5)
    with pytest.raises(
        ValueError, match="holds a discount for every transition; got discount=None"
    ):
        memory.append([0.0], 0, 1.0, [1.0], False)


def test_one_step_stores_every_step_as_it_comes():
    memory = ReplayMemory(100, obs_dim=1, act_dim=0)
    adder = NStepAdder(memory, n_step=1, gamma=0.9)
    _play(adder, [1.0, 2.0], end="truncated")
    assert _stored(memory) == [(0.0, 1.0, 1.0, 0.0), (1.0, 2.0, 2.0, 0.0)]


def test_the_adder_stands_where_a_memory_is_expected():
    memory = PrioritizedReplayMemory(16, obs_dim=1, act_dim=0, seed=0)
    adder = NStepAdder(memory, n_step=2, gamma=0.9)
    _play(adder, [1.0] * 6, end="terminated")
    assert len(adder) == len(memory) == 6
    batch = adder.sample_batch(4)
    adder.update_priorities(batch.indices, np.ones(4))
    obs = np.zeros(1)
    adder.append(obs, 0, 1.0, obs, False)
    obs += 1  # the caller's array may change after the call: the window kept a copy
    adder.append(obs, 0, 1.0, obs, True)
    assert memory.obs[6, 0] == 0.0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_step=0 must be at least 1"):
        NStepAdder(ReplayMemory(4, 1, 0), n_step=0, gamma=0.9)
    with pytest.raises(ValueError, match="gamma=1.5 must be in"):
        NStepAdder(ReplayMemory(4, 1, 0), n_step=2, gamma=1.5)
