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
