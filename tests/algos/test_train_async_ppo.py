"""PPO in `parl-train`'s async mode: decoupled PPO, weighted by the ratio to the behaviour."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from parl_algos.agents import ActorCriticAgent, BehaviourPPOAgent
from parl_algos.rollout import Trajectory
from parl_algos.train import SPECS, apply_override, load_config


def build(mode: str, epochs: int = 2):
    config = load_config("ppo/cartpole")
    apply_override(config, "train.mode", mode)
    apply_override(config, "agent.update_epochs", str(epochs))
    env = gym.make(config.env.id)
    torch.manual_seed(0)
    return SPECS["PPO"].build(config, env.observation_space, env.action_space).agent


def trajectory(agent, horizon: int = 16, width: int = 4) -> Trajectory:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(horizon + 1, width, 4)).astype(np.float32)
    actions, log_probs = [], []
    for t in range(horizon):
        action, extras = agent.sample(obs[t])
        actions.append(action)
        log_probs.append(extras["log_prob"])
    return Trajectory(
        obs=obs,
        action=np.stack(actions),
        reward=np.ones((horizon, width), np.float32),
        terminated=np.zeros((horizon, width), bool),
        truncated=np.zeros((horizon, width), bool),
        final_obs=np.zeros((0, 4), np.float32),
        final_index=np.zeros((0, 2), np.int64),
        extras={"log_prob": np.stack(log_probs)},
    )


def test_async_mode_builds_the_behaviour_agent_and_the_others_the_plain_one():
    assert type(build("async")) is BehaviourPPOAgent
    assert type(build("sync")) is ActorCriticAgent
    assert "async" in SPECS["PPO"].modes and "async" not in SPECS["A2C"].modes


def test_with_the_current_policy_as_behaviour_it_learns_as_on_policy_ppo():
    behaviour, plain = build("async"), build("single")
    plain.set_weights(behaviour.get_weights())
    t = trajectory(behaviour)
    assert t.extras["log_prob"].shape == (16, 4) and np.all(t.extras["log_prob"] <= 0)
    a, b = behaviour.learn(t), plain.learn(t)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)


@pytest.mark.parametrize(("shift", "weight"), [(np.log(2.0), 0.5), (-5.0, 1.0)])
def test_a_stale_batch_is_clipped_around_the_learner_and_weighted_by_the_truncated_ratio(
    shift, weight
):
    # The behaviour policy gave each action twice the learner's probability (pi/mu = 0.5), or
    # far less (pi/mu = e^5, truncated to 1). One update of the whole batch: its loss is taken
    # at the learner's own policy, where every ratio is 1 and nothing is clipped.
    learner, on_policy = build("async", epochs=1), build("single", epochs=1)
    on_policy.set_weights(learner.get_weights())
    t = trajectory(learner)
    with torch.no_grad():
        obs = torch.as_tensor(t.obs[:-1].reshape(-1, 4))
        own = learner.alg.distribution(obs).log_prob(torch.as_tensor(t.action.reshape(-1)))
    t.extras["log_prob"] = (own.numpy() + shift).reshape(t.action.shape).astype(np.float32)
    stale, fresh = learner.learn(t), on_policy.learn(t)
    assert stale.updates == fresh.updates == 1
    assert stale.clip_fraction == fresh.clip_fraction == 0.0  # around mu: every sample clipped
    assert stale.policy_loss == pytest.approx(weight * fresh.policy_loss, rel=1e-5)
    assert stale.value_loss == fresh.value_loss


def test_side_by_side_trajectories_keep_each_columns_steps_and_advantages():
    agent = build("async")
    left, right = trajectory(agent, width=3), trajectory(agent, width=2)
    right = dataclasses.replace(
        right,
        obs=right.obs + 1.0,
        truncated=right.truncated.copy(),
        final_obs=np.full((1, 4), 7.0, np.float32),
        final_index=np.array([[5, 1]], np.int64),  # right's column 1: column 4 of the whole
    )
    right.truncated[5, 1] = True
    whole = Trajectory.concat([left, right])
    assert whole.obs.shape == (17, 5, 4) and whole.extras["log_prob"].shape == (16, 5)
    assert np.array_equal(whole.obs[:, 3:], right.obs) and whole.truncated[5, 4]
    assert whole.final_index.tolist() == [[5, 4]]
    assert np.array_equal(whole.final_obs, right.final_obs)
    # GAE of the whole is each part's, column for column (the bootstrap of a truncated step
    # from its own last observation included), to float32's rounding of a larger matmul.
    advantage = agent.advantages(whole).advantage.reshape(16, 5)
    parts = [agent.advantages(p).advantage.reshape(16, -1) for p in (left, right)]
    torch.testing.assert_close(advantage, torch.cat(parts, dim=1), rtol=1e-6, atol=1e-6)
    assert Trajectory.concat([left]) is left
    with pytest.raises(ValueError, match="different steps"):
        Trajectory.concat([left, trajectory(agent, horizon=8)])


def test_a_collect_of_two_batches_sends_the_weights_once_and_returns_both():
    from parl.samplers import SerialSampler
    from parl_algos.train._envs import SamplerCollector

    class Sender(SerialSampler):  # counts the sends of the weights
        sent = 0

        def sync_weights(self) -> None:
            self.sent += 1

    class Left:
        def sample(self, obs):
            return [0] * len(obs)

    sampler = Sender(lambda: gym.make("CartPole-v1"), Left(), 1, 3, horizon=8)
    collector = SamplerCollector(sampler, batches=2)
    first, second = collector.collect(0), collector.collect(0)
    assert first.reward.shape == second.reward.shape == (8, 6)
    assert sampler.sent == 2 and collector.env_steps == 2 * 2 * 8 * 3
    # The second batch of a collect goes on from where the first left the environments.
    assert np.array_equal(first.obs[0, 3:], first.obs[-1, :3])
    collector.close()
    with pytest.raises(ValueError, match="batches=0 must be at least 1"):
        SamplerCollector(sampler, batches=0)
