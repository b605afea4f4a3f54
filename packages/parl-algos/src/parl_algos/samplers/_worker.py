"""The worker actor of the samplers: a few environments, and for some samplers a policy copy.

`EnvWorker` is a plain class; `RemoteEnvWorker` is it as a `@parl.remote_class(wait=False)`
actor (its methods return futures, so a sampler drives all its workers at once). A worker
writes its rollouts into `Rollout`s: views on shared-memory segments that the sampler made
(same host, after `attach`), or arrays of its own that travel back in the call's result. A
`ParallelSampler` may also name, per collect, a segment holding the whole batch: the worker then
writes its own columns of it, and the caller has nothing to copy.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

import parl
from parl_algos.samplers._arrays import SharedArrays
from parl_algos.samplers._core import (
    EnvColumns,
    Rollout,
    rollout_layout,
    seed_process,
    segment_layout,
)
from parl_remote.shm import FlagSignal, Signal, SignalClosed, connect_signal, host_id, short_slice

_IMPORTED = time.time()
"""When this process imported the samplers' worker (a warm process: before its actor came)."""

__all__ = [
    "ABORT",
    "ERROR",
    "EnvWorker",
    "READY",
    "Records",
    "RemoteEnvWorker",
    "STEP",
    "StepResult",
    "WorkerResult",
]

READY = b"r"
"""Worker to sampler: the step's observations (or the first ones) are written."""
ERROR = b"e"
"""Worker to sampler: stepping failed; the `drive` call raises why."""
STEP = b"s"
"""Sampler to worker: the step's actions are written."""
ABORT = b"a"
"""Sampler to worker: the collect is given up; `drive` returns None."""

Records = tuple[dict[tuple[int, int], np.ndarray] | None, list[tuple[int, int, float, int]] | None]
"""A rollout's `(final_obs, ended)`; `(None, None)` where they lie in shared memory."""

WorkerResult = tuple[
    dict[str, np.ndarray] | None,
    dict[str, np.ndarray],
    dict[tuple[int, int], np.ndarray] | None,
    list[tuple[int, int, float, int]] | None,
    int,
]
"""What `EnvWorker.collect` returns: `(arrays, extras, final_obs, ended, weights_version)`.

`arrays`, `final_obs` and `ended` are None where the rollout lies in shared memory; columns
are the worker's own (0..n-1).
"""

StepResult = tuple[
    dict[str, np.ndarray] | None,
    dict[tuple[int, int], np.ndarray],
    list[tuple[int, int, float, int]],
]
"""What `EnvWorker.step` returns: `(rows of step t, or None in shared memory, final_obs, ended)`."""


