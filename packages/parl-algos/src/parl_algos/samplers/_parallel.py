"""`ParallelSampler` and `CentralSampler`: synchronous collects on worker actors.

`ParallelSampler` (rlpyt's parallel-CPU): each worker holds a copy of the agent and collects
`horizon` steps on its own; a collect waits for all. `CentralSampler` (rlpyt's parallel-GPU):
workers only step environments; every step the caller batches all observations and runs
`agent.sample` once, on its own device. With `alternating=True` the workers are two groups, and
one group steps while the caller chooses the other's actions (rlpyt's alternating sampler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from parl_algos.samplers._base import BaseSampler
from parl_algos.samplers._core import Batch, Rollout, act, stack_extras
from parl_algos.samplers._group import WorkerGroup, offset_records

__all__ = ["CentralSampler", "ParallelSampler"]


class _ClusterSampler(BaseSampler):
    """A sampler whose environments live on `WorkerGroup` actors."""

    _agent_on_workers = True
    _slots = 1

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
        self.weights_version = 0
        """How many times `sync_weights()` ran."""
        self._group = WorkerGroup(
            type(self).__name__,
            env_fn,
            agent if self._agent_on_workers else None,
            num_workers=num_workers,
            envs_per_worker=envs_per_worker,
            horizon=horizon,
            seed=seed,
            slots=self._slots,
            address=address,
        )
        self.observation_space = self._group.observation_space
        self.action_space = self._group.action_space

    @property
    def shared_memory(self) -> list[bool]:
        """For each worker, whether its rollouts reach this process through shared memory."""
        return self._group.shared

    def _check_open(self) -> None:
        if not self._closed and not self._group.workers:
            self._closed = True  # a worker died and the group closed itself
        super()._check_open()

    def sync_weights(self) -> None:
        """Push `agent.get_weights()` to every worker's policy copy (once per worker)."""
        self._check_open()
        if not self._agent_on_workers:
            return
        weights = self.agent.get_weights()
        self.weights_version += 1
        version = self.weights_version
        self._group.gather([w.set_weights(weights, version) for w in self._group.workers])

    def close(self) -> None:
        """Free every worker actor and shared-memory segment; calling it again does nothing."""
        self._group.close()
        super().close()


class ParallelSampler(_ClusterSampler):
    """Worker actors, each with a copy of the agent, collect their environments' steps.

    Call `sync_weights()` after the agent learned to send its weights to the copies. The
    workers' random generators are seeded apart (`seed * 1000 + worker`).

    Args:
        env_fn: a picklable zero-argument callable returning a `gymnasium.Env`.
        agent: a picklable object with `sample(obs_batch) -> actions` or `(actions, extras)`,
            and `get_weights()`/`set_weights(w)`.
        num_workers: worker actors.
        envs_per_worker: environments each worker steps.
        horizon: steps of every environment per `collect()`.
        seed: column `k` is reset with `seed + k` on its first reset (None: unseeded).
        address: the cluster, "HOST:PORT"; None: the current `parl.connect()` cluster, or a
            local one of `num_workers` slots.
    """

    def collect(self) -> Batch:
        """One rollout of `horizon` steps from every worker, as one `Batch`."""
        self._check_open()
        group = self._group
        results = group.gather([w.collect(0) for w in group.workers])
        out = Rollout.allocate(group.batch_layout)
        extras: dict[str, list[np.ndarray]] = {}
        final_obs, ended = {}, []
        for w, (arrays, worker_extras, worker_final, worker_ended, _) in enumerate(results):
            group.copy_out(w, arrays, 0, out, group.columns(w))
            for name, value in worker_extras.items():
                extras.setdefault(name, []).append(value)
            more_final, more_ended = offset_records(
                w, self.envs_per_worker, worker_final, worker_ended
            )
            final_obs.update(more_final)
            ended += more_ended
        arrays = out.arrays()
        return self._make_batch(
            arrays.pop("obs"),
            arrays,
            {name: np.concatenate(values, axis=1) for name, values in extras.items()},
            final_obs,
            ended,
        )


