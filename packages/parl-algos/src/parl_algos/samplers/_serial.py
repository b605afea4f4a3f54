"""`SerialSampler`: every environment stepped in the calling process, no cluster needed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from parl_algos.samplers._base import BaseSampler
from parl_algos.samplers._core import Batch, EnvColumns, Rollout, rollout_layout

__all__ = ["SerialSampler"]


class SerialSampler(BaseSampler):
    """Steps all `num_workers * envs_per_worker` environments in this process.

    The columns are those of `ParallelSampler` and `CentralSampler` built with the same
    arguments, in the same order, and `agent.sample` runs once a step on all of them: with a
    deterministic agent (each row's action depending on that row alone), the three return the
    same batches, bit for bit.

    Args:
        env_fn: a picklable zero-argument callable returning a `gymnasium.Env`.
        agent: an object with `sample(obs_batch) -> actions` or `(actions, extras)`.
        num_workers: groups of `envs_per_worker` columns (workers of the parallel samplers).
        envs_per_worker: environments per group.
        horizon: steps of every environment per `collect()`.
        seed: column `k` is reset with `seed + k` on its first reset (None: unseeded).
        address: ignored (no cluster is used); accepted so that every sampler takes the same
            arguments.
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        num_workers: int = 2,
        envs_per_worker: int = 8,
        horizon: int = 32,
        seed: int | None = 0,
        address: str | None = None,
    ) -> None:
        super().__init__(
            env_fn,
            agent,
            num_workers=num_workers,
            envs_per_worker=envs_per_worker,
            horizon=horizon,
            seed=seed,
        )
        self._columns = EnvColumns(env_fn, self.batch_size, seed)
        self.observation_space = self._columns.observation_space
        self.action_space = self._columns.action_space
        self._layout = rollout_layout(
            horizon, self.batch_size, self.observation_space, self.action_space
        )

    def collect(self) -> Batch:
        """Step every environment `horizon` times with `agent.sample`; return the `Batch`."""
        self._check_open()
        rollout = Rollout.allocate(self._layout)
        columns = self._columns
        extras = columns.collect(self.agent, rollout)
        arrays = rollout.arrays()
        return self._make_batch(arrays.pop("obs"), arrays, extras, columns.final_obs, columns.ended)

    def close(self) -> None:
        """Close the environments; calling it again does nothing."""
        if not self._closed:
            self._columns.close()
        super().close()
