"""`parl.utils.NStepAdder`: single environment steps in, n-step transitions into a memory.

Multi-step learning (Sutton 1988; Rainbow, Hessel et al. 2018, https://arxiv.org/abs/1710.02298)
regresses `Q(s_t, a_t)` on `R_t^(n) + gamma^n * max_a Q(s_{t+n}, a)` with
`R_t^(n) = sum_{k<n} gamma^k r_{t+k}`. The adder keeps the last `n` steps of the running
episode and writes `(s_t, a_t, R_t^(n), s_{t+n}, terminal)` into any replay memory, with the
bootstrap's discount `gamma^k` of each transition, `k` the steps it spans; the memory's
sampling and priorities stay as they are, and its batches carry the discount for the learner's
target `R + gamma^k (1 - terminal) max_a Q(s', a)`. Episode ends are where the two kinds of end
differ:

- termination: every step still in the window gets the rest of the episode's return and
  `terminal=True` (no bootstrap), however fewer than `n` steps it spans;
- truncation (a time limit): every step still in the window gets the rest of the episode's
  rewards and bootstraps from the final observation, the true last one, discounted by
  `gamma^k` for the `k < n` steps it spans (the last full window's `k` is `n`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

__all__ = ["NStepAdder"]


class NStepAdder:
    """Folds the steps of one environment into n-step transitions and appends them to `memory`.

    Call `append` with every step, in order, with the step's `terminal` (the MDP ended) and
    `truncated` (a time limit cut it) flags. Everything else (`sample_batch`,
    `update_priorities`, `len`, `save`) goes to the memory, so the adder can stand where a
    memory is expected. With `n_step=1` it stores every step as it comes. Every transition it
    writes carries its bootstrap discount, so the memory should receive all of its transitions
    through an adder.

    Args:
        memory: a `ReplayMemory` or `PrioritizedReplayMemory` receiving the n-step transitions.
        n_step: how many steps each transition spans (the `n` of n-step returns).
        gamma: the discount of the rewards inside the window (the learner's `gamma`).
    """

    def __init__(self, memory: Any, n_step: int, gamma: float) -> None:
        if int(n_step) < 1:
            raise ValueError(f"NStepAdder: {n_step=} must be at least 1")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"NStepAdder: {gamma=} must be in [0, 1]")
        self.memory = memory
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self._window: deque[tuple[np.ndarray, Any, float]] = deque()

    def append(
        self,
        obs: np.ndarray,
        act: Any,
        reward: float,
        next_obs: np.ndarray,
        terminal: bool,
        truncated: bool = False,
    ) -> None:
        """Take one step; write every transition it completes into the memory.

        Args:
            obs: the observation the action was taken in.
            act: the action.
            reward: the reward of this step.
            next_obs: the observation after it (the final one at an episode's end).
            terminal: the episode terminated (an end state of the MDP).
            truncated: the episode was cut by a time limit (not an end state).
        """
        self._window.append((np.array(obs, copy=True), act, float(reward)))
        if len(self._window) == self.n_step:
            self._write_oldest(next_obs, bool(terminal))
        if terminal or truncated:
            while self._window:  # bootstrapped from the final observation unless terminal
                self._write_oldest(next_obs, bool(terminal))

    def pending(self) -> int:
        """How many steps of the running episode wait for their n-step return."""
        return len(self._window)

    def _write_oldest(self, next_obs: np.ndarray, terminal: bool) -> None:
        ret = sum(self.gamma**k * r for k, (_, _, r) in enumerate(self._window))
        discount = self.gamma ** len(self._window)
        obs, act, _ = self._window.popleft()
        self.memory.append(obs, act, ret, next_obs, terminal, discount=discount)

    def __len__(self) -> int:
        return len(self.memory)

    def __getattr__(self, name: str) -> Any:
        if name == "memory":  # not set yet: during unpickling
            raise AttributeError(name)
        return getattr(self.memory, name)
