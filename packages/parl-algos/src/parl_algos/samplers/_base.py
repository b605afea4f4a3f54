"""What every sampler shares: its arguments, episode records, `close()` and the `with` form."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Self

import gymnasium as gym
import numpy as np

from parl_algos.rollout import Episode
from parl_algos.samplers._core import Batch

__all__ = ["BaseSampler", "EndedEpisode"]

EndedEpisode = tuple[int, int, float, int]
"""`(t, column, return, length)` of an episode that ended at step `t` of a collect."""


class BaseSampler:
    """The common half of every sampler (not for use on its own).

    Args:
        env_fn: a picklable zero-argument callable returning a `gymnasium.Env`.
        agent: an object with `sample(obs_batch) -> actions` or `(actions, extras)`, and
            `get_weights()`/`set_weights(w)` where weights must reach workers.
        num_workers: worker actors (or, for `SerialSampler`, groups of columns in-process).
        envs_per_worker: environments each worker steps.
        horizon: steps of every environment per `collect()`.
        seed: environment column `k` is reset with `seed + k` on its first reset (None:
            unseeded).
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        *,
        num_workers: int,
        envs_per_worker: int,
        horizon: int,
        seed: int | None,
    ) -> None:
        for name, value in (
            ("num_workers", num_workers),
            ("envs_per_worker", envs_per_worker),
            ("horizon", horizon),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if seed is not None and not isinstance(seed, int):
            raise TypeError(f"{seed=} must be an int or None")
        if not callable(env_fn):
            raise TypeError(f"env_fn must be a zero-argument callable, got {env_fn!r}")
        if not callable(getattr(agent, "sample", None)):
            raise TypeError(f"agent must have a sample(obs_batch) method, got {agent!r}")
        self.env_fn = env_fn
        self.agent = agent
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.horizon = horizon
        self.seed = seed
        self.env_steps = 0
        """Env steps collected so far, summed over all columns."""
        self._episodes: list[Episode] = []
        self._closed = False

    @property
    def batch_size(self) -> int:
        """`B`, the columns of a batch."""
        return self.num_workers * self.envs_per_worker

    def collect(self) -> Batch:
        """Step every environment `horizon` times; return the steps as a `Batch`."""
        raise NotImplementedError

    def sync_weights(self) -> None:
        """Push `agent.get_weights()` to every worker that holds a copy of the policy."""

    def episodes(self) -> list[Episode]:
        """The episodes finished since the last call: `(env_step, return, length)`, oldest first.

        `env_step` is the sampler's env steps (all columns) when the episode ended.
        """
        episodes, self._episodes = self._episodes, []
        return episodes

    def close(self) -> None:
        """Free everything the sampler holds; calling it again does nothing."""
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")

    def _make_batch(
        self,
        obs: np.ndarray,
        rest: dict[str, np.ndarray],
        extras: dict[str, np.ndarray],
        final_obs: dict[tuple[int, int], np.ndarray],
        ended: Iterable[EndedEpisode],
        *,
        worker: int | None = None,
        weights_version: int | None = None,
    ) -> Batch:
        """Count the batch's steps and episodes and build it (`obs` has `horizon + 1` rows)."""
        width = obs.shape[1]
        base = self.env_steps
        self.env_steps += self.horizon * width
        for t, _, ret, length in sorted(ended):
            self._episodes.append(Episode(base + (t + 1) * width, ret, length))
        return Batch(
            obs=obs[:-1],
            actions=rest["actions"],
            rewards=rest["rewards"],
            terminated=rest["terminated"],
            truncated=rest["truncated"],
            next_obs=obs[-1],
            extras=extras,
            final_obs=dict(sorted(final_obs.items())),
            worker=worker,
            weights_version=weights_version,
        )
