"""`ParallelSampler`, and what every sampler on worker actors shares (`_ClusterSampler`).

`ParallelSampler` (rlpyt's parallel-CPU): each worker holds a copy of the agent and collects
`horizon` steps on its own; a collect waits for all. `CentralSampler` (`_central`) and
`AsyncSampler` (`_async`) build on the same `_ClusterSampler`.

Where every worker is on this host, `ParallelSampler`'s workers write straight into one
shared-memory segment laid out as the whole batch, each its own columns of every row, and the
batch's arrays are views of that segment: the caller copies nothing. The segment is lent to the
batch (`ArrayPool`) and used again only once the user holds none of its arrays; a user who
keeps more batches than the pool holds gets the later ones copied into memory of their own, as
workers on other hosts always do. Either way the batches are the same, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from parl_algos.samplers._base import BaseSampler
from parl_algos.samplers._core import Batch, Rollout
from parl_algos.samplers._group import Restarts, WorkerGroup

__all__ = ["ParallelSampler"]


class _ClusterSampler(BaseSampler):
    """A sampler whose environments live on `WorkerGroup` actors."""

    _agent_on_workers = True
    _slots = 1
    _batch_segments = 0
    """The most whole-batch segments the workers write into (`WorkerGroup.batches`; 0: none)."""

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        num_workers: int = 2,
        envs_per_worker: int = 8,
        horizon: int = 32,
        seed: int | None = 0,
        address: str | None = None,
        *,
        restart: bool = False,
        max_restarts: int = 3,
        restart_timeout: float = 60.0,
    ) -> None:
        restarts = Restarts(restart, max_restarts, restart_timeout)
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
            batch_segments=self._batch_segments,
            restarts=restarts,
        )
        self.observation_space = self._group.observation_space
        self.action_space = self._group.action_space

    @property
    def shared_memory(self) -> list[bool]:
        """For each worker, whether its rollouts reach this process through shared memory."""
        return self._group.shared

    @property
    def restarts(self) -> int:
        """Workers replaced so far (`restart=True`), all together."""
        return self._group.restarts

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
        self._group.weights = weights, version  # what a replacement gets
        self._group.run(lambda worker, _: worker.set_weights(weights, version))

    def _make_batch(self, *args: Any, **kwargs: Any) -> Batch:
        """`BaseSampler._make_batch`; a replacement's first batch ends its timings' line."""
        self._group.delivered(kwargs.get("worker"))
        return super()._make_batch(*args, **kwargs)

    def close(self) -> None:
        """Free every worker actor and shared-memory segment; calling it again does nothing."""
        self._group.close()
        super().close()


class ParallelSampler(_ClusterSampler):
    """Worker actors, each with a copy of the agent, collect their environments' steps.

    Call `sync_weights()` after the agent learned to send its weights to the copies. The
    workers' random generators are seeded apart (`seed * 1000 + worker`).

    Where every worker is on this host, the arrays of a batch (all but `extras` and
    `final_obs`) are views of a shared-memory segment that the workers wrote into; it is the
    batch's alone for as long as any of them, or any view of them, is held. Up to 8 batches
    held at once are kept so; the ones collected while 8 are held are copied into memory of
    this process.

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
        restart: replace a worker that dies (or whose environment raises) by a new actor,
            which gets the weights of the last `sync_weights()` and redoes the lost share of
            the collect: the batch keeps its shape and column order (False: a dead worker
            closes the sampler and raises `parl.RemoteActorDiedError`). See `Restarts`.
        max_restarts: the most replacements of one worker within 10 minutes; one more
            failure stops the sampler (`SamplerWorkerError`, from the environment's error).
        restart_timeout: the longest wait, in seconds, for a free slot for a replacement;
            past it the sampler closes and raises `parl.RemoteActorDiedError`.
    """

    _batch_segments = 8
    _zero_copy = True
    """Whether the workers write into a lent batch segment where they can (False: every
    collect copies the workers' rollouts into a fresh batch, as for workers on other hosts)."""

    def collect(self) -> Batch:
        """One rollout of `horizon` steps from every worker, as one `Batch`.

        Where the workers share memory with this process, the batch's arrays are views of a
        shared segment that is written again only once none of them is left.
        """
        self._check_open()
        group = self._group
        pool = group.batches if self._zero_copy and all(group.shared) else None
        segment = pool.acquire() if pool is not None else None
        if pool is None or segment is None:
            results = group.run(lambda worker, _: worker.collect(0))
            out = Rollout.allocate(group.batch_layout)
            for w, (arrays, *_) in enumerate(results):
                group.copy_out(w, arrays, 0, out, group.columns(w))
        else:
            ref, width = tuple(segment.ref), self.batch_size

            def collect(worker: Any, w: int) -> Any:  # a replacement elsewhere: no segments
                return worker.collect(0, ref, width) if group.shared[w] else worker.collect(0)

            try:
                results = group.run(collect)
            except BaseException:
                pool.release(segment)
                raise
            out = Rollout(pool.lend(segment))
            for w, (arrays, *_) in enumerate(results):
                if arrays is not None:
                    group.copy_out(w, arrays, 0, out, group.columns(w))
        extras: dict[str, list[np.ndarray]] = {}
        final_obs, ended = {}, []
        for w, (_, worker_extras, worker_final, worker_ended, _) in enumerate(results):
            for name, value in worker_extras.items():
                extras.setdefault(name, []).append(value)
            cols = group.columns(w)
            mine = Rollout({name: array[:, cols] for name, array in out.arrays().items()})
            more_final, more_ended = group.records(
                w, 0, worker_final, worker_ended, cols.start, mine
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