class EnvWorker:
    """Steps `num_envs` environments; with an agent, chooses their actions too.

    Args:
        env_fn: a zero-argument callable returning a `gymnasium.Env`.
        agent: the policy copy (ParallelSampler, AsyncSampler), or None (CentralSampler).
        index: the worker's number; its columns are `index * num_envs + j`.
        num_envs: environments of this worker.
        horizon: steps of every environment per rollout.
        seed: column `k` is reset with `seed + k` on its first reset; the process's random
            generators (Python, numpy, torch) are seeded `seed * 1000 + index`, and torch
            runs on one thread.
        slots: rollouts the worker can hold at once (2 lets the sampler read one while the
            worker fills the other).
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        index: int,
        num_envs: int,
        horizon: int,
        seed: int | None,
        slots: int = 1,
    ) -> None:
        started = time.time()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)  # one core a worker: threads of its own only compete
        seed_process(None if seed is None else seed * 1_000 + index)
        self.columns = EnvColumns(env_fn, num_envs, seed, index * num_envs)
        self.started = (_IMPORTED, started, time.time())
        """When (Unix time) this process imported the worker's module, the constructor began
        (its arguments, the agent, unpickled) and the environments were made."""
        self.agent = agent
        self.horizon = horizon
        self.layout = rollout_layout(
            horizon, num_envs, self.columns.observation_space, self.columns.action_space
        )
        self.rollouts = [Rollout.allocate(self.layout) for _ in range(slots)]
        self.segments: list[SharedArrays] = []
        self.batches: dict[tuple, tuple[SharedArrays, Rollout]] = {}
        """Batch segments mapped so far (by reference), with this worker's columns of each."""
        self.signal: Signal | FlagSignal | None = None
        self.index = index
        self.weights_version = 0

    def describe(self) -> tuple[gym.Space, gym.Space, str, int, str]:
        """`(observation_space, action_space, host id, pid, host name)` of this worker."""
        spaces = self.columns.observation_space, self.columns.action_space
        return *spaces, host_id(), os.getpid(), socket.gethostname()

    def timings(self) -> tuple[float, float, float]:
        """`started`: the Unix times of this worker's start (see the constructor)."""
        return self.started

    def attach(self, refs: list[tuple]) -> bool:
        """Write rollouts into the shared-memory segments `refs` (one a slot) from now on.

        Each is a `parl_remote.shm.SegmentRef` as a plain tuple. Returns False (and keeps its
        own arrays) where they cannot be mapped here.
        """
        if len(refs) != len(self.rollouts):
            raise ValueError(f"attach: {len(refs)} segments for {len(self.rollouts)} slots")
        segments: list[SharedArrays] = []
        try:
            for ref in refs:
                segments.append(SharedArrays.attach(ref, segment_layout(self.layout)))
        except (OSError, ValueError):
            for segment in segments:
                segment.close()
            return False
        self.segments = segments
        self.rollouts = [Rollout(segment.arrays) for segment in segments]
        return True

    def connect_signal(
        self,
        path: str,
        token: bytes,
        timeout: float,
        spin_s: float | None = None,
        adaptive: bool = True,
    ) -> bool:
        """Take step signals from the sampler's `SignalListener` at `path` (after `attach`).

        With `spin_s`, steps come through the flags of slot 0's segment (`FlagSignal`), spinning
        up to that long before sleeping (`adaptive`: about as long as the sampler usually
        takes; else always that long); else one byte a step on the socket. Returns False (and
        keeps to step calls) where the socket cannot be reached.
        """
        if not self.segments:
            return False
        try:
            signal = connect_signal(path, token, self.index, timeout)
        except OSError:
            return False
        if self.signal is not None:
            self.signal.close()
        if spin_s is None:
            self.signal = signal
        else:
            words = self.segments[0].arrays["flags"]
            self.signal = FlagSignal(signal, words, sampler=False, spin_s=spin_s, adaptive=adaptive)
        return True

    def drive(self, slot: int = 0, cpu: int | None = None) -> Records | None:
        """Step a rollout in shared-memory `slot` as the signal says, one byte a step each way.

        Writes the first observations and signals `READY`; then, `horizon` times, waits for
        `STEP` (the sampler wrote the actions), steps and signals `READY`, on short scheduler slices
        (`short_slice`) and, given a `cpu` this process may use, on that CPU alone (its CPUs
        are given back at the end). Returns the rollout's `Records` (in its segment), or None
        where the sampler sent `ABORT`.
        """
        signal = self.signal
        if signal is None:
            raise RuntimeError("drive() needs a signal: call connect_signal() first")
        rollout = self.rollouts[slot]
        columns = self.columns
        try:
            with short_slice(), _on_cpu(cpu):
                columns.begin(rollout)
                signal.send(READY)
                for t in range(self.horizon):
                    if signal.recv() != STEP:
                        return None
                    columns.step(t, rollout.actions[t])
                    signal.send(READY)
        except SignalClosed:
            raise
        except BaseException:
            with contextlib.suppress(SignalClosed):
                signal.send(ERROR)
            raise
        return self._records(slot)

    def _records(self, slot: int) -> Records:
        """The rollout's records: written into `slot`'s segment where there is one."""
        columns = self.columns
        if not self.segments:
            return columns.final_obs, columns.ended
        columns.write_records(self.segments[slot].arrays)
        return None, None

    def set_weights(self, weights: Any, version: int) -> None:
        """Load the learner's weights into the policy copy; `version` dates the next rollouts."""
        self.agent.set_weights(weights)
        self.weights_version = version

    def collect(self, slot: int = 0, batch: tuple | None = None, width: int = 0) -> WorkerResult:
        """Step every environment `horizon` times with the policy copy, into rollout `slot`.

        With `batch`, the reference of a shared-memory segment laid out as a rollout of `width`
        columns, the steps go into this worker's columns of it instead (the records still into
        `slot`'s segment); a segment is mapped on its first use and kept mapped (a sampler
        names no more of them than its pool holds). Plain arguments: nothing to pickle.
        """
        rollout = self.rollouts[slot] if batch is None else self._batch_rollout(batch, width)
        version = self.weights_version
        columns = self.columns
        extras = columns.collect(self.agent, rollout)
        arrays = None if self.segments else rollout.arrays()
        return arrays, extras, *self._records(slot), version

    def _batch_rollout(self, ref: tuple, width: int) -> Rollout:
        """This worker's columns of the batch segment `ref` (`width` columns in all)."""
        ref = tuple(ref)
        mapped = self.batches.get(ref)
        if mapped is None:
            if not self.segments:
                raise RuntimeError("a batch segment needs the worker's own segments: attach first")
            space = self.columns.observation_space, self.columns.action_space
            segment = SharedArrays.attach(ref, rollout_layout(self.horizon, width, *space))
            n = self.columns.num_envs
            cols = slice(self.index * n, (self.index + 1) * n)
            rollout = Rollout({key: array[:, cols] for key, array in segment.arrays.items()})
            mapped = self.batches[ref] = segment, rollout
        return mapped[1]

    def begin(self, slot: int = 0) -> np.ndarray | None:
        """Start a rollout in `slot` driven step by step; its first observations (None: shared)."""
        rollout = self.rollouts[slot]
        self.columns.begin(rollout)
        return None if self.segments else rollout.obs[0]

    def step(self, t: int, actions: np.ndarray | None = None, slot: int = 0) -> StepResult:
        """Step every environment with `actions` (None: those the caller wrote into `slot`)."""
        rollout = self.rollouts[slot]
        columns = self.columns
        columns.step(t, rollout.actions[t] if actions is None else actions)
        done = np.flatnonzero(rollout.terminated[t] | rollout.truncated[t])
        final_obs = {(t, int(j)): columns.final_obs[(t, int(j))] for j in done}
        ended = [record for record in columns.ended if record[0] == t]
        if self.segments:
            return None, final_obs, ended
        rows = {
            "obs": rollout.obs[t + 1],
            "rewards": rollout.rewards[t],
            "terminated": rollout.terminated[t],
            "truncated": rollout.truncated[t],
        }
        return rows, final_obs, ended

    def close(self) -> None:
        """Close the environments and unmap the segments."""
        self.columns.close()
        self.rollouts = []
        if self.signal is not None:
            self.signal.close()
            self.signal = None
        for segment in self.segments:
            segment.close()
        self.segments = []
        for segment, _ in self.batches.values():
            segment.close()
        self.batches = {}


RemoteEnvWorker = parl.remote_class(wait=False)(EnvWorker)
"""`EnvWorker` as an actor whose blocking methods return `RemoteFuture`s."""


@contextlib.contextmanager
def _on_cpu(cpu: int | None) -> Iterator[None]:
    """Run the calling thread (the one that steps) on `cpu` alone inside the block.

    Only where it may use `cpu` (Linux); where the system refuses, it runs as it was.
    """
    allowed = (
        os.sched_getaffinity(0) if cpu is not None and hasattr(os, "sched_getaffinity") else None
    )
    pinned = False
    if allowed is not None and cpu in allowed:
        with contextlib.suppress(OSError):  # a CPU taken offline or out of the cpuset meanwhile
            os.sched_setaffinity(0, {cpu})
            pinned = True
    try:
        yield
    finally:
        if pinned:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, allowed)
