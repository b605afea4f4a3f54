"""The environment-stepping core that every sampler shares, and the `Batch` it produces.

`EnvColumns` steps a few environments ("columns") of a sampler in lock step: it seeds column
`k` with `seed + k` on its first reset, resets an environment in the same step that ends its
episode (unseeded, `env.reset()`), keeps the true last observation of every finished episode
and the (step, column, return, length) of each. It writes every step into a `Rollout`, a set of
arrays that may be plain numpy arrays or views on a shared-memory segment, so that the same code
runs in the caller's process (`SerialSampler`, `CentralSampler`'s caller) and in a worker actor.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from parl_algos.rollout import Trajectory
from parl_algos.samplers._arrays import with_flags

__all__ = [
    "Batch",
    "EnvColumns",
    "Layout",
    "Rollout",
    "act",
    "read_records",
    "rollout_layout",
    "seed_process",
    "segment_layout",
    "stack_extras",
]

Layout = list[tuple[str, tuple[int, ...], np.dtype]]
"""The arrays of a rollout: `(name, shape, dtype)` each, in order."""


class Batch(NamedTuple):
    """What a sampler's `collect()` returns: `horizon` steps of `B` environments, time-major.

    Columns are worker-major: worker `w`'s environment `j` is column `w * envs_per_worker + j`.
    """

    obs: np.ndarray
    """`[horizon, B, *obs_shape]`, the environment's dtype: what `actions[t]` was chosen from."""
    actions: np.ndarray
    """`[horizon, B, *action_shape]`, the action space's dtype."""
    rewards: np.ndarray
    """`[horizon, B]` float32."""
    terminated: np.ndarray
    """`[horizon, B]` bool: the step reached a terminal state."""
    truncated: np.ndarray
    """`[horizon, B]` bool: the step hit a time limit (as the environment reported it)."""
    next_obs: np.ndarray
    """`[B, *obs_shape]`: where the next `collect()` starts (a reset one after a last step)."""
    extras: dict[str, np.ndarray]
    """The agent's extra outputs (e.g. log-probabilities), `[horizon, B, ...]` each."""
    final_obs: dict[tuple[int, int], np.ndarray]
    """`(t, k)` -> the true last observation of the episode that ended at step `t` in column `k`."""
    worker: int | None = None
    """`AsyncSampler`: the worker that collected the batch (else None)."""
    weights_version: int | None = None
    """`AsyncSampler`: how many `sync_weights()` calls the worker's weights had seen (else None)."""

    def to_trajectory(self) -> Trajectory:
        """The batch as a `parl_algos.rollout.Trajectory`, what the on-policy agents learn from.

        Its `obs` has `horizon + 1` rows (`next_obs` last), its `truncated` is False where the
        step also terminated, and its `final_obs` keeps the truncated episodes' last observations.
        """
        truncated = self.truncated & ~self.terminated
        index = [key for key in self.final_obs if truncated[key]]
        obs_shape = self.obs.shape[2:]
        return Trajectory(
            obs=np.concatenate([self.obs, self.next_obs[None]]),
            action=self.actions,
            reward=self.rewards,
            terminated=self.terminated,
            truncated=truncated,
            final_obs=np.array(
                [self.final_obs[key] for key in index], dtype=self.obs.dtype
            ).reshape(-1, *obs_shape),
            final_index=np.array(index, dtype=np.int64).reshape(-1, 2),
            extras=dict(self.extras),
        )


def rollout_layout(
    horizon: int, num_envs: int, observation_space: gym.Space, action_space: gym.Space
) -> Layout:
    """The arrays of `horizon` steps of `num_envs` environments with these spaces.

    `obs` has `horizon + 1` rows: row `horizon` is the observation the next rollout starts from.
    """
    obs_shape, obs_dtype = _space_array(observation_space, "observation")
    act_shape, act_dtype = _space_array(action_space, "action")
    return [
        ("obs", (horizon + 1, num_envs, *obs_shape), obs_dtype),
        ("actions", (horizon, num_envs, *act_shape), act_dtype),
        ("rewards", (horizon, num_envs), np.dtype(np.float32)),
        ("terminated", (horizon, num_envs), np.dtype(bool)),
        ("truncated", (horizon, num_envs), np.dtype(bool)),
    ]


