"""`parl_algos.rollout`: trajectories from vector envs, truncation bootstrapping, episode counts."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from parl_algos.rollout import (
    EpisodeCounter,
    VectorCollector,
    compute_advantages,
    make_vector_env,
)


def test_collector_records_truncations_with_their_final_observation():
    # CartPole cut at 5 steps: always-left episodes last longer than that only rarely, so most
    # episodes end by truncation, and each truncated step must keep its true last observation.
    envs = make_vector_env("CartPole-v1", 3, max_episode_steps=5)
    collector = VectorCollector(envs, seed=0)
    t = collector.collect(12, lambda obs: np.zeros(len(obs), dtype=np.int64))
    assert t.obs.shape == (13, 3, 4) and t.reward.shape == (12, 3)
    assert t.truncated.any() and not (t.truncated & t.terminated).any()
    assert len(t.final_obs) == len(t.final_index) == int(t.truncated.sum())
    for (step, env), final in zip(t.final_index, t.final_obs, strict=True):
        assert t.truncated[step, env]
        # After an episode ends, the next observation is a fresh reset, not the final one.
        assert not np.array_equal(t.obs[step + 1, env], final)
    episodes = collector.pop_episodes()
    assert sum(e.length for e in episodes) == int(t.done.sum()) * 5
    assert all(e.ret == e.length for e in episodes)  # CartPole pays 1 a step
    assert collector.pop_episodes() == []
    envs.close()


def test_compute_advantages_bootstraps_truncations_from_the_final_observation():
    envs = make_vector_env("CartPole-v1", 2, max_episode_steps=3)
    collector = VectorCollector(envs, seed=1)
    t = collector.collect(7, lambda obs: np.ones(len(obs), dtype=np.int64))

    def value_fn(obs):  # a value that depends on the observation, easy to recompute
        return obs.sum(-1) * 10.0

    batch = compute_advantages(t, value_fn, gamma=0.9, gae_lambda=0.5)
    obs = torch.as_tensor(t.obs)
    values = value_fn(obs)
    next_values = values[1:].clone()
    for (step, env), final in zip(t.final_index, t.final_obs, strict=True):
        next_values[step, env] = value_fn(torch.as_tensor(final))
    reward = torch.as_tensor(t.reward)
    not_term = 1.0 - torch.as_tensor(t.terminated).float()
    not_done = 1.0 - torch.as_tensor(t.done).float()
    expected = torch.zeros(7, 2)
    running = torch.zeros(2)
    for s in reversed(range(7)):
        delta = reward[s] + 0.9 * not_term[s] * next_values[s] - values[s]
        running = delta + 0.9 * 0.5 * not_done[s] * running
        expected[s] = running
    torch.testing.assert_close(batch.advantage, expected.reshape(-1))
    torch.testing.assert_close(batch.value_target, (expected + values[:-1]).reshape(-1))
    assert batch.obs.shape == (14, 4) and batch.action.shape == (14,)
    envs.close()


def test_collector_refuses_next_step_autoreset():
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(ValueError, match="SAME_STEP"):
        VectorCollector(envs)
    envs.close()


def test_extras_are_stacked_per_step():
    envs = make_vector_env("CartPole-v1", 2)
    collector = VectorCollector(envs, seed=0)

    def act(obs):
        return np.zeros(2, dtype=np.int64), {"logits": np.ones((2, 2)), "tag": np.arange(2)}

    t = collector.collect(4, act)
    assert t.extras["logits"].shape == (4, 2, 2) and t.extras["tag"].shape == (4, 2)
    envs.close()


def test_episode_counter_for_a_single_env():
    counter = EpisodeCounter()
    assert counter.step(1.0, False) == []
    (episode,) = counter.step(2.0, True)
    assert episode == (2, 3.0, 2)
    assert counter.step(5.0, True)[0].ret == 5.0
