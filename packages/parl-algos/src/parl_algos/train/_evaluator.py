"""Evaluation in an actor of its own, so that it never stalls training (`sync` and `async` modes).

`Evaluator` holds the evaluation environment and a copy of the agent; `evaluate` loads the
weights it is sent and returns the mean return of the greedy policy over some episodes.
`RemoteEvaluator` is it as an actor whose calls return futures: the training loop sends the
latest weights when an evaluation is due and reads the result when it is ready, taking the
next one only after that (an evaluation still running when the next is due delays it).
`EpsilonGreedy` is the agent to evaluate when the greedy policy is not what is evaluated (the
Atari protocol's epsilon 0.05), in an evaluator or in the learner's process alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import parl
from parl_algos.training import evaluate

__all__ = ["EpsilonGreedy", "Evaluator", "RemoteEvaluator"]


class EpsilonGreedy:
    """An agent's greedy policy with a uniformly random action at rate `epsilon`.

    What the Atari papers evaluate (Mnih et al. 2015: epsilon 0.05), so that a greedy policy
    that stands still does not play an episode out to its time limit. Weights go to the agent.

    Args:
        agent: has `predict(obs)` (the greedy action) and `set_weights(weights)`.
        n_actions: the number of discrete actions.
        epsilon: the rate of random actions.
        seed: seed of its own generator (the agent's exploration is not touched).
    """

    def __init__(self, agent: Any, n_actions: int, epsilon: float, *, seed: int | None) -> None:
        self.agent = agent
        self.n_actions = n_actions
        self.epsilon = epsilon
        self.rng = np.random.default_rng(seed)

    def predict(self, obs: Any) -> int:
        """A random action with probability `epsilon`, else the agent's greedy one."""
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.n_actions))
        return int(self.agent.predict(obs))

    def set_weights(self, weights: Any) -> None:
        """Load weights into the agent."""
        self.agent.set_weights(weights)


class Evaluator:
    """The evaluation environment and a copy of the agent, in an actor of the cluster.

    Args:
        env_fn: a picklable zero-argument callable returning the evaluation environment.
        agent: a picklable agent with `predict(obs)` and `set_weights(weights)`.
    """

    def __init__(self, env_fn: Callable[[], gym.Env], agent: Any) -> None:
        torch.set_num_threads(1)  # one slot, one core
        self.env = env_fn()
        self.agent = agent

    def evaluate(self, weights: Any, episodes: int, seed: int | None) -> float:
        """The mean return of `episodes` episodes of the agent's `predict` with `weights`.

        `seed` seeds the first reset (None: the environment goes on from the last evaluation).
        """
        self.agent.set_weights(weights)
        return evaluate(self.env, self.agent.predict, episodes, seed=seed)

    def close(self) -> None:
        """Close the environment."""
        self.env.close()


RemoteEvaluator = parl.remote_class(wait=False)(Evaluator)
"""`Evaluator` as an actor whose methods return `RemoteFuture`s."""