def segment_layout(layout: Layout) -> Layout:
    """A worker's shared-memory segment: its rollout, the episodes' records, a flag block.

    The records are `final_obs` (`[horizon, num_envs, *obs_shape]`, written only where an
    episode ended: the segment's other pages are never touched), and the ended episodes'
    `returns` and `lengths`, so that a rollout's result needs no call to bring it.
    """
    _, (rows, num_envs, *obs_shape), obs_dtype = layout[0]
    horizon = rows - 1
    return with_flags(
        [
            *layout,
            ("final_obs", (horizon, num_envs, *obs_shape), obs_dtype),
            ("returns", (horizon, num_envs), np.dtype(np.float64)),
            ("lengths", (horizon, num_envs), np.dtype(np.int64)),
        ]
    )


def read_records(
    arrays: Mapping[str, np.ndarray], first_column: int
) -> tuple[dict[tuple[int, int], np.ndarray], list[tuple[int, int, float, int]]]:
    """The `final_obs` and ended episodes that `EnvColumns.write_records` wrote into `arrays`.

    Columns are numbered from `first_column`; the observations are copied out.
    """
    done = np.argwhere(arrays["terminated"] | arrays["truncated"])
    final, returns, lengths = arrays["final_obs"], arrays["returns"], arrays["lengths"]
    final_obs, ended = {}, []
    for t, j in done.tolist():
        k = first_column + j
        final_obs[(t, k)] = final[t, j].copy()
        ended.append((t, k, float(returns[t, j]), int(lengths[t, j])))
    return final_obs, ended


def _space_array(space: gym.Space, what: str) -> tuple[tuple[int, ...], np.dtype]:
    if space.shape is None or space.dtype is None:
        raise TypeError(
            f"samplers need a fixed-shape {what} space (Box, Discrete, MultiDiscrete, "
            f"MultiBinary), got {space!r}"
        )
    return tuple(space.shape), np.dtype(space.dtype)