class CentralSampler(_ClusterSampler):
    """Worker actors step environments; this process chooses every action, batched.

    Every step, the observations of all workers are put together here and `agent.sample` runs
    once on them (on the learner's device), so the agent never leaves this process.

    Args:
        env_fn: a picklable zero-argument callable returning a `gymnasium.Env`.
        agent: an object with `sample(obs_batch) -> actions` or `(actions, extras)`.
        num_workers: worker actors.
        envs_per_worker: environments each worker steps.
        horizon: steps of every environment per `collect()`.
        seed: column `k` is reset with `seed + k` on its first reset (None: unseeded).
        address: the cluster (None: the current one, or a local one of `num_workers` slots).
        alternating: two groups of workers (at least 2 workers): one steps its environments
            while the actions of the other are computed; `agent.sample` then runs once per
            group and step.
    """

    _agent_on_workers = False

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        num_workers: int = 2,
        envs_per_worker: int = 8,
        horizon: int = 32,
        seed: int | None = 0,
        address: str | None = None,
        alternating: bool = False,
    ) -> None:
        if alternating and num_workers < 2:
            raise ValueError(f"alternating=True needs two groups of workers, got {num_workers=}")
        super().__init__(env_fn, agent, num_workers, envs_per_worker, horizon, seed, address)
        self.alternating = alternating
        half = (num_workers + 1) // 2
        workers = list(range(num_workers))
        self._groups = [workers[:half], workers[half:]] if alternating else [workers]

    def collect(self) -> Batch:
        """`horizon` steps of every worker, actions chosen here; one `Batch`."""
        self._check_open()
        group = self._group
        out = Rollout.allocate(group.batch_layout)
        starts = group.gather([w.begin(0) for w in group.workers])
        for w, start in enumerate(starts):
            shared = group.shared_rollout(w, 0)
            out.obs[0, group.columns(w)] = start if shared is None else shared.obs[0]
        _, act_shape, act_dtype = group.batch_layout[1]
        pending: list[list[Any] | None] = [None] * len(self._groups)
        steps: list[list[dict[str, np.ndarray]]] = []
        final_obs: dict[tuple[int, int], np.ndarray] = {}
        ended: list = []
        for t in range(self.horizon):
            steps.append([])
            for g, members in enumerate(self._groups):
                if pending[g] is not None:
                    self._finish_step(t - 1, members, pending[g], out, final_obs, ended)
                cols = slice(group.columns(members[0]).start, group.columns(members[-1]).stop)
                actions, extras = act(self.agent, out.obs[t, cols], act_shape[2:], act_dtype)
                out.actions[t, cols] = actions
                steps[t].append(extras)
                pending[g] = self._start_step(t, members, out)
        for g, members in enumerate(self._groups):
            self._finish_step(self.horizon - 1, members, pending[g], out, final_obs, ended)
        extras = stack_extras(
            [
                {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
                for parts in steps
            ]
        )
        arrays = out.arrays()
        return self._make_batch(arrays.pop("obs"), arrays, extras, final_obs, ended)

    def _start_step(self, t: int, members: list[int], out: Rollout) -> list[Any]:
        group = self._group
        futures = []
        for w in members:
            actions = out.actions[t, group.columns(w)]
            shared = group.shared_rollout(w, 0)
            if shared is None:
                futures.append(group.workers[w].step(t, actions))
            else:
                shared.actions[t] = actions
                futures.append(group.workers[w].step(t))
        return futures

    def _finish_step(
        self,
        t: int,
        members: list[int],
        futures: list[Any],
        out: Rollout,
        final_obs: dict,
        ended: list,
    ) -> None:
        group = self._group
        for w, (rows, worker_final, worker_ended) in zip(
            members, group.gather(futures, members), strict=True
        ):
            cols = group.columns(w)
            shared = group.shared_rollout(w, 0)
            if shared is not None:
                rows = {
                    "obs": shared.obs[t + 1],
                    "rewards": shared.rewards[t],
                    "terminated": shared.terminated[t],
                    "truncated": shared.truncated[t],
                }
            out.obs[t + 1, cols] = rows["obs"]
            out.rewards[t, cols] = rows["rewards"]
            out.terminated[t, cols] = rows["terminated"]
            out.truncated[t, cols] = rows["truncated"]
            more_final, more_ended = offset_records(
                w, self.envs_per_worker, worker_final, worker_ended
            )
            final_obs.update(more_final)
            ended += more_ended
