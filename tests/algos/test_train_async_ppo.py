"""PPO in `parl-train`'s async mode: the ratio is taken against the behaviour policy's log-probs."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import torch

from parl_algos.agents import ActorCriticAgent
from parl_algos.rollout import Trajectory
from parl_algos.train import SPECS, apply_override, load_config
from parl_algos.train._algorithms import BehaviourPPOAgent


def build(mode: str):
    config = load_config("ppo/cartpole")
    apply_override(config, "train.mode", mode)
    apply_override(config, "agent.update_epochs", "2")
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


def test_the_ratio_to_a_stale_behaviour_policy_is_clipped():
    behaviour = build("async")
    t = trajectory(behaviour)
    learner, on_policy = build("async"), build("single")
    with torch.no_grad():  # the learner has moved on since the copy collected
        for p in learner.alg.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    on_policy.set_weights(learner.get_weights())
    stale, fresh = learner.learn(t), on_policy.learn(t)
    assert stale.clip_fraction > fresh.clip_fraction