class Rollout:
    """The arrays one `EnvColumns` writes into: `obs`, `actions`, `rewards`, the two flags.

    Args:
        arrays: name -> array, shaped as `rollout_layout` says (numpy or shared-memory views).
    """

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.obs = arrays["obs"]
        self.actions = arrays["actions"]
        self.rewards = arrays["rewards"]
        self.terminated = arrays["terminated"]
        self.truncated = arrays["truncated"]

    @classmethod
    def allocate(cls, layout: Layout) -> Rollout:
        """A rollout of fresh process-local arrays."""
        return cls({name: np.empty(shape, dtype) for name, shape, dtype in layout})

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by name."""
        return {
            "obs": self.obs,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminated": self.terminated,
            "truncated": self.truncated,
        }


class EnvColumns:
    """A few environments stepped in lock step, with same-step autoreset.

    Args:
        env_fn: a zero-argument callable returning a `gymnasium.Env`.
        num_envs: how many environments (columns).
        seed: column `j` is reset with `seed + first_column + j` on its first reset (None:
            unseeded); later resets are `env.reset()`.
        first_column: the sampler-wide index of column 0 (for seeds and records).
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        seed: int | None,
        first_column: int = 0,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"{num_envs=} must be at least 1")
        self.envs = [env_fn() for _ in range(num_envs)]
        for env in self.envs:
            if not isinstance(env, gym.Env):
                raise TypeError(f"env_fn must return a gymnasium.Env, it returned {env!r}")
        self.num_envs = num_envs
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        obs_shape, obs_dtype = _space_array(self.observation_space, "observation")
        self.obs = np.empty((num_envs, *obs_shape), obs_dtype)
        for j, env in enumerate(self.envs):
            self.obs[j] = env.reset(seed=None if seed is None else seed + first_column + j)[0]
        self._returns = [0.0] * num_envs
        self._lengths = [0] * num_envs
        self.final_obs: dict[tuple[int, int], np.ndarray] = {}
        self.ended: list[tuple[int, int, float, int]] = []
        self._rollout: Rollout | None = None

    def begin(self, rollout: Rollout) -> None:
        """Start a rollout: its `obs[0]` is the current observations; records start empty."""
        self._rollout = rollout
        rollout.obs[0] = self.obs
        self.final_obs = {}
        self.ended = []

    def step(self, t: int, actions: np.ndarray) -> None:
        """Step every environment once with `actions` (one row each); write step `t`.

        The bookkeeping of an environment step is Python lists; the rollout's rows of step `t`
        are written once each, after the last environment (a numpy item write costs as much as
        a small environment's step).
        """
        r = self._rollout
        r.actions[t] = actions
        returns, lengths, obs_rows = self._returns, self._lengths, self.obs
        rewards, terminals, truncations = [], [], []
        # Iterating the rows gives a numpy scalar a column (a row array for shaped actions).
        for j, (env, action) in enumerate(zip(self.envs, r.actions[t], strict=True)):
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            terminals.append(terminated)
            truncations.append(truncated)
            returns[j] += float(reward)
            lengths[j] += 1
            if terminated or truncated:
                self.final_obs[(t, j)] = np.array(obs, dtype=obs_rows.dtype)
                self.ended.append((t, j, returns[j], lengths[j]))
                returns[j] = 0.0
                lengths[j] = 0
                obs, _ = env.reset()
            obs_rows[j] = obs
        r.rewards[t] = rewards
        r.terminated[t] = terminals
        r.truncated[t] = truncations
        r.obs[t + 1] = obs_rows

    def collect(self, agent: Any, rollout: Rollout) -> dict[str, np.ndarray]:
        """Fill `rollout` with steps chosen by `agent.sample`; return the extras, stacked."""
        self.begin(rollout)
        act_shape, act_dtype = rollout.actions.shape[2:], rollout.actions.dtype
        steps = []
        for t in range(len(rollout.actions)):
            actions, extras = act(agent, rollout.obs[t], act_shape, act_dtype)
            self.step(t, actions)
            steps.append(extras)
        return stack_extras(steps)

    def write_records(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Write the rollout's `final_obs` and ended episodes into `segment_layout`'s arrays."""
        final, returns, lengths = arrays["final_obs"], arrays["returns"], arrays["lengths"]
        for (t, j), obs in self.final_obs.items():
            final[t, j] = obs
        for t, j, ret, length in self.ended:
            returns[t, j] = ret
            lengths[t, j] = length

    def close(self) -> None:
        """Close every environment."""
        for env in self.envs:
            env.close()


def act(agent: Any, obs: np.ndarray, action_shape: tuple[int, ...], action_dtype: np.dtype):
    """Call `agent.sample(obs)`; return `(actions, extras)`, actions shaped and typed as the space.

    The agent may return the actions alone or `(actions, extras)`, a dict of arrays.
    """
    out = agent.sample(obs)
    actions, extras = out if isinstance(out, tuple) else (out, {})
    actions = np.asarray(actions)
    n = len(obs)
    shape = (n, *action_shape)
    if actions.shape != shape:
        if actions.size != n * math.prod(action_shape):
            raise ValueError(
                f"agent.sample returned actions of shape {actions.shape} for {n} observations; "
                f"expected {shape}"
            )
        actions = actions.reshape(shape)
    if actions.dtype != action_dtype:
        actions = actions.astype(action_dtype)
    if not extras:  # checked before the (slower) abstract-class test: {} is the common case
        return actions, {}
    if not isinstance(extras, Mapping):
        raise TypeError(f"agent.sample's extras must be a dict of arrays, got {type(extras)}")
    return actions, {name: np.asarray(value) for name, value in extras.items()}


def stack_extras(steps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`horizon` dicts of `[B, ...]` arrays -> one dict of `[horizon, B, ...]` arrays."""
    if not steps:
        return {}
    return {name: np.stack([step[name] for step in steps]) for name in steps[0]}


def seed_process(seed: int | None) -> None:
    """Seed Python's, numpy's and (if loaded) torch's global generators of this process."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
