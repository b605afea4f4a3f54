"""Evaluation in an actor of its own, so that it never stalls training (`sync` and `async` modes).

`Evaluator` holds the evaluation environment and a copy of the agent; `evaluate` loads the
weights it is sent and returns the mean return of the greedy policy over some episodes.
`RemoteEvaluator` is it as an actor whose calls return futures: the training loop sends the
latest weights when an evaluation is due and reads the result when it is ready, taking the
next one only after that (an evaluation still running when the next is due delays it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

import parl
from parl_algos.training import evaluate

__all__ = ["Evaluator", "RemoteEvaluator"]


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
        """The mean return of `episodes` episodes of the agent with `weights`.

        `seed` seeds the first reset (None: the environment goes on from the last evaluation).
        """
        self.agent.set_weights(weights)
        return evaluate(self.env, self.agent.predict, episodes, seed=seed)

    def close(self) -> None:
        """Close the environment."""
        self.env.close()


RemoteEvaluator = parl.remote_class(wait=False)(Evaluator)
"""`Evaluator` as an actor whose methods return `RemoteFuture`s."""
