"""`CentralSampler`: workers only step environments; the caller chooses every action, batched.

rlpyt's parallel-GPU sampler: every step the caller puts the observations of all workers
together and runs `agent.sample` once, on its own device. With `alternating=True` the workers
are two groups, and one group steps while the caller chooses the other's actions (rlpyt's
alternating sampler).

A step crosses to each worker and back. For a worker on this host both halves are in shared
memory (the caller writes the actions, the worker the observations, rewards and flags), and so
is the hand-over: a word each way in the worker's segment, which the waiting side watches for a
spin about as long as the other side usually takes before it sleeps on a futex
(`parl_remote.shm.FlagSignal`; one byte each way on a Unix-domain socket where futexes are not
used, `parl_remote.shm.Signal`). No message,
no event loop: one `drive` call a collect runs the worker's side, and its result brings the
episodes' records at the end. A worker on another host (or one whose signal could not connect)
gets a `step` call a step instead. A worker that dies reads as end-of-file on its signal's
socket: `collect()` raises `parl.RemoteActorDiedError` naming it; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from parl_algos.samplers._core import Batch, Rollout, act, stack_extras
from parl_algos.samplers._group import WorkerGroup, _machine_fault
from parl_algos.samplers._parallel import _ClusterSampler
from parl_algos.samplers._worker import ABORT, ERROR, READY, STEP, _on_cpu
from parl_remote import RemoteActorDiedError, RemoteError
from parl_remote.shm import FlagSignal, SignalClosed, short_slice

__all__ = ["CentralSampler"]


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
        pin_workers: run each worker on this host on a CPU of its own while it collects
            (Linux; its CPUs are given back after each collect), and the collecting thread on
            the last worker's CPU (not with `alternating`), which it wakes last. None: only
            where this process may use no more CPUs than such workers and one: there, Linux
            puts two workers woken at once on the same CPU while this process waits on the
            other, and they step one after the other.
        restart: replace a worker that dies (or whose environment raises) by a new actor; the
            collect goes on with the others, then the workers lost in it are replaced at once
            (each on a thread of its own) and the new ones collect the lost columns together:
            the batch keeps its shape and column order (False: a dead worker closes the
            sampler and raises `parl.RemoteActorDiedError`). See `Restarts`.
        max_restarts: the most replacements of one worker within 10 minutes; one more
            failure stops the sampler (`SamplerWorkerError`, from the environment's error).
        restart_timeout: the longest wait, in seconds, for a free slot for a replacement;
            past it the sampler closes and raises `parl.RemoteActorDiedError`.

    Attributes:
        worker_cpus: the CPU of each pinned worker, by worker index (empty: none pinned).
    """

    _agent_on_workers = False
    _signal_timeout_s = 300.0
    """The longest wait for one step of a worker, or (in a worker) for the next actions."""
    _spin_s: tuple[float, float] | None = (200e-6, 200e-6)
    """The longest this process spins for a worker's step, and a worker for its next actions,
    before sleeping, where steps are handed over by flags in shared memory (None: one byte a
    step each way on the socket instead)."""
    _spin_adaptive = True
    _pin_caller = True
    """With pinned workers, collect on the last one's CPU (`_caller_cpu`); False: left free."""
    """Spin about as long as the other side usually takes (`FlagSignal`), not always `_spin_s`."""

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
        pin_workers: bool | None = None,
        *,
        restart: bool = False,
        max_restarts: int = 3,
        restart_timeout: float = 60.0,
    ) -> None:
        if alternating and num_workers < 2:
            raise ValueError(f"alternating=True needs two groups of workers, got {num_workers=}")
        super().__init__(
            env_fn,
            agent,
            num_workers,
            envs_per_worker,
            horizon,
            seed,
            address,
            restart=restart,
            max_restarts=max_restarts,
            restart_timeout=restart_timeout,
        )
        try:
            self._group.connect_signals(self._signal_timeout_s, self._spin_s, self._spin_adaptive)
        except BaseException:
            self.close()
            raise
        self.alternating = alternating
        self.worker_cpus = _worker_cpus(self._group.signals, pin_workers)
        half = (num_workers + 1) // 2
        workers = list(range(num_workers))
        self._groups = [workers[:half], workers[half:]] if alternating else [workers]

    def collect(self) -> Batch:
        """`horizon` steps of every worker, actions chosen here; one `Batch`.

        With `restart=True`, the workers lost during the collect are replaced once the
        others' columns are done, all at once, and their columns collected again by the new
        workers together (again, where one of them is lost meanwhile).
        """
        self._check_open()
        out = Rollout.allocate(self._group.batch_layout)
        steps: list[list[dict[str, np.ndarray]]] = []
        final_obs: dict[tuple[int, int], np.ndarray] = {}
        ended: list = []
        run = _Collect(self._group, self.horizon, out, self.worker_cpus)
        self._run(run, steps, final_obs, ended, self._groups)
        extras = _extras(steps)
        while run.lost:  # the lost workers' share again, by their replacements together
            members = sorted(run.lost)
            self._group.recover_all(run.lost)
            spans = [self._group.columns(w) for w in members]
            cols = [k for span in spans for k in range(span.start, span.stop)]
            final_obs = {key: obs for key, obs in final_obs.items() if key[1] not in cols}
            ended = [record for record in ended if record[1] not in cols]
            run = _Collect(self._group, self.horizon, out, self.worker_cpus, members=members)
            redo: list[list[dict[str, np.ndarray]]] = []
            self._run(run, redo, final_obs, ended, _runs(members))
            for name, value in _extras(redo).items():  # in the order of the members' columns
                extras[name][:, cols] = value
        arrays = out.arrays()
        return self._make_batch(arrays.pop("obs"), arrays, extras, final_obs, ended)

    def _run(
        self, run: _Collect, steps: list, final_obs: dict, ended: list, groups: list[list[int]]
    ) -> None:
        """The steps of `run` (its workers in `groups`), every worker in step if it fails."""
        try:  # signalled workers wait on this thread's wake-ups: short slices meanwhile
            with (
                short_slice() if run.signals else contextlib.nullcontext(),
                _on_cpu(self._caller_cpu()),
            ):
                self._steps(run, steps, final_obs, ended, groups)
        except BaseException:
            run.abort()
            raise

    def _caller_cpu(self) -> int | None:
        """The CPU this thread collects on: the last pinned worker's (None: not pinned).

        It wakes the workers in order, so the one that shares its CPU is woken last, after
        every other is already running elsewhere (woken first, it could take the CPU before
        the others are woken). Alternating groups step while this thread chooses: it stays
        free to go where a worker waits.
        """
        if not self.worker_cpus or not self._pin_caller or self.alternating:
            return None
        return self.worker_cpus[max(self.worker_cpus)]

    def _steps(
        self, run: _Collect, steps: list, final_obs: dict, ended: list, groups: list[list[int]]
    ) -> None:
        """The collect's steps: each group's actions chosen while the other group steps."""
        group, agent, out = self._group, self.agent, run.out
        _, act_shape, act_dtype = group.batch_layout[1]
        columns = [
            slice(group.columns(members[0]).start, group.columns(members[-1]).stop)
            for members in groups
        ]
        run.begin()
        for t in range(self.horizon):
            parts = []
            for members, cols in zip(groups, columns, strict=True):
                if t:
                    run.finish_step(t - 1, members, final_obs, ended)
                actions, extras = act(agent, out.obs[t, cols], act_shape[2:], act_dtype)
                out.actions[t, cols] = actions
                parts.append(extras)
                run.start_step(t, members)
            steps.append(parts)
        for members in groups:
            run.finish_step(self.horizon - 1, members, final_obs, ended)
        run.end(final_obs, ended)


