"""An environment that breaks after some steps, for the tests of `parl-train`'s failure lines.

`FailsAfter-v0` is CartPole whose every copy raises `RuntimeError` at its `fail_at`-th step
(`PARL_TEST_FAIL_AT`, default 300): a fault of a user's environment, in this process (single
mode) or in an actor (sync mode). Configs name it `tests.algos.failing_env:FailsAfter-v0`, so
that gymnasium imports this module wherever the environment is made.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["FailsAfter"]


class FailsAfter(CartPoleEnv):
    """CartPole that raises `RuntimeError` at its `fail_at`-th step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_at = int(os.environ.get("PARL_TEST_FAIL_AT", "300"))
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps >= self.fail_at:
            raise RuntimeError(f"the environment broke at its step {self.steps}")
        return super().step(action)


gym.register("FailsAfter-v0", entry_point=FailsAfter, max_episode_steps=500)
