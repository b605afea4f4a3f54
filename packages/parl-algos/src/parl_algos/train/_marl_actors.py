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
arrays cross the network. An actor that dies is replaced where the run says so
(`train.restart_actors`), and the loop is told which environments begin anew.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import parl
from parl_algos.multiagent import StackedAgentsEnv
from parl_algos.samplers import RESTART_SEED_STRIDE, Replacements
from parl_remote import RemoteActorDiedError, RemoteError

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

_DEATHS = (RemoteError, RemoteActorDiedError)
"""The types of a call's error that say its group is gone (not that its environment raised)."""


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

    With `replacements`, a remote group that dies is replaced by a new actor
    (`Replacements.replace`). A `reset` it was making is made again on the new group; a `step`
    it was making is lost: the new group's environments start new episodes (environment `k`
    of the run first reset with `seed + k + RESTART_SEED_STRIDE * r` for its group's `r`-th
    replacement), their rows of the step are those first observations (no reward, no end),
    and `restarted` names them, so that the loop neither counts their half episodes nor joins
    them to the new ones.

    Args:
        env: the `[env]` section.
        num_envs: environments in all.
        actors: None: one `EnvGroup` in this process; else `min(actors, num_envs)`
            `RemoteEnvGroup` actors on the cluster the process is connected to.
        replacements: replace a remote group that dies (None: its death is raised).
        seed: the base of the replaced groups' seeds.
    """

    def __init__(
        self,
        env: Any,
        num_envs: int,
        actors: int | None = None,
        *,
        replacements: Replacements | None = None,
        seed: int = 0,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"EnvGroups: {num_envs=} must be at least 1")
        self.env = env
        self.num_envs = num_envs
        self.remote = actors is not None
        self.replacements = replacements
        self.seed = seed
        self.restarted: list[int] = []
        """The environments whose group the last `step` replaced (their episodes are new)."""
        if actors is None:
            self.sizes = [num_envs]
            self.groups: list[Any] = [EnvGroup(env, num_envs)]
        else:
            if actors < 1:
                raise ValueError(f"EnvGroups: {actors=} must be at least 1")
            n = min(actors, num_envs)
            self.sizes = [num_envs // n + (i < num_envs % n) for i in range(n)]
            self.groups = [self._make(g) for g in range(n)]
        self.bounds = [int(b) for b in np.cumsum([0, *self.sizes])]

    def _make(self, g: int, replaced: int = 0) -> Any:
        return RemoteEnvGroup(self.env, self.sizes[g])

    @property
    def restarts(self) -> int:
        """Groups replaced so far."""
        return 0 if self.replacements is None else self.replacements.total

    def __len__(self) -> int:
        return self.num_envs

    def _gather(self, calls: dict[int, Any], again: Callable[[int], Any]) -> dict[int, Any]:
        """Each group's result of `calls` (by group); a group that died is replaced first.

        `again(g)` makes group `g`'s lost call on its replacement (its future).
        """
        if not self.remote:
            return calls
        results: dict[int, Any] = {}
        try:
            for g in list(calls):
                while g not in results:
                    try:
                        results[g] = calls.pop(g).get(timeout=ENV_CALL_TIMEOUT)
                        continue
                    except RemoteError as exc:
                        if self.replacements is None or type(exc) not in _DEATHS:
                            raise
                        error = exc
                    self.groups[g] = None  # its last handle: the actor and its slot are freed
                    try:
                        make = functools.partial(self._make, g)
                        self.groups[g] = self.replacements.replace(g, error, make)
                    finally:
                        del error  # its frames hold the dead group's call
                    calls[g] = again(g)
        finally:
            calls.clear()  # a pending call holds its actor
        return results

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
        mine: dict[int, tuple[list[int], list[int]]] = {}
        for g, (lo, hi) in enumerate(itertools.pairwise(self.bounds)):
            js = [j for j, i in enumerate(which) if lo <= i < hi]
            if js:
                mine[g] = ([int(seeds[j]) for j in js], [which[j] - lo for j in js])

        def call(g: int) -> Any:
            return self.groups[g].reset(*mine[g])

        parts = self._gather({g: call(g) for g in mine}, call)
        columns = zip(*(parts[g] for g in mine), strict=True)
        return tuple(np.concatenate(column) for column in columns)  # type: ignore[return-value]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step every environment with its row of `actions`; see `EnvGroup.step`.

        A group replaced meanwhile gives its new environments' first observations instead
        (see the class; `restarted` names them).
        """
        actions = np.asarray(actions)
        replaced: list[int] = []

        def fresh(g: int) -> Any:  # the lost step: the new group's first observations
            replaced.append(g)
            r = 0 if self.replacements is None else self.replacements.count(g)
            envs = range(self.bounds[g], self.bounds[g + 1])
            return self.groups[g].reset([self.seed + k + RESTART_SEED_STRIDE * r for k in envs])

        calls = {
            g: self.groups[g].step(actions[lo:hi])
            for g, (lo, hi) in enumerate(itertools.pairwise(self.bounds))
        }
        parts = self._gather(calls, fresh)
        self.restarted = []
        for g in replaced:
            obs, state = parts[g]
            k, ends = len(obs), np.zeros(len(obs), bool)
            parts[g] = (obs, state, np.zeros((k, obs.shape[1]), np.float32), ends, ends)
            self.restarted += range(self.bounds[g], self.bounds[g + 1])
        columns = zip(*(parts[g] for g in range(len(self.groups))), strict=True)
        return tuple(np.concatenate(column) for column in columns)

    def close(self) -> None:
        """Close the environments (the actors end with their handles; a dead one is let go)."""
        if self.remote:
            calls = [group.close() for group in self.groups if group is not None]
            for call in calls:
                with contextlib.suppress(RemoteActorDiedError):
                    call.get(timeout=ENV_CALL_TIMEOUT)
            calls.clear()
        else:
            for group in self.groups:
                group.close()
        self.groups = []
