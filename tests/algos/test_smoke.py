"""Every algorithm of the zoo runs a few hundred steps on a real gymnasium task.

Checked for each: the statistics are finite, the weights move, the shapes agree, and a checkpoint
written by `Agent.save` restores the whole algorithm state (models, targets, optimizers, extra
tensors) into a fresh agent.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import parl
from parl.algorithms import (
    A2C,
    A3C,
    C51,
    CQL,
    DDPG,
    DDQN,
    DQN,
    GA3C,
    IMPALA,
    IQL,
    PPO,
    QRDQN,
    SAC,
    TD3,
    DuelingDQN,
    PolicyGradient,
    Rainbow,
)
from parl.utils import NStepAdder, OfflineDataset, PrioritizedReplayMemory, ReplayMemory
from parl_algos.agents import ActorCriticAgent, ContinuousAgent, DQNAgent, IMPALAAgent
from parl_algos.nets import ActorCriticMLP, ContinuousActorCriticMLP, QNetwork, ValueMLP
from parl_algos.rollout import VectorCollector, make_rescaled_env, make_vector_env
from tests.algos.models import QNet


def _off_policy(agent, env, memory, steps: int, learning_starts: int, batch_size: int = 32):
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    stats = []
    for step in range(steps):
        action = env.action_space.sample() if step < learning_starts else agent.sample(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        memory.append(obs, action, reward, next_obs, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else next_obs
        if step >= learning_starts:
            stats.append(agent.learn(memory, batch_size))
    return stats


def _dqn(prioritized: bool, make_alg=lambda: DQN(QNet(4, 2), lr=1e-3), n_step: int = 1):
    def build():
        return DQNAgent(make_alg(), 2, eps_decay_steps=100, seed=0)

    def train(agent):
        env = gym.make("CartPole-v1")
        memory_cls = PrioritizedReplayMemory if prioritized else ReplayMemory
        memory = memory_cls(1000, 4, 0, seed=0)
        if n_step > 1:
            memory = NStepAdder(memory, n_step, agent.alg.gamma)
        stats = _off_policy(agent, env, memory, steps=300, learning_starts=100)
        agent.alg.sync_target()
        assert isinstance(agent.predict(env.reset()[0]), int)
        assert stats[-1].td_error.shape == (32,)
        if prioritized:
            assert memory.priorities().std() > 0  # priorities were written back
        return stats

    return build, train


def _continuous(cls, **model_kwargs):
    def build():
        return ContinuousAgent(cls(ContinuousActorCriticMLP(3, 1, (32, 32), **model_kwargs)))

    def train(agent):
        env = make_rescaled_env("Pendulum-v1")
        memory = ReplayMemory(1000, 3, 1, seed=0)
        stats = _off_policy(agent, env, memory, steps=250, learning_starts=50)
        action = agent.predict(env.reset()[0])
        assert action.shape == (1,) and np.all(np.abs(action) <= 1.0)
        return stats

    return build, train


def _offline(make_algorithm):
    def build():
        return ContinuousAgent(make_algorithm())

    def train(agent):
        env = make_rescaled_env("Pendulum-v1")
        memory = ReplayMemory(1000, 3, 1, seed=0)
        _off_policy(agent, env, memory, steps=300, learning_starts=300)  # random actions
        dataset = OfflineDataset.from_replay_memory(memory, seed=0)
        stats = [agent.learn(dataset, 32) for _ in range(50)]
        action = agent.predict(env.reset()[0])
        assert action.shape == (1,) and np.all(np.abs(action) <= 1.0)
        return stats

    return build, train


def _stochastic_mlp():
    return ContinuousActorCriticMLP(3, 1, (32, 32), stochastic=True, twin=True)


def _on_policy(cls, **kwargs):
    def build():
        return ActorCriticAgent(cls(ActorCriticMLP(4, 2), **kwargs), gamma=0.99, gae_lambda=0.95)

    def train(agent):
        envs = make_vector_env("CartPole-v1", 4)
        collector = VectorCollector(envs, seed=0)
        stats = []
        for _ in range(5):
            trajectory = collector.collect(16, agent.sample)
            assert trajectory.obs.shape == (17, 4, 4) and trajectory.action.shape == (16, 4)
            stats.append(agent.learn(trajectory))
        assert collector.env_steps == 5 * 16 * 4
        assert isinstance(agent.predict(trajectory.obs[0, 0]), int)
        envs.close()
        return stats

    return build, train


class _LearnerAgent(parl.Agent):
    """Holds an algorithm for saving and restoring; acting happens elsewhere."""


def _impala():
    def build():
        return IMPALAAgent(IMPALA(ActorCriticMLP(4, 2), lr=1e-3))

    def train(learner):
        actor = IMPALAAgent(IMPALA(copy.deepcopy(learner.alg.model)))  # one update behind
        envs = make_vector_env("CartPole-v1", 4)
        collector = VectorCollector(envs, seed=0)
        stats = []
        for _ in range(6):
            t = collector.collect(20, actor.sample)
            assert t.extras["logits"].shape == (20, 4, 2) and t.action.shape == (20, 4)
            # The logits kept are the behaviour policy's own, for the actions it took.
            obs = torch.as_tensor(t.obs[:-1].reshape(-1, 4))
            expected = actor.alg.model.policy(obs).detach().numpy().reshape(20, 4, 2)
            np.testing.assert_allclose(t.extras["logits"], expected, rtol=1e-5, atol=1e-6)
            actor.set_weights(learner.get_weights())  # weights arrive after the batch
            stats.append(learner.learn(t))
        envs.close()
        assert any(abs(s.mean_rho - 1.0) > 1e-6 for s in stats[1:])  # off-policy after updates
        assert isinstance(learner.predict(t.obs[0, 0]), int)
        return stats

    return build, train


class _PGModel(parl.Model):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, obs):
        return torch.softmax(self.fc(obs), dim=-1)


def _policy_gradient():
    def build():
        return _LearnerAgent(PolicyGradient(_PGModel(), lr=1e-2))

    def train(agent):
        alg, env, stats = agent.alg, gym.make("CartPole-v1"), []
        obs, _ = env.reset(seed=0)
        for _ in range(10):
            obs_list, actions, rewards, done = [], [], [], False
            while not done:
                action = int(alg.sample(torch.as_tensor(obs).unsqueeze(0))[0])
                obs_list.append(obs)
                actions.append(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                rewards.append(reward)
                done = terminated or truncated
            obs, _ = env.reset()
            returns = torch.as_tensor(np.cumsum(rewards[::-1])[::-1].copy(), dtype=torch.float32)
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
            stats.append(
                alg.learn(torch.as_tensor(np.array(obs_list)), torch.tensor(actions), returns)
            )
        return stats

    return build, train


CASES = {
    "DQN": lambda: _dqn(prioritized=False),
    "DQN-prioritized": lambda: _dqn(prioritized=True),
    "DDQN": lambda: _dqn(False, lambda: DDQN(QNetwork(4, 2, (32,)), lr=1e-3)),
    "DuelingDQN": lambda: _dqn(False, lambda: DuelingDQN(QNetwork(4, 2, (32,), dueling=True))),
    "C51": lambda: _dqn(False, lambda: C51(QNetwork(4, 2, (32,), n_atoms=11), n_atoms=11)),
    "QRDQN": lambda: _dqn(True, lambda: QRDQN(QNetwork(4, 2, (32,), n_atoms=8), n_atoms=8)),
    "Rainbow": lambda: _dqn(
        True,
        lambda: Rainbow(
            QNetwork(4, 2, (32,), dueling=True, noisy=True, n_atoms=11), lr=1e-3, n_atoms=11
        ),
        n_step=3,
    ),
    "A2C": lambda: _on_policy(A2C, lr=1e-3),
    "PPO-clip": lambda: _on_policy(PPO, minibatch_size=32, update_epochs=2, clip_value=0.2),
    "PPO-kl": lambda: _on_policy(PPO, variant="kl", minibatch_size=32, update_epochs=2),
    "IMPALA": _impala,
    "A3C": lambda: _on_policy(A3C, lr=1e-3),  # learn() computes and applies its own gradient
    "GA3C": lambda: _on_policy(GA3C, lr=1e-3),
    "DDPG": lambda: _continuous(DDPG),
    "TD3": lambda: _continuous(TD3, twin=True),
    "SAC": lambda: _continuous(SAC, stochastic=True, twin=True),
    "PolicyGradient": _policy_gradient,
    "CQL": lambda: _offline(lambda: CQL(_stochastic_mlp())),
    "CQL-Lagrange": lambda: _offline(lambda: CQL(_stochastic_mlp(), target_action_gap=1.0)),
    "IQL": lambda: _offline(lambda: IQL(_stochastic_mlp(), ValueMLP(3, (32, 32)))),
}


def _flatten(state, prefix=""):
    """Yield (key, tensor-or-value) pairs of a nested state dict."""
    if isinstance(state, dict):
        for key, value in state.items():
            yield from _flatten(value, f"{prefix}/{key}")
    elif isinstance(state, list | tuple):
        for i, value in enumerate(state):
            yield from _flatten(value, f"{prefix}/{i}")
    else:
        yield prefix, state


@pytest.mark.parametrize("name", list(CASES))
def test_runs_learns_and_round_trips_a_checkpoint(name, tmp_path):
    torch.manual_seed(0)
    build, train = CASES[name]()
    agent = build()
    initial = {k: v.copy() for k, v in agent.alg.get_weights().items()}
    stats = train(agent)

    assert stats, "the case produced no learn() statistics"
    for s in stats:
        assert dataclasses.is_dataclass(s)
        for field in dataclasses.fields(s):
            value = getattr(s, field.name)
            if isinstance(value, float):
                assert math.isfinite(value), f"{name}: {field.name}={value}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(stats[-1], dataclasses.fields(stats[-1])[0].name, 0.0)
    after = agent.alg.get_weights()
    changed = [k for k in initial if not np.array_equal(initial[k], after[k])]
    assert changed, f"{name}: no weight changed"

    path = tmp_path / "agent.ckpt"
    agent.save(path)
    fresh = build()
    fresh.restore(path)
    saved = dict(_flatten(agent.alg.state_dict()))
    restored = dict(_flatten(fresh.alg.state_dict()))
    assert saved.keys() == restored.keys()
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(restored[key], value, rtol=0, atol=0, msg=key)
        else:
            assert restored[key] == value, key
    np.testing.assert_equal(fresh.alg.get_weights(), after)
