"""`parl.utils.NStepAdder`: n-step returns by hand, across terminations and truncations."""

from __future__ import annotations

import numpy as np
import pytest

from parl.utils import NStepAdder, PrioritizedReplayMemory, ReplayMemory


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


def test_a_truncation_bootstraps_full_windows_and_drops_the_shorter_ones():
    memory = ReplayMemory(100, obs_dim=1, act_dim=0)
    adder = NStepAdder(memory, n_step=3, gamma=0.5)
    _play(adder, [1.0, 2.0, 4.0, 8.0], end="truncated")
    assert adder.pending() == 0
    assert _stored(memory) == [
        (0.0, 1 + 0.5 * 2 + 0.25 * 4, 3.0, 0.0),
        (1.0, 2 + 0.5 * 4 + 0.25 * 8, 4.0, 0.0),  # bootstraps from the final observation
    ]
    # The next episode starts afresh: nothing of the truncated one leaks into its windows.
    _play(adder, [1.0, 1.0, 1.0], end="terminated", start=10)
    assert _stored(memory)[2:] == [
        (10.0, 1.75, 13.0, 1.0),
        (11.0, 1.5, 13.0, 1.0),
        (12.0, 1.0, 13.0, 1.0),
    ]


def test_episodes_shorter_than_n():
    memory = ReplayMemory(100, obs_dim=1, act_dim=0)
    adder = NStepAdder(memory, n_step=4, gamma=1.0)
    _play(adder, [1.0, 1.0], end="terminated")
    assert _stored(memory) == [(0.0, 2.0, 2.0, 1.0), (1.0, 1.0, 2.0, 1.0)]
    _play(adder, [1.0, 1.0], end="truncated", start=5)
    assert len(memory) == 2  # no full window: nothing a gamma^4 bootstrap could learn from


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
