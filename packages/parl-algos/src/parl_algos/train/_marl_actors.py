"""The environments of a multi-agent run, in this process or on actors of the cluster (`sync`).

`MultiAgentEnvSection` is the `[env]` of the multi-agent configs, an MPE environment of `mpe2`,
which `make_mpe_env` makes as a `StackedAgentsEnv`. `EnvGroup` steps some MPE environments of
one `MultiAgentEnvSection` together and returns their arrays stacked (observations, global
states, each agent's reward, the ends of the episodes); `RemoteEnvGroup` is it as an actor of
the cluster whose calls return futures. `EnvGroups` spreads a run's environments over groups,
one in this process (`single` mode) or one on each of `actors` actors (`sync`), and steps them
all at once: each actor steps its share of the environments while the others step theirs, and
the learner, which picks every agent's action in one batch, waits for all of them. PettingZoo's
parallel environments hold their agents in dicts; a group hands back plain arrays, so that only
arrays cross the network.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import parl
from parl_algos.multiagent import StackedAgentsEnv

__all__ = [
    "ENV_CALL_TIMEOUT",
    "EnvGroup",
    "EnvGroups",
    "MultiAgentEnvSection",
    "RemoteEnvGroup",
    "make_mpe_env",
]

ENV_CALL_TIMEOUT = 300.0
"""Seconds a `reset` or `step` of a remote group may take before the run gives up on it."""


@dataclass
class MultiAgentEnvSection:
    """`[env]` of the multi-agent algorithms: an MPE environment of `mpe2`."""

    id: str = "simple_spread_v3"
    """The `mpe2` environment module (`simple_spread_v3`, `simple_adversary_v3`, ...)."""
    max_cycles: int = 25
    """Steps per episode."""


def make_mpe_env(
    env: MultiAgentEnvSection, cls: type[StackedAgentsEnv] = StackedAgentsEnv
) -> StackedAgentsEnv:
    """The `mpe2` environment `env.id` as a `cls` (`StackedAgentsEnv`; team reward: the mean)."""
    from pettingzoo.utils.conversions import aec_to_parallel

    module = importlib.import_module(f"mpe2.{env.id}")
    # The raw environment, without PettingZoo's checking wrappers: twice as fast a step.
    return cls(aec_to_parallel(module.raw_env(max_cycles=env.max_cycles)))


class EnvGroup:
    """`num_envs` environments of `env` (a `MultiAgentEnvSection`), stepped together.

    Args:
        env: the `[env]` section (picklable: an actor gets it and makes its own copies).
        num_envs: environments in the group.
    """

    def __init__(self, env: Any, num_envs: int) -> None:
        if num_envs < 1:
            raise ValueError(f"EnvGroup: {num_envs=} must be at least 1")
        torch.set_num_threads(1)  # one slot, one core
        self.envs = [make_mpe_env(env) for _ in range(num_envs)]

    def reset(
        self, seeds: list[int], indices: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset environment `indices[j]` (default: every one) with `seeds[j]`.

        Returns `(obs, state)`, one row per environment reset, in the order of `indices`.
        """
        which = list(range(len(self.envs))) if indices is None else [int(i) for i in indices]
        if len(seeds) != len(which):
            raise ValueError(f"EnvGroup.reset: {len(seeds)} seeds for {len(which)} envs")
        if any(not 0 <= i < len(self.envs) for i in which):
            raise ValueError(f"EnvGroup.reset: {indices=} outside the {len(self.envs)} envs")
        results = [self.envs[i].reset(seed=int(seed)) for i, seed in zip(which, seeds, strict=True)]
        return np.stack([o for o, _ in results]), np.stack([i["state"] for _, i in results])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step environment `i` with `actions[i]` (a row per agent).

        Returns `(obs, state, rewards, terminated, done)`: `(k, n_agents, obs_dim)`,
        `(k, state_dim)`, `(k, n_agents)` each agent's reward, and `(k,)` flags, `done` true
        where the episode ended (terminated or truncated). An ended episode is not reset.
        """
        if len(actions) != len(self.envs):
            raise ValueError(f"EnvGroup.step: {len(actions)} actions for {len(self.envs)} envs")
        out: list[list[Any]] = [[], [], [], [], []]
        for env, action in zip(self.envs, actions, strict=True):
            obs, _, terminated, truncated, info = env.step(action)
            for column, value in zip(
                out,
                (obs, info["state"], info["rewards"], terminated, terminated or truncated),
                strict=True,
            ):
                column.append(value)
        obs, state, rewards, terminated, done = (np.stack(c) for c in out)
        return obs, state, rewards.astype(np.float32), terminated, done

    def close(self) -> None:
        """Close the environments."""
        for env in self.envs:
            env.close()


RemoteEnvGroup = parl.remote_class(wait=False)(EnvGroup)
"""`EnvGroup` as an actor of the cluster whose methods return `RemoteFuture`s."""


class EnvGroups:
    """A run's `num_envs` environments, split over groups as evenly as can be.

    Args:
        env: the `[env]` section.
        num_envs: environments in all.
        actors: None: one `EnvGroup` in this process; else `min(actors, num_envs)`
            `RemoteEnvGroup` actors on the cluster the process is connected to.
    """

    def __init__(self, env: Any, num_envs: int, actors: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"EnvGroups: {num_envs=} must be at least 1")
        self.num_envs = num_envs
        self.remote = actors is not None
        if actors is None:
            self.sizes = [num_envs]
            self.groups: list[Any] = [EnvGroup(env, num_envs)]
        else:
            if actors < 1:
                raise ValueError(f"EnvGroups: {actors=} must be at least 1")
            n = min(actors, num_envs)
            self.sizes = [num_envs // n + (i < num_envs % n) for i in range(n)]
            self.groups = [RemoteEnvGroup(env, size) for size in self.sizes]

    def __len__(self) -> int:
        return self.num_envs

    def _split(self, rows: Any) -> list[Any]:
        bounds = np.cumsum([0, *self.sizes])
        return [rows[a:b] for a, b in itertools.pairwise(bounds)]

    def _gather(self, calls: list[Any]) -> list[Any]:
        if not self.remote:
            return calls
        return [call.get(timeout=ENV_CALL_TIMEOUT) for call in calls]

    def reset(
        self, seeds: list[int], indices: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset environment `indices[j]` (default: every one) with `seeds[j]`.

        Returns `(obs, state)`, one row per environment reset, in the order of `indices`
        (which must increase).
        """
        which = list(range(self.num_envs)) if indices is None else [int(i) for i in indices]
        in_range = all(0 <= i < self.num_envs for i in which)
        if not which or len(seeds) != len(which) or which != sorted(set(which)) or not in_range:
            raise ValueError(
                f"EnvGroups.reset: {len(seeds)} seeds for {indices=} of {len(self)} envs "
                "(distinct increasing indices, one seed each)"
            )
        calls = []
        for group, (lo, hi) in zip(
            self.groups, itertools.pairwise(np.cumsum([0, *self.sizes])), strict=True
        ):
            mine = [j for j, i in enumerate(which) if lo <= i < hi]
            if mine:
                calls.append(
                    group.reset([int(seeds[j]) for j in mine], [which[j] - lo for j in mine])
                )
        parts = self._gather(calls)
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))  # type: ignore[return-value]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step every environment with its row of `actions`; see `EnvGroup.step`."""
        actions = np.asarray(actions)
        calls = [g.step(a) for g, a in zip(self.groups, self._split(actions), strict=True)]
        parts = self._gather(calls)
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))

    def close(self) -> None:
        """Close the environments (the actors end with their handles)."""
        self._gather([g.close() for g in self.groups])
        self.groups = []