def _extras(steps: list[list[dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """The extras of a collect's steps (a part a group each step), `[horizon, B, ...]` each."""
    return stack_extras(
        [
            parts[0]
            if len(parts) == 1
            else {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
            for parts in steps
        ]
    )


def _runs(members: list[int]) -> list[list[int]]:
    """`members` (sorted) in runs of consecutive indices: groups whose columns are one span."""
    runs: list[list[int]] = []
    for w in members:
        if runs and runs[-1][-1] == w - 1:
            runs[-1].append(w)
        else:
            runs.append([w])
    return runs


def _worker_cpus(signals: list, pin: bool | None) -> dict[int, int]:
    """A CPU for each signalled worker (one on this host), where `pin` says so (None: scarce)."""
    signalled = [w for w, signal in enumerate(signals) if signal is not None]
    if pin is False or not signalled or not hasattr(os, "sched_getaffinity"):
        return {}
    cpus = sorted(os.sched_getaffinity(0))
    if pin is None and len(cpus) > len(signalled) + 1:
        return {}
    return {w: cpus[k % len(cpus)] for k, w in enumerate(signalled)}


class _Collect:
    """One collect of a `CentralSampler` on the workers: signalled ones and called ones.

    Keeps what each signalled worker is owed, so that a collect given up halfway (an error
    here, in the agent, or in another worker) leaves every signal in step for the next one.
    A step of a worker with shared memory copies its observations here (what the agent reads
    next); its rewards and flags are copied once, at the end. With restarts, a worker that
    fails is left out of the rest of the collect (`lost`, with its error), its columns'
    observations zeros; once it ends, the sampler replaces the lost workers at once
    (`WorkerGroup.recover_all`) and collects their columns again with the new ones.
    """

    def __init__(
        self,
        group: WorkerGroup,
        horizon: int,
        out: Rollout,
        cpus: dict[int, int],
        members: list[int] | None = None,
    ) -> None:
        self.group = group
        self.cpus = cpus
        self.horizon = horizon
        self.out = out
        workers = range(len(group.workers)) if members is None else members
        self.workers = list(workers)
        self.shared = {w: r for w in workers if (r := group.shared_rollout(w, 0)) is not None}
        self.cols = {w: group.columns(w) for w in workers}
        self.signals = {w: s for w in workers if (s := group.signals[w]) is not None}
        self.drives: dict[int, Any] = {}
        self.pending: dict[int, Any] = {}  # a step call of a called worker
        self.awaiting: set[int] = set()  # signalled workers whose READY is still to come
        self.sent = dict.fromkeys(self.signals, 0)  # STEP bytes sent to each
        self.lost: dict[int, BaseException] = {}  # workers failed in it, to replace (restarts)

    def begin(self) -> None:
        """Start every worker's rollout; write the first observations into `out.obs[0]`."""
        group, out = self.group, self.out
        for w in self.signals:
            self.drives[w] = group.workers[w].drive(0, self.cpus.get(w))
            self.awaiting.add(w)
        slow = [w for w in self.workers if w not in self.drives]
        starts = {w: group.workers[w].begin(0) for w in slow}
        try:
            for w in slow:
                start = self._get(w, starts.pop(w))
                if w not in self.lost:
                    out.obs[0, self.cols[w]] = (
                        start if w not in self.shared else self.shared[w].obs[0]
                    )
        finally:
            starts.clear()  # a pending future holds its actor
        for w in list(self.signals):
            if self._wait_ready(w):
                out.obs[0, self.cols[w]] = self.shared[w].obs[0]

    def start_step(self, t: int, members: list[int]) -> None:
        """Hand the members their actions of step `t` (written in `out.actions[t]`)."""
        group, actions = self.group, self.out.actions[t]
        posted = []
        for w in members:
            if w in self.lost:
                continue
            shared = self.shared.get(w)
            if shared is None:
                self.pending[w] = group.workers[w].step(t, actions[self.cols[w]])
                continue
            shared.actions[t] = actions[self.cols[w]]
            signal = self.signals.get(w)
            if signal is not None:
                if isinstance(signal, FlagSignal):
                    signal.post(STEP)
                    posted.append(signal)
                else:
                    signal.send(STEP)
                self.sent[w] += 1
                self.awaiting.add(w)
            else:
                self.pending[w] = group.workers[w].step(t)
        for signal in posted:  # every worker's flag is up before the first of them runs
            signal.wake()

    def finish_step(self, t: int, members: list[int], final_obs: dict, ended: list) -> None:
        """Wait for the members' step `t`; write its observations (called: all its rows)."""
        group, out = self.group, self.out
        for w in members:
            if w in self.lost:
                continue
            cols = self.cols[w]
            if w in self.drives:
                if not self._wait_ready(w):
                    continue
            else:
                step = self._get(w, self.pending.pop(w))
                if w in self.lost:
                    continue
                rows, worker_final, worker_ended = step
                more_final, more_ended = group.records(w, 0, worker_final, worker_ended, cols.start)
                final_obs.update(more_final)
                ended += more_ended
                if rows is not None:
                    out.obs[t + 1, cols] = rows["obs"]
                    out.rewards[t, cols] = rows["rewards"]
                    out.terminated[t, cols] = rows["terminated"]
                    out.truncated[t, cols] = rows["truncated"]
                    continue
            out.obs[t + 1, cols] = self.shared[w].obs[t + 1]

    def end(self, final_obs: dict, ended: list) -> None:
        """Copy the shared workers' rewards and flags; take the signalled ones' episode records."""
        group, out = self.group, self.out
        for w in list(self.drives):
            records = self._get(w, self.drives.pop(w))
            if w not in self.lost:
                more_final, more_ended = group.records(w, 0, *records, self.cols[w].start)
                final_obs.update(more_final)
                ended += more_ended
        for w, shared in self.shared.items():
            if w in self.lost:
                continue
            cols = self.cols[w]
            out.rewards[:, cols] = shared.rewards
            out.terminated[:, cols] = shared.terminated
            out.truncated[:, cols] = shared.truncated

    def _get(self, w: int, future: Any) -> Any:
        """The result of a call on worker `w`; a failure as `_lose` takes it (None: lost)."""
        try:
            return future.get()
        except RemoteError as exc:
            error = exc
        del future  # an error raised from here keeps this frame: not the call, nor its actor
        try:
            self._lose(w, error)
        finally:
            del error  # the error's traceback holds this frame: no cycle to wait for
        return None

    def _lose(self, w: int, exc: BaseException) -> None:
        """Worker `w` failed with `exc`: raise (`WorkerGroup.fail`), or leave it out and go on.

        With restarts the collect goes on without it, its columns reading zeros, and the
        sampler replaces it once the collect ends (with every worker lost in it, at once).
        """
        group = self.group
        for calls in (self.drives, self.pending):
            calls.pop(w, None)
        self.awaiting.discard(w)
        self.signals.pop(w, None)
        self.shared.pop(w, None)
        self.sent.pop(w, None)
        if not group.policy.restart:
            if group.signals[w] is not None and _machine_fault(exc):
                group.close()  # the signal is out of step for good
            group.fail(w, exc)
        self.lost[w] = exc.with_traceback(None)  # its frames would hold the failed call
        self.out.obs[:, self.cols[w]] = 0

    def _wait_ready(self, w: int) -> bool:
        """Worker `w`'s READY (False: it failed, and is lost); else raise as `_lose` does."""
        group = self.group
        signal = group.signals[w]
        try:
            byte = signal.recv()
        except SignalClosed as exc:
            closed = str(exc)
        else:
            closed = None
        self.awaiting.discard(w)
        if closed is not None:
            future = self.drives.pop(w)
            error: BaseException = RemoteActorDiedError(closed)
            try:  # the call says why, once the cluster knows
                future.get(timeout=30.0)
            except TimeoutError:
                pass
            except BaseException as call_error:
                error = call_error
            del future
            if not group.policy.restart:
                group.close()  # the signal is out of step for good
            try:
                self._lose(w, error)  # a death as RemoteActorDiedError naming the worker
            finally:
                del error
            return False
        if byte == READY:
            return True
        if byte == ERROR:  # raises the worker's error, or leaves the worker out
            self._get(w, self.drives.pop(w))
            if w in self.lost:
                return False
        self.drives.pop(w)
        group.close()  # not a byte of ours: the signal cannot be trusted any more
        raise RuntimeError(f"worker {w} sent {byte!r} on its step signal, not a step's end")

    def abort(self) -> None:
        """Bring every signalled worker still in this collect to its end (bounded waits)."""
        group = self.group
        self.pending.clear()
        drives, self.drives = self.drives, {}
        try:
            for w, future in drives.items():
                signal = group.signals[w] if group.workers else None
                if signal is None:
                    continue  # the group is closed already
                try:
                    byte = signal.recv() if w in self.awaiting else READY
                    if byte == READY and self.sent[w] < self.horizon:
                        signal.send(ABORT)
                    future.get(timeout=signal.timeout)
                except Exception:  # out of step for good: nothing more can be collected
                    group.close()
        finally:
            drives.clear()  # a pending future holds its actor
