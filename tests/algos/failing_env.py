"""An environment that breaks after some steps, for the tests of `parl-train`'s failure lines.

`FailsAfter-v0` is CartPole whose every copy raises `RuntimeError` at its `fail_at`-th step
(`PARL_TEST_FAIL_AT`, default 300): a fault of a user's environment, in this process (single
mode) or in an actor (sync mode). Configs name it `tests.algos.failing_env:FailsAfter-v0`, so
that gymnasium imports this module wherever the environment is made. `KilledOnce-v0` is
CartPole whose actor's process is killed with SIGKILL once a run: a machine fault.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["FailsAfter", "KilledOnce"]


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


class KilledOnce(CartPoleEnv):
    """CartPole whose process kills itself with SIGKILL at a copy's `kill_at`-th step, once a run.

    Only in an actor (a process whose parent is not `PARL_TEST_SPARE_PARENT`, the test that
    started the run), and only in an evaluator's evaluation where `PARL_TEST_KILL_IN` is
    `evaluator`; the first copy to get there makes `PARL_TEST_KILL_MARK` (a file) and dies,
    every later copy (the replacement's among them) goes on.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kill_at = int(os.environ.get("PARL_TEST_KILL_AT", "100"))
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps >= self.kill_at and self._mine():
            try:
                os.close(os.open(os.environ["PARL_TEST_KILL_MARK"], os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)

    def _mine(self) -> bool:
        if str(os.getppid()) == os.environ.get("PARL_TEST_SPARE_PARENT"):
            return False  # the learner's process
        if os.environ.get("PARL_TEST_KILL_IN") != "evaluator":
            return True
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code.co_name == "evaluate" and frame.f_code.co_filename.endswith(
                "_evaluator.py"
            ):
                return True
            frame = frame.f_back
        return False


gym.register("KilledOnce-v0", entry_point=KilledOnce, max_episode_steps=500)
