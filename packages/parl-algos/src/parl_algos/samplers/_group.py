"""The worker actors of a cluster sampler, their data plane, and what a dead worker means.

`WorkerGroup` creates the workers (all at once), asks each for its spaces and host, gives every
worker on this host shared-memory segments to write its rollouts into (`_shm`), and gathers the
results of calls made on all workers. Where every worker is on this host, it can also keep a
pool of whole-batch segments (`batches`) that all workers write their columns into at once. A
worker that dies turns into `parl.RemoteActorDiedError` naming it, after the group freed every
actor and segment.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np

import parl
from parl_algos.samplers._core import Rollout, read_records, rollout_layout, segment_layout
from parl_algos.samplers._flags import FlagSignal, flags_available
from parl_algos.samplers._shm import (
    SegmentPool,
    SharedArrays,
    shm_available,
    sweep_dead_owners,
)
from parl_algos.samplers._signal import Signal, SignalListener
from parl_algos.samplers._worker import RemoteEnvWorker
from parl_remote import ClusterError, RemoteActorDiedError, RemoteError, host_id

__all__ = ["WorkerGroup", "connect"]


def connect(address: str | None, cpu_num: int) -> None:
    """Join the cluster at `address`; None: the current one, or a local one of `cpu_num` slots."""
    if address is not None:
        parl.connect(address)
        return
    try:
        parl.connect(cpu_num=cpu_num)
    except ClusterError:  # already connected, to a cluster of other size or elsewhere
        parl.connect()


class WorkerGroup:
    """`num_workers` `EnvWorker` actors of one sampler.

    Args:
        owner: the sampler's name, for error messages.
        env_fn, agent, envs_per_worker, horizon, seed, slots: as `EnvWorker` takes them (the
            agent is None for workers that only step environments).
        num_workers: how many workers.
        address: the cluster (None: the current one, or a local one).
        batch_segments: the most whole-batch segments `batches` makes (0: no pool).
    """

    def __init__(
        self,
        owner: str,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        *,
        num_workers: int,
        envs_per_worker: int,
        horizon: int,
        seed: int | None,
        slots: int,
        address: str | None,
        batch_segments: int = 0,
    ) -> None:
        self.owner = owner
        self.envs_per_worker = envs_per_worker
        self.workers: list[Any] = []
        self.segments: list[list[SharedArrays] | None] = [None] * num_workers
        self.signals: list[Signal | FlagSignal | None] = [None] * num_workers
        self.batches: SegmentPool | None = None
        """Segments of `batch_layout` that the workers write their columns into (`EnvWorker.
        collect`'s `batch`): where every worker has shared memory and `batch_segments` > 0."""
        connect(address, num_workers)

        def create(index: int) -> Any:
            return RemoteEnvWorker(env_fn, agent, index, envs_per_worker, horizon, seed, slots)

        # The first alone, then the others at once: the first call also builds the code
        # bundle that every actor of this client receives.
        created = [create(0)]
        if num_workers > 1:
            with ThreadPoolExecutor(num_workers - 1, thread_name_prefix="sampler-create") as pool:
                futures = [pool.submit(create, w) for w in range(1, num_workers)]
                try:
                    created += [future.result() for future in futures]
                except BaseException:
                    del created  # the actors made so far go with their handles
                    raise
        self.workers = created
        descriptions = self.gather([worker.describe() for worker in self.workers])
        self.observation_space, self.action_space, _ = descriptions[0]
        self.layout = rollout_layout(
            horizon, envs_per_worker, self.observation_space, self.action_space
        )
        self.batch_layout = rollout_layout(
            horizon, num_workers * envs_per_worker, self.observation_space, self.action_space
        )
        self._share_memory([host for _, _, host in descriptions], slots)
        if batch_segments > 0 and all(self.shared):
            self.batches = SegmentPool(self.batch_layout, batch_segments)

    def _share_memory(self, hosts: list[str], slots: int) -> None:
        here = host_id()
        if not shm_available():
            return
        sweep_dead_owners()  # what samplers killed before their close() left behind
        offered: dict[int, list[SharedArrays]] = {}
        try:
            for w, host in enumerate(hosts):
                if host == here:
                    offered[w] = [
                        SharedArrays.create(segment_layout(self.layout)) for _ in range(slots)
                    ]
            calls = {
                w: self.workers[w].attach([segment.name for segment in segments])
                for w, segments in offered.items()
            }
            accepted = dict(zip(calls, self.gather(list(calls.values()), list(calls)), strict=True))
        except BaseException:
            for segments in offered.values():
                _free(segments)
            raise
        for w, segments in offered.items():
            if accepted[w]:
                self.segments[w] = segments
            else:  # the worker could not map them: it is on another host after all
                _free(segments)

    def connect_signals(
        self,
        timeout: float,
        spin_s: tuple[float, float] | None = None,
        adaptive: bool = True,
    ) -> None:
        """Give every worker with shared memory a step signal; `timeout`: its waits.

        With `spin_s` (the sampler's spin, the workers' spin: the longest where `adaptive`)
        and where `flags_available()`, steps are handed over by flags in the segments
        (`_flags`), the socket only watched; else one byte a step on the socket (`_signal`).
        A worker that cannot connect keeps to step calls.
        """
        members = [w for w, segments in enumerate(self.segments) if segments is not None]
        if not members:
            return
        flags = spin_s is not None and flags_available()
        worker_spin = spin_s[1] if flags and spin_s is not None else None
        listener = SignalListener(len(members))
        try:
            calls = [
                self.workers[w].connect_signal(
                    listener.path, listener.token, timeout, worker_spin, adaptive
                )
                for w in members
            ]
            connected = {
                w for w, ok in zip(members, self.gather(calls, members), strict=True) if ok
            }
            for w, signal in listener.accept(connected, 10.0, timeout).items():
                segments = self.segments[w]
                if flags and spin_s is not None and segments is not None:
                    words = segments[0].arrays["flags"]
                    self.signals[w] = FlagSignal(
                        signal, words, sampler=True, spin_s=spin_s[0], adaptive=adaptive
                    )
                else:
                    self.signals[w] = signal
        finally:
            listener.close()

    @property
    def shared(self) -> list[bool]:
        """For each worker, whether its rollouts travel through shared memory."""
        return [segments is not None for segments in self.segments]

    def columns(self, w: int) -> slice:
        """The batch columns of worker `w`."""
        return slice(w * self.envs_per_worker, (w + 1) * self.envs_per_worker)

    def shared_rollout(self, w: int, slot: int) -> Rollout | None:
        """Worker `w`'s rollout `slot` in shared memory, or None where it has none."""
        segments = self.segments[w]
        return None if segments is None else Rollout(segments[slot].arrays)

    def gather(self, futures: list[Any], indices: list[int] | None = None) -> list[Any]:
        """The results of calls made on the workers (`indices`: whose; default 0, 1, ...)."""
        indices = list(range(len(futures))) if indices is None else indices
        results = []
        try:
            for w, future in zip(indices, futures, strict=True):
                results.append(self.result(w, future))
        finally:
            futures.clear()  # a pending future holds its actor: drop them all, even on error
        return results

    def result(self, w: int, future: Any) -> Any:
        """The result of one call on worker `w`; a dead worker closes the group and says so."""
        try:
            return future.get()
        except RemoteError as exc:
            self.fail(w, exc)

    def fail(self, w: int, exc: BaseException) -> None:
        """Raise what a call on worker `w` raised; for a dead worker, after closing the group."""
        if not isinstance(exc, RemoteError) or type(exc) not in (RemoteError, RemoteActorDiedError):
            raise exc  # the worker's own code failed: its error, as it is
        self.close()
        raise RemoteActorDiedError(
            f"{self.owner}: worker {w} died ({exc}); the sampler is closed"
        ) from None

    def records(
        self,
        w: int,
        slot: int,
        final_obs: dict[tuple[int, int], np.ndarray] | None,
        ended: list | None,
        first_column: int,
        rollout: Rollout | None = None,
    ) -> tuple[dict[tuple[int, int], np.ndarray], list]:
        """Worker `w`'s records of a rollout in `slot`: the call's, or (None) its segment's.

        Columns are numbered from `first_column`. `rollout`: the worker's columns of the
        rollout, where its steps went elsewhere than `slot`'s segment (a batch segment).
        """
        segments = self.segments[w]
        if final_obs is None or ended is None:
            if segments is None:
                raise RuntimeError(f"worker {w} left its records in a segment it does not have")
            arrays = segments[slot].arrays
            if rollout is not None:
                flags = {"terminated": rollout.terminated, "truncated": rollout.truncated}
                arrays = {**arrays, **flags}
            return read_records(arrays, first_column)
        return (
            {(t, first_column + j): obs for (t, j), obs in final_obs.items()},
            [(t, first_column + j, ret, length) for t, j, ret, length in ended],
        )

    def copy_out(
        self, w: int, arrays: dict[str, np.ndarray] | None, slot: int, out: Rollout, cols: slice
    ) -> None:
        """Copy worker `w`'s rollout (the call's `arrays`, or its segment) into `out[:, cols]`."""
        source = self.shared_rollout(w, slot)
        source_arrays = source.arrays() if source is not None else arrays
        for name, target in out.arrays().items():
            target[:, cols] = source_arrays[name]

    def close(self) -> None:
        """Free every actor and segment; calling it again does nothing.

        A batch segment still lent out keeps its mapping (not its name) until its arrays go.
        """
        for w, signal in enumerate(self.signals):
            if signal is not None:
                signal.close()
                self.signals[w] = None
        self.workers = []  # the last handle of an actor frees it and its CPU slot
        for w, segments in enumerate(self.segments):
            if segments is not None:
                _free(segments)
                self.segments[w] = None
        if self.batches is not None:
            self.batches.close()


def _free(segments: list[SharedArrays]) -> None:
    for segment in segments:
        segment.unlink()
        segment.close()
