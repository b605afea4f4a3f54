"""`AsyncSampler`: workers keep collecting in the background while the caller learns.

Each worker has `slots` rollout slots (two by default) and always a `collect` call queued for
each (calls to an actor run in the order they were sent): while the caller reads one slot, the
worker fills the other. A waiter thread per worker resolves its calls in order and hands the
finished ones to one queue; `collect()` takes the next from any worker, copies it out, and
queues that slot's next collect. Every slot is a batch that may wait, finished, for the caller:
more slots keep the workers busier, fewer keep the batches fresher (their policy lag, counted in
`sync_weights()` calls, is about `num_workers * slots` when the caller is the slower side).

With `restart=True` a worker's waiter is also what replaces it: the first of its calls to fail
(the actor's connection closed, its death known) starts the replacement on that thread at
once, whether or not the caller is asking for a batch, and the caller goes on with the other
workers' batches meanwhile. The lost worker's batches, finished or under way, are dropped (their
`generation` is past); the new worker's slots are queued once it is ready, with the weights of
the last `sync_weights()`. One lock (the group's) covers what both threads touch: a worker's
memory while the caller copies a batch out of it, its actor handle and its queue.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from parl_algos.samplers._core import Batch, Rollout
from parl_algos.samplers._group import SamplerWorkerError, _ClosedMeanwhile
from parl_algos.samplers._parallel import _ClusterSampler
from parl_remote import RemoteActorDiedError

__all__ = ["AsyncSampler", "lower_priority"]

_STOP = object()
_JOIN_S = 5.0
"""The longest `close()` waits for a waiter thread (one replacing its worker may wait longer
for a slot: it frees what it made once it ends)."""


def lower_priority(nice: int) -> None:
    """Run this process at niceness `nice` or lower priority; its autogroup too, if it leads one.

    Linux with autogroups (`/proc/sys/kernel/sched_autogroup_enabled`) first shares the CPU
    fairly between sessions and only then by niceness within each; an actor's process is the
    leader of a session of its own, so its autogroup's niceness is what ranks it against the
    learner's session. A session led by another process is left alone (its other processes
    are not this one's to slow down). Where the system has neither, nothing changes.
    """
    with contextlib.suppress(OSError, AttributeError):  # other systems
        if os.getpriority(os.PRIO_PROCESS, 0) < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    if os.getsid(0) != os.getpid():
        return
    with contextlib.suppress(OSError):  # no autogroups (disabled, or not Linux)
        with open("/proc/self/autogroup", encoding="ascii") as f:
            match = re.search(r"nice (-?\d+)", f.read())
        if match is not None and int(match.group(1)) < nice:
            with open("/proc/self/autogroup", "w", encoding="ascii") as f:
                f.write(str(nice))


class _LowPriority:
    """`env_fn` that first lowers the priority of a process other than the sampler's own."""

    def __init__(self, env_fn: Callable[[], gym.Env], nice: int) -> None:
        self.env_fn = env_fn
        self.nice = nice
        self.sampler_pid = os.getpid()

    def __call__(self) -> gym.Env:
        if os.getpid() != self.sampler_pid:  # a worker's process, not the caller's
            lower_priority(self.nice)
        return self.env_fn()


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
        slots: rollouts each worker has under way or finished at once (at least 1). With
            several workers one slot each keeps the caller fed while its learning step lasts
            as long as a worker's rollout, at half the policy lag of two.
        worker_nice: the niceness the workers' processes run at (`lower_priority`), so that
            on a busy machine the caller's learning, which bounds the rate where the workers
            wait for their slots to be read, comes before their collecting; 0 leaves them be.
        restart: replace a worker that dies (or whose environment raises) by a new actor with
            the weights of the last `sync_weights()`; the batches the lost worker had under
            way are dropped (False: a dead worker closes the sampler and raises
            `parl.RemoteActorDiedError`). See `Restarts`.
        max_restarts: the most replacements of one worker within 10 minutes; one more
            failure stops the sampler (`SamplerWorkerError`, from the environment's error).
        restart_timeout: the longest wait, in seconds, for a free slot for a replacement;
            past it the sampler goes on with the other workers (and says so in the log).
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: Any,
        num_workers: int = 2,
        envs_per_worker: int = 8,
        horizon: int = 32,
        seed: int | None = 0,
        address: str | None = None,
        slots: int = 2,
        worker_nice: int = 0,
        *,
        restart: bool = False,
        max_restarts: int = 3,
        restart_timeout: float = 60.0,
    ) -> None:
        if slots < 1:
            raise ValueError(f"AsyncSampler: slots={slots} must be at least 1")
        self._slots = slots
        if worker_nice > 0:
            env_fn = _LowPriority(env_fn, worker_nice)
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
        self._generation = [0] * num_workers  # bumped when a worker is lost
        self._replacing = [False] * num_workers  # its waiter is replacing it
        self._behind = [False] * num_workers  # weights sent while it was being replaced
        self._finished: queue.Queue[tuple[int, int | None, Any, Any]] = queue.Queue()
        self._inboxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(num_workers)]
        self._stopping = False
        self._fatal: BaseException | None = None  # a replacement's error, for the caller
        self._lock = self._group.lock
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
        future = self._group.workers[w].collect(slot)
        self._inboxes[w].put((self._generation[w], slot, future))

    def _wait(self, w: int) -> None:
        """Resolve worker `w`'s calls in the order they were made (a thread per worker).

        With restarts, the first call to fail replaces the worker (`_replace`), on this thread.
        """
        inbox = self._inboxes[w]
        while True:
            item = inbox.get()
            if item is _STOP:
                return
            generation, slot, future = item
            del item
            try:
                result: Any = future.get()
            except BaseException as exc:  # handed to the caller's thread
                result = exc.with_traceback(None)  # its frames hold the call, and its actor
            del future  # a pending future keeps its actor alive
            if self._stopping or generation != self._generation[w]:
                continue  # a call of a worker since lost: dropped
            if isinstance(result, BaseException) and self._group.policy.restart:
                if not self._replace(w, result):
                    return
            elif slot is not None or isinstance(result, BaseException):
                if slot is not None and not isinstance(result, BaseException):
                    self._group.collected(w)  # a replacement's first batch: its timings
                self._finished.put((w, generation, slot, result))

    def _replace(self, w: int, exc: BaseException) -> bool:
        """Replace worker `w`, whose call raised `exc` (its waiter's thread); False: stop waiting.

        Its calls still queued are the dead actor's: they go first, so that its handle is the
        last one and its slot frees. An error that stops the sampler (past `max_restarts`, no
        slot for the last worker) is the caller's: its next call raises it (`_check_open`).
        """
        inbox = self._inboxes[w]
        with self._lock:
            self._generation[w] += 1
            self._replacing[w] = True
            with contextlib.suppress(queue.Empty):
                while True:  # the dead actor's calls (and _STOP, once closing): the caller
                    inbox.get_nowait()  # queues no more for `w` while it is replaced
        replaced = False
        try:
            replaced = self._group.recover(w, exc, required=False)
        except BaseException as error:  # the group closed itself
            # One that only found the group closed by another waiter's error leaves that be.
            secondary = isinstance(error, _ClosedMeanwhile) and self._fatal is not None
            if not self._stopping and not secondary:
                self._fatal = error.with_traceback(None)
                self._finished.put((w, None, None, None))  # wakes a caller waiting for a batch
        finally:
            del exc
            with self._lock:
                self._replacing[w] = False
                if self._stopping:  # closed during the replacement: what it made goes too
                    self._group.close()
                elif replaced:
                    if self._behind[w]:
                        self._send_weights(w)
                    for slot in range(self._slots):
                        self._start(w, slot)
                self._behind[w] = False
        return replaced and not self._stopping

    def _check_open(self) -> None:
        fatal, self._fatal = self._fatal, None
        if fatal is not None:  # a replacement's error, which closed the group
            self.close()
            raise fatal
        super()._check_open()

    def collect(self) -> Batch:
        """The next batch any worker finished (blocks until one has)."""
        self._check_open()
        while True:
            w, generation, slot, result = self._finished.get()
            if generation is None:  # a replacement failed: the sampler stops
                self._check_open()
                continue  # its error was raised by `sync_weights` already: the sampler is closed
            with self._lock:
                if self._group.closed:  # its memory is freed: by `close()`, or by a waiter
                    if self._stopping:  # whose replacement failed (its wake-up comes next)
                        self._check_open()
                    continue
                if generation != self._generation[w]:
                    continue  # the call of a worker since lost: its batch is dropped
                if not isinstance(result, BaseException):
                    arrays, extras, final_obs, ended, version = result
                    out = Rollout.allocate(self._group.layout)
                    self._group.copy_out(w, arrays, slot, out, slice(None))
                    final_obs, ended = self._group.records(w, slot, final_obs, ended, 0)
                    self._start(w, slot)  # the slot is read: the worker may fill it again
                    arrays = out.arrays()
                    return self._make_batch(
                        arrays.pop("obs"),
                        arrays,
                        extras,
                        final_obs,
                        ended,
                        worker=w,
                        weights_version=version,
                    )
            # Without restarts (with them, the worker's waiter replaced it): the sampler closes.
            try:
                self._group.recover(w, result, required=False)
            except (RemoteActorDiedError, SamplerWorkerError):
                self.close()
                raise
            raise result  # not reached: without restarts `recover` raises

    def sync_weights(self) -> None:
        """Send `agent.get_weights()` to every worker; their next rollouts carry the new version.

        Does not wait: each worker loads the weights after the rollout it is collecting. A
        worker being replaced gets them once it is ready.
        """
        self._check_open()
        weights = self.agent.get_weights()
        with self._lock:
            self.weights_version += 1
            self._group.weights = weights, self.weights_version  # what a replacement gets
            for w in range(self.num_workers):
                if self._replacing[w]:
                    self._behind[w] = True
                elif self._group.workers[w] is not None:
                    self._send_weights(w)

    def _send_weights(self, w: int) -> None:
        assert self._group.weights is not None
        weights, version = self._group.weights
        future = self._group.workers[w].set_weights(weights, version)
        self._inboxes[w].put((self._generation[w], None, future))

    def close(self) -> None:
        """Stop the workers, free every actor and segment; calling it again does nothing.

        A replacement under way ends with them (bounded: at most its placement's wait).
        """
        with self._lock:
            self._stopping = True
            for inbox in self._inboxes:
                inbox.put(_STOP)
            super().close()
        for waiter in self._waiters:
            if waiter is not threading.current_thread():
                waiter.join(_JOIN_S)
