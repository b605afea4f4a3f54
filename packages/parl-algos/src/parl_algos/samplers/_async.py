"""`AsyncSampler`: workers keep collecting in the background while the caller learns.

Each worker has two rollout slots and always two `collect` calls queued (calls to an actor run
in the order they were sent): while the caller reads one slot, the worker fills the other. A
waiter thread per worker resolves its calls in order and hands the finished ones to one queue;
`collect()` takes the next from any worker, copies it out, and queues that slot's next collect.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from parl_algos.samplers._core import Batch, Rollout
from parl_algos.samplers._parallel import _ClusterSampler
from parl_remote import RemoteActorDiedError

__all__ = ["AsyncSampler"]

_STOP = object()


class AsyncSampler(_ClusterSampler):
    """Worker actors with agent copies collect continuously; `collect()` returns the next batch.

    A batch is one worker's `horizon` steps of its `envs_per_worker` environments (`B =
    envs_per_worker`); `Batch.worker` says which worker, and `Batch.weights_version` how many
    `sync_weights()` calls its policy copy had seen when the rollout began. Worker `w`'s
    environment `j` is reset with `seed + w * envs_per_worker + j` on its first reset.

    Args:
        env_fn: a picklable zero-argument callable returning a `gymnasium.Env`.
        agent: a picklable object with `sample(obs_batch) -> actions` or `(actions, extras)`,
            and `get_weights()`/`set_weights(w)`.
        num_workers: worker actors.
        envs_per_worker: environments each worker steps.
        horizon: steps of every environment per batch.
        seed: seeds of the first resets (None: unseeded).
        address: the cluster (None: the current one, or a local one of `num_workers` slots).
    """

    _slots = 2

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
        super().__init__(env_fn, agent, num_workers, envs_per_worker, horizon, seed, address)
        self._finished: queue.Queue = queue.Queue()
        self._inboxes = [queue.Queue() for _ in range(num_workers)]
        self._stopping = False
        self._waiters = [
            threading.Thread(target=self._wait, args=(w,), name=f"async-sampler-{w}", daemon=True)
            for w in range(num_workers)
        ]
        for waiter in self._waiters:
            waiter.start()
        for w in range(num_workers):
            for slot in range(self._slots):
                self._start(w, slot)

    @property
    def batch_size(self) -> int:
        """`B`, the columns of a batch: one worker's environments."""
        return self.envs_per_worker

    def _start(self, w: int, slot: int) -> None:
        self._inboxes[w].put((slot, self._group.workers[w].collect(slot)))

    def _wait(self, w: int) -> None:
        """Resolve worker `w`'s calls in the order they were made (a thread per worker)."""
        inbox = self._inboxes[w]
        while True:
            item = inbox.get()
            if item is _STOP:
                return
            slot, future = item
            del item
            try:
                result: Any = future.get()
            except BaseException as exc:  # handed to the caller's thread
                result = exc
            del future  # a pending future keeps its actor alive
            if self._stopping:
                continue
            if slot is not None or isinstance(result, BaseException):
                self._finished.put((w, slot, result))

    def collect(self) -> Batch:
        """The next batch any worker finished (blocks until one has)."""
        self._check_open()
        w, slot, result = self._finished.get()
        if isinstance(result, BaseException):
            try:
                self._group.fail(w, result)
            except RemoteActorDiedError:
                self.close()
                raise
        arrays, extras, final_obs, ended, version = result
        out = Rollout.allocate(self._group.layout)
        self._group.copy_out(w, arrays, slot, out, slice(None))
        final_obs, ended = self._group.records(w, slot, final_obs, ended, 0)
        self._start(w, slot)  # the slot is read: the worker may fill it again
        arrays = out.arrays()
        return self._make_batch(
            arrays.pop("obs"), arrays, extras, final_obs, ended, worker=w, weights_version=version
        )

    def sync_weights(self) -> None:
        """Send `agent.get_weights()` to every worker; their next rollouts carry the new version.

        Does not wait: each worker loads the weights after the rollout it is collecting.
        """
        self._check_open()
        weights = self.agent.get_weights()
        self.weights_version += 1
        for w, worker in enumerate(self._group.workers):
            self._inboxes[w].put((None, worker.set_weights(weights, self.weights_version)))

    def close(self) -> None:
        """Stop the workers, free every actor and segment; calling it again does nothing."""
        self._stopping = True
        for inbox in self._inboxes:
            inbox.put(_STOP)
        super().close()
