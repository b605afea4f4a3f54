"""The worker actors of a cluster sampler, their data plane, and what a dead worker means.

`WorkerGroup` creates the workers (all at once), asks each for its spaces and host, gives every
worker on this host shared-memory segments to write its rollouts into (`_arrays`, on
`parl_remote.shm`'s segments), and gathers the
results of calls made on all workers. Where every worker is on this host, it can also keep a
pool of whole-batch segments (`batches`) that all workers write their columns into at once.

What a failed worker means is `Restarts`' to say. Without restarts, a worker that dies turns
into `parl.RemoteActorDiedError` naming it, after the group freed every actor and segment, and
an error of the worker's own code (its environment's) is raised as it is. With restarts, the
group replaces the worker by a new actor of the same index: it gets the weights last sent to
the workers and their version, segments and a step signal of its own, and environments seeded
from a stream of their own; the caller makes the lost call again on it (`run`). The workers lost
in one `run` are replaced at once, each on a thread of its own from the moment its loss is seen;
`recover_all` replaces the workers a caller lost at once too.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

import parl
from parl_algos.samplers._arrays import ArrayPool, SharedArrays
from parl_algos.samplers._core import Rollout, read_records, rollout_layout, segment_layout
from parl_algos.samplers._worker import RemoteEnvWorker
from parl_remote import (
    ClusterError,
    MasterUnreachableError,
    RemoteActorDiedError,
    RemoteError,
    ResourceError,
    replacing,
)
from parl_remote.shm import (
    FlagSignal,
    Signal,
    SignalListener,
    flags_available,
    host_id,
    shm_available,
    sweep_dead_owners,
)

__all__ = [
    "RESTART_SEED_STRIDE",
    "Replacements",
    "RestartWindow",
    "Restarts",
    "SamplerWorkerError",
    "WorkerGroup",
    "connect",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

RESTART_SEED_STRIDE = 1_000_003
"""A replaced worker's column `k` is first reset with `seed + k + RESTART_SEED_STRIDE * r`, where
`r` is how many times that worker was replaced: a stream apart from every other column's."""


class SamplerWorkerError(RuntimeError):
    """A worker's own code (its environment) kept failing: more than `max_restarts` times.

    Its `__cause__` is the last failure, with the worker's traceback (in its notes).

    Attributes:
        worker: the worker's index.
        failures: its failures within `window_s`.
        max_restarts: the sampler's `max_restarts`.
        window_s: the window of `max_restarts`, in seconds.
    """

    def __init__(
        self, message: str, *, worker: int, failures: int, max_restarts: int, window_s: float
    ) -> None:
        super().__init__(message)
        self.worker, self.failures = worker, failures
        self.max_restarts, self.window_s = max_restarts, window_s


class _ClosedMeanwhile(RemoteActorDiedError):
    """A replacement found its group closed by another thread (whose error, or close, counts)."""


def _closed_meanwhile(owner: str, w: int) -> _ClosedMeanwhile:
    return _ClosedMeanwhile(
        f"{owner}: worker {w} died, and the sampler was closed while it was being replaced"
    )


@dataclass(frozen=True)
class Restarts:
    """What a sampler does with a worker that dies or whose environment raises.

    Args:
        restart: replace the worker by a new actor (False: a dead worker closes the sampler
            and raises `parl.RemoteActorDiedError`; an environment's error is raised as it is).
        max_restarts: the most replacements of one worker within `window_s`; one more failure
            in that window stops the sampler (`SamplerWorkerError` for an environment that
            raised, `parl.RemoteActorDiedError` for a worker that died).
        restart_timeout: the longest wait for a free slot for the new actor, or for the
            master while it cannot be reached (restarting); past it, more by at most one
            placement wait of the cluster, `PARL_RESOURCE_WAIT_S`.
        window_s: the sliding window of `max_restarts`, in seconds.
    """

    restart: bool = False
    max_restarts: int = 3
    restart_timeout: float = 60.0
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if not isinstance(self.restart, bool):
            raise TypeError(f"restart={self.restart!r} must be True or False")
        if (
            not isinstance(self.max_restarts, int)
            or isinstance(self.max_restarts, bool)
            or self.max_restarts < 0
        ):
            raise ValueError(f"max_restarts={self.max_restarts!r} must be an integer >= 0")
        if not self.restart_timeout > 0:
            raise ValueError(f"restart_timeout={self.restart_timeout!r} must be a positive number")


class RestartWindow:
    """One actor's failures in a sliding window: at most `max_restarts` replacements in it.

    Args:
        max_restarts: the most replacements within `window_s`.
        window_s: the window, in seconds.
    """

    def __init__(self, max_restarts: int, window_s: float = 600.0) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.failures = 0
        """The failures within the window, the last one `failed()` counted included."""
        self._times: collections.deque[float] = collections.deque()

    def failed(self) -> bool:
        """Count a failure now; whether a replacement is still allowed (else: stop)."""
        now = time.monotonic()
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()
        self.failures = len(self._times) + 1
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True


class Replacements:
    """The replacements of a loop's actors: each index's deaths within a `RestartWindow` of its own.

    `replacements.replace(i, exc, make)` replaces actor `i`, which died with `exc`: it raises
    `parl.RemoteActorDiedError` where actor `i` failed more than `max_restarts` times within
    the window; else it returns `make(r)`, the `r`-th replacement of `i` (`r` from 1: a seed
    stream of its own). The caller lets the dead actor's handle go first (its slot is freed).
    A replacement that fails as it starts (`make` raises a `parl.RemoteError`: it was killed
    while it started, or its environment raised as it was made) is one more failure of `i`,
    and is made again; where no slot is free, or the master cannot be reached, it is tried
    again until `restart_timeout`, then that error is raised. Once one is made, the loss is
    one log line, `NAME (pid P on H) died: REASON; replaced in X s`, naming the actor that
    died last (a failed replacement's, after retries).

    Args:
        name: how actor `i` is named, a format string of `i` (e.g. `"R2D2: actor {i}"`).
        max_restarts: the most replacements of one actor within `window_s`.
        setting: the name of `max_restarts` for the user (e.g. `"train.max_restarts"`).
        window_s: the window, in seconds.
        restart_timeout: the longest wait for a slot, or for the master, for one replacement.
    """

    def __init__(
        self,
        name: str,
        max_restarts: int,
        *,
        setting: str = "max_restarts",
        window_s: float = 600.0,
        restart_timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.max_restarts = max_restarts
        self.setting = setting
        self.window_s = window_s
        self.restart_timeout = restart_timeout
        self.total = 0
        """Replacements made so far, of every actor."""
        self._windows: dict[int, RestartWindow] = {}
        self._counts: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()  # loops replace their actors from threads of their own

    def count(self, i: int) -> int:
        """How many times actor `i` was replaced."""
        return self._counts[i]

    def replace(self, i: int, exc: BaseException, make: Callable[[int], _T], note: str = "") -> _T:
        """Replace actor `i`, which died with `exc`, by `make(r)` (see the class).

        `note` ends the log line.
        """
        started = time.monotonic()
        self._failed(i, exc)
        deadline = started + self.restart_timeout
        while True:
            try:
                with replacing(exc.actor_id if isinstance(exc, RemoteError) else ""):
                    made = make(self._counts[i] + 1)
                break
            except (ResourceError, MasterUnreachableError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)  # the client reconnects by itself; slots free as actors end
            except RemoteError as again:  # the replacement failed as it started
                again.with_traceback(None)  # its frames hold the failed replacement
                logger.warning(
                    "%s's replacement failed as it started (%s); once more",
                    self.name.format(i=i), _why(again),
                )  # fmt: skip
                exc = again
                self._failed(i, exc)
        with self._lock:
            self._counts[i] += 1
            self.total += 1
        logger.warning(
            "%s%s died: %s; replaced in %.1f s%s",
            self.name.format(i=i), _where(exc), _why(exc), time.monotonic() - started, note,
        )  # fmt: skip
        return made

    def _failed(self, i: int, exc: BaseException) -> None:
        """Count a failure of actor `i`; past `max_restarts` in the window, raise."""
        with self._lock:
            window = self._windows.setdefault(i, RestartWindow(self.max_restarts, self.window_s))
            allowed = window.failed()
        if allowed:
            return
        who = self.name.format(i=i)
        if _machine_fault(exc):
            raise RemoteActorDiedError(
                f"{who} died {window.failures} times within {self.window_s:g} s "
                f"({self.setting}={self.max_restarts}), the last time: {exc}"
            ) from None
        raise RemoteActorDiedError(
            f"{who} failed {window.failures} times within {self.window_s:g} s "
            f"({self.setting}={self.max_restarts}), the last time as its replacement started, "
            f"with {type(exc).__name__}: {exc}"
        ) from exc


def connect(address: str | None, cpu_num: int) -> None:
    """Join the cluster at `address`; None: the current one, or a local one of `cpu_num` slots."""
    if address is not None:
        parl.connect(address)
        return
    try:
        parl.connect(cpu_num=cpu_num)
    except ClusterError:  # already connected, to a cluster of other size or elsewhere
        parl.connect()


def _machine_fault(exc: BaseException) -> bool:
    """Whether a call's error says its worker is gone (not that the worker's own code raised)."""
    return isinstance(exc, RemoteError) and type(exc) in (RemoteError, RemoteActorDiedError)


def _second(item: tuple[str, float]) -> float:
    return item[1]


def _what(exc: BaseException) -> str:
    """What befell a worker whose call (or start) raised `exc`: `died: ...` or `failed: ...`."""
    if _machine_fault(exc) or type(exc) is ClusterError:  # a ClusterError: died as it started
        return f"died: {_why(exc)}"
    return f"failed: {type(exc).__name__}: {exc}"


def _dead(exc: BaseException) -> tuple[int, str] | None:
    """`(pid, host name)` of the dead actor a call's error names, or None where it names none."""
    match = re.search(r"\(pid (\d+) on ([^)]*)\)", str(exc))
    return (int(match.group(1)), match.group(2)) if match else None


def _where(exc: BaseException) -> str:
    """` (pid P on H)` of the dead actor a call's error names, or nothing where it names none."""
    where = _dead(exc)
    return "" if where is None else f" (pid {where[0]} on {where[1]})"


def _why(exc: BaseException) -> str:
    """The reason a dead actor's error gives (`... died: REASON. This call ...`), or the error."""
    match = re.search(r"died: (.+?)\. This call", str(exc))
    return match.group(1) if match else str(exc)


class WorkerGroup:
    """`num_workers` `EnvWorker` actors of one sampler.

    Args:
        owner: the sampler's name, for error messages.
        env_fn, agent, envs_per_worker, horizon, seed, slots: as `EnvWorker` takes them (the
            agent is None for workers that only step environments).
        num_workers: how many workers.
        address: the cluster (None: the current one, or a local one).
        batch_segments: the most whole-batch segments `batches` makes (0: no pool).
        restarts: what a failed worker means (default: no replacement).
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
        restarts: Restarts | None = None,
    ) -> None:
        self.owner = owner
        self.envs_per_worker = envs_per_worker
        self.policy = restarts if restarts is not None else Restarts()
        self.workers: list[Any] = []
        """The worker actors by index; None where one was lost and not replaced."""
        self.segments: list[list[SharedArrays] | None] = [None] * num_workers
        self.signals: list[Signal | FlagSignal | None] = [None] * num_workers
        self.batches: ArrayPool | None = None
        """Segments of `batch_layout` that the workers write their columns into (`EnvWorker.
        collect`'s `batch`): where every worker has shared memory and `batch_segments` > 0."""
        self.restarts = 0
        """Workers replaced so far, all together."""
        self.weights: tuple[Any, int] | None = None
        """The weights last sent to the workers and their version: a new worker's."""
        self.where: list[tuple[int, str]] = [(0, "")] * num_workers
        """Each worker's `(pid, host name)`."""
        self._replaced = [0] * num_workers  # replacements of each worker, ever: its seed stream
        self._failures = [
            RestartWindow(self.policy.max_restarts, self.policy.window_s)
            for _ in range(num_workers)
        ]
        self._signal_args: tuple[Any, ...] | None = None  # connect_signals' arguments
        self._timings: dict[int, dict[str, float]] = {}  # replacements not yet delivering
        self._starting: set[int] = set()  # the workers `_replace` sets up (from threads)
        self.lock = threading.RLock()
        """Held by `close()`: a sampler that replaces its workers from threads of its own
        holds it while it reads a worker's memory, so that no close frees it meanwhile."""
        self.closed = False
        """Whether `close()` ran (a replacement waiting for a slot then gives up)."""
        connect(address, num_workers)

        def create(index: int, replaced: int = 0) -> Any:
            stream = None if seed is None else seed + RESTART_SEED_STRIDE * replaced
            return RemoteEnvWorker(env_fn, agent, index, envs_per_worker, horizon, stream, slots)

        self._create = create
        self._built = False  # the first workers are made and described
        lost: dict[int, RemoteError] = {}  # the workers killed as they were first made

        def first(w: int) -> Any:
            try:
                return create(w)
            except RemoteError as exc:
                # Its process died as it started (before it was placed: a ClusterError); not
                # its environment raising, no slot, nor the master or the token refusing.
                died = _machine_fault(exc) or type(exc) is ClusterError
                if not self.policy.restart or not died:
                    raise
                lost[w] = exc.with_traceback(None)
                return None

        # The first alone, then the others at once: the first call also builds the code
        # bundle that every actor of this client receives.
        created = [first(0)]
        if num_workers > 1:
            with ThreadPoolExecutor(num_workers - 1, thread_name_prefix="sampler-create") as pool:
                futures = [pool.submit(first, w) for w in range(1, num_workers)]
                try:
                    created += [future.result() for future in futures]
                except BaseException:
                    del created  # the actors made so far go with their handles
                    raise
        self.workers = created
        self.recover_all(lost)  # replaced as any workers that die are
        # A worker that dies now is replaced too (`run`): the run does not end as it starts.
        descriptions = self.run(lambda worker, w: worker.describe())
        self.observation_space, self.action_space = descriptions[0][:2]
        self.where = [(pid, name) for *_, pid, name in descriptions]
        self.layout = rollout_layout(
            horizon, envs_per_worker, self.observation_space, self.action_space
        )
        self.batch_layout = rollout_layout(
            horizon, num_workers * envs_per_worker, self.observation_space, self.action_space
        )
        self._slots = slots
        self._built = True
        self._share_memory({w: host for w, (_, _, host, *_) in enumerate(descriptions)})
        if batch_segments > 0 and all(self.shared):
            self.batches = ArrayPool(self.batch_layout, batch_segments)

    def _share_memory(self, hosts: dict[int, str]) -> None:
        """Offer segments to the workers `hosts` names (by index) that are on this host."""
        here = host_id()
        if not shm_available():
            return
        sweep_dead_owners()  # named segments that owners of earlier versions left behind
        offered: dict[int, list[SharedArrays]] = {}
        try:
            for w, host in hosts.items():
                if host == here:
                    offered[w] = [
                        SharedArrays.create(segment_layout(self.layout)) for _ in range(self._slots)
                    ]
            calls = {
                w: self.workers[w].attach([tuple(segment.ref) for segment in segments])
                for w, segments in offered.items()
            }
            accepted = dict(zip(calls, self.gather(list(calls.values()), list(calls)), strict=True))
        except BaseException:
            for segments in offered.values():
                _free(segments)
            raise
        for w, segments in offered.items():
            with self.lock:
                if accepted[w] and not self.closed:
                    self.segments[w] = segments
                    continue
            _free(segments)  # on another host after all, or the group closed meanwhile

    def connect_signals(
        self,
        timeout: float,
        spin_s: tuple[float, float] | None = None,
        adaptive: bool = True,
        members: list[int] | None = None,
    ) -> None:
        """Give every worker with shared memory a step signal; `timeout`: its waits.

        With `spin_s` (the sampler's spin, the workers' spin: the longest where `adaptive`)
        and where `flags_available()`, steps are handed over by flags in the segments
        (`FlagSignal`), the socket only watched; else one byte a step on the socket (`Signal`).
        A worker that cannot connect keeps to step calls. `members`: only these workers (a
        replaced one gets its signal so).
        """
        self._signal_args = (timeout, spin_s, adaptive)
        candidates = range(len(self.segments)) if members is None else members
        members = [w for w in candidates if self.segments[w] is not None]
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
                    words = segments[0].arrays["flags"]  # a view that keeps the segment mapped
                    self.signals[w] = FlagSignal(
                        signal, words, sampler=True, spin_s=spin_s[0], adaptive=adaptive
                    )
                else:
                    self.signals[w] = signal
        finally:
            listener.close()

    @property
    def live(self) -> list[int]:
        """The indices of the workers there are (all but those lost and not replaced)."""
        return [w for w, worker in enumerate(self.workers) if worker is not None]

    def run(self, call: Callable[[Any, int], Any], indices: list[int] | None = None) -> list[Any]:
        """`call(worker, w)` made on each worker (`indices`; default every live one); results.

        A worker whose call failed is replaced where the restarts allow (`recover`), and the
        call made again on the new one; else the failure is raised as `fail` raises it. Each
        replacement starts on a thread of its own as soon as its worker's failure is seen,
        while the other workers' calls are waited for: workers lost in one round are
        replaced at once, not one after the other. Where some of them raise, the caller gets
        the error of the lowest index, one that only found the group closed by another coming
        last.
        """
        indices = self.live if indices is None else indices
        futures = {w: call(self.workers[w], w) for w in indices}
        results: dict[int, Any] = {}
        redone: dict[int, Future[Any]] = {}  # the failed workers' replacements, each its call
        pool: ThreadPoolExecutor | None = None
        try:
            while futures:
                for w in list(futures):
                    try:
                        results[w] = futures.pop(w).get()
                    except RemoteError as exc:
                        if not self.policy.restart:
                            self.fail(w, exc)
                        if pool is None:
                            pool = ThreadPoolExecutor(
                                len(indices), thread_name_prefix="sampler-replace"
                            )
                        # Its frames hold the failed call, and with it the dead actor.
                        redone[w] = pool.submit(self._redo, w, exc.with_traceback(None), call)
                futures = self._redone(redone)
        finally:
            futures.clear()  # a pending future holds its actor: drop them all, even on error
            redone.clear()
            if pool is not None:
                pool.shutdown(wait=False)  # done, or (on an error) ending with the group
        return [results[w] for w in indices]

    def _redo(self, w: int, exc: BaseException, call: Callable[[Any, int], Any]) -> Any:
        """Replace worker `w`, whose call raised `exc`; the call made again on the new one."""
        self.recover(w, exc)
        with self.lock:
            if self.closed:
                raise _closed_meanwhile(self.owner, w)
            worker = self.workers[w]
        return call(worker, w)

    @staticmethod
    def _redone(redone: dict[int, Future[Any]]) -> dict[int, Any]:
        """The calls made again by the replacements `redone` (emptied); or the first error."""
        errors: list[BaseException] = []
        calls: dict[int, Any] = {}
        for w, done in list(redone.items()):
            try:
                calls[w] = done.result()
            except BaseException as exc:  # the first of them is raised below
                errors.append(exc)
        redone.clear()
        errors.sort(key=lambda exc: isinstance(exc, _ClosedMeanwhile))  # stable: by index
        if errors:
            calls.clear()
            raise errors[0]
        return calls

    def recover_all(self, lost: dict[int, BaseException]) -> None:
        """Replace the workers `lost` names (each with its call's error) at once; emptied.

        Each is replaced (`recover`) on a thread of its own, and this waits for them all:
        where some of them raise, the error of the lowest index is raised, one that only
        found the group closed by another coming last.
        """
        if len(lost) <= 1:
            for w in list(lost):
                self.recover(w, lost.pop(w))
            return
        pool = ThreadPoolExecutor(len(lost), thread_name_prefix="sampler-replace")
        try:
            redone = {w: pool.submit(self.recover, w, lost.pop(w)) for w in sorted(lost)}
            self._redone(redone)
        finally:
            pool.shutdown(wait=False)  # done, or (on an error) ending with the group

    def recover(self, w: int, exc: BaseException, required: bool = True) -> bool:
        """Replace worker `w`, whose call raised `exc`, where the restarts allow; else raise.

        Returns True once a new worker took its place; False where no slot freed within the
        restart timeout and not `required` (the worker is then lost: `workers[w]` is None).
        Raises as `fail` does without restarts; `SamplerWorkerError` (from `exc`) or
        `RemoteActorDiedError` past `max_restarts` in the window; `RemoteActorDiedError` where
        no slot freed in time and `required`. Every raise but of a plain error closes the group.
        A replacement that fails before it is ready (killed as it starts, its environment
        raising at once) is one more failure of worker `w`, and is made again.
        """
        policy = self.policy
        if not policy.restart:
            self.fail(w, exc)
        if self.closed:  # by another thread: its error, or the caller's close, is what counts
            raise _closed_meanwhile(self.owner, w) from None
        now = time.monotonic()
        self._timings[w] = {"seen_at": time.time()}
        self._count_failure(w, exc)
        pid, name = self.where[w]
        what, dead = _what(exc), exc
        while True:
            self._drop(w)
            try:
                with replacing(dead.actor_id if isinstance(dead, RemoteError) else ""):
                    replaced = self._replace(w, time.monotonic() + policy.restart_timeout)
                break
            except MasterUnreachableError:  # past restart_timeout
                self.close()
                raise
            except RemoteError as again:  # the new worker failed before it was ready
                again.with_traceback(None)  # its frames hold the new worker's actor
                logger.warning(
                    "%s: worker %d's replacement failed as it started (%s); once more",
                    self.owner, w, _why(again),
                )  # fmt: skip
                timings = self._timings.setdefault(w, {"seen_at": time.time()})
                timings["retried"] = time.time()
                timings["failed_starts"] = timings.get("failed_starts", 0) + 1
                self._count_failure(w, again)
                pid, name = _dead(again) or (pid, name)  # the line names the last to die
                what, dead = _what(again), again
            except BaseException:
                if self.closed:  # it found the group closed by another thread
                    raise _closed_meanwhile(self.owner, w) from None
                self.close()
                raise
        took = time.monotonic() - now
        if replaced:
            logger.warning(
                "%s: worker %d (pid %d on %s) %s; replaced in %.1f s",
                self.owner, w, pid, name, what, took,
            )  # fmt: skip
            return True
        if self.closed:
            raise _closed_meanwhile(self.owner, w)
        if required or not self.live:
            self.close()
            raise RemoteActorDiedError(
                f"{self.owner}: worker {w} (pid {pid} on {name}) {what}, and no free slot for "
                f"its replacement came within restart_timeout={policy.restart_timeout:g} s; the "
                "sampler is closed. Free or add CPU slots (xparl connect), or resume the run"
            ) from None
        logger.warning(
            "%s: worker %d (pid %d on %s) %s; no free slot for its replacement within %g s: "
            "going on with %d of %d workers",
            self.owner, w, pid, name, what, policy.restart_timeout,
            len(self.live), len(self.workers),
        )  # fmt: skip
        return False

    def _count_failure(self, w: int, exc: BaseException) -> None:
        """Count a failure of worker `w`; past `max_restarts` in the window, close and raise."""
        policy, failures = self.policy, self._failures[w]
        if failures.failed():
            return
        self.close()
        # The error's message carries the worker's traceback; its frames here would keep
        # the failed call, and with it the failed worker's actor, alive.
        exc.with_traceback(None)
        if not _machine_fault(exc):
            raise SamplerWorkerError(
                f"{self.owner}: worker {w}'s environment failed {failures.failures} times "
                f"within {policy.window_s:g} s (max_restarts={policy.max_restarts}), the "
                f"last time with {type(exc).__name__}: {exc}; the sampler is closed",
                worker=w,
                failures=failures.failures,
                max_restarts=policy.max_restarts,
                window_s=policy.window_s,
            ) from exc
        raise RemoteActorDiedError(
            f"{self.owner}: worker {w} died {failures.failures} times within "
            f"{policy.window_s:g} s (max_restarts={policy.max_restarts}), the last time: "
            f"{exc}; the sampler is closed"
        ) from None

    def _drop(self, w: int) -> None:
        """Let worker `w`'s actor, signal and segments go (the segments' names unlinked)."""
        with self.lock:
            if self.closed:  # `close()` let them go
                return
            signal, self.signals[w] = self.signals[w], None
            self.workers[w] = None  # its last handle: the actor and its slot are freed
            segments, self.segments[w] = self.segments[w], None
        if signal is not None:
            signal.close()
        if segments is not None:
            _free(segments)

    def _replace(self, w: int, deadline: float) -> bool:
        """A new worker `w` with the last weights, segments and signal; False: no slot in time."""
        replaced = self._replaced[w] + 1
        self._starting.add(w)
        try:
            return self._start(w, replaced, deadline)
        finally:
            self._starting.discard(w)

    def _start(self, w: int, replaced: int, deadline: float) -> bool:
        """`_replace`'s work: a call of the new worker that fails raises as it is."""
        timings = self._timings.setdefault(w, {"seen_at": time.time()})
        timings.setdefault("asked", time.time())  # the first ask: a failed start asks again
        while True:
            try:
                worker = self._create(w, replaced)
                break
            except ResourceError:
                if time.monotonic() >= deadline or self.closed:
                    return False
            except MasterUnreachableError:  # it is restarting, or its network is down
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)  # the client reconnects by itself
        timings["made"] = time.time()
        self._replaced[w] = replaced  # its seed stream is never used again
        with self.lock:
            if self.closed:  # closed meanwhile (from another thread): the new actor goes
                return False
            self.workers[w] = worker
        if self.weights is not None and worker is not None:
            weights, version = self.weights
            self.gather([worker.set_weights(weights, version)], [w])
        timings["weights"] = time.time()
        (*_, host, pid, name), started = self.gather([worker.describe(), worker.timings()], [w, w])
        timings.update(zip(("imported", "constructed", "envs"), started, strict=True))
        self.where[w] = (pid, name)
        if self._built:  # else: `__init__` gives the first workers their memory
            self._share_memory({w: host})
        if self._signal_args is not None:
            self.connect_signals(*self._signal_args, members=[w])
        timings["ready"] = time.time()
        with self.lock:
            self.restarts += 1
        return True

    def collected(self, w: int) -> None:
        """Worker `w` finished a batch, which now waits for the caller to take it.

        A replacement's first such batch is its `collected` phase (said by a sampler whose
        batches wait for the caller: `AsyncSampler`).
        """
        timings = self._timings.get(w)
        if timings is not None and "ready" in timings:
            timings.setdefault("collected", time.time())

    def delivered(self, w: int | None) -> None:
        """Worker `w`'s batch (None: every worker's) is in: a replacement's first ends its timings.

        The line (at DEBUG) gives each phase of the replacement in seconds from the death seen
        (`seen_at`, Unix time): `asked` (the first new actor asked for), `retried` (where a new
        actor failed as it started: the last such failure seen, the next one asked for at
        once), `imported` (the process of the actor that took the worker's place imported the
        worker's module: negative for a warm process), `constructed` (its constructor began:
        its arguments unpickled), `envs` (its environments made), `made` (the actor handed
        back), `weights` (the last weights set), `ready` (memory and signal set up),
        `collected` (its first batch finished, where batches wait for the caller: `collected`),
        `first_batch` (this: the caller has it); then how many new actors failed as they
        started. Times of the new process are its clock's (the same on one host).
        """
        for i in range(len(self.workers)) if w is None else [w]:
            timings = self._timings.get(i)
            if timings is None or "ready" not in timings:
                continue
            del self._timings[i]
            seen = timings.pop("seen_at")
            failed = int(timings.pop("failed_starts", 0))
            timings["first_batch"] = time.time()
            logger.debug(
                "%s: worker %d's replacement, seconds from its death seen at %.3f: %s; "
                "%d failed starts",
                self.owner, i, seen,
                " ".join(f"{k}={v - seen:.3f}" for k, v in sorted(timings.items(), key=_second)),
                failed,
            )  # fmt: skip

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
            if w in self._starting:
                raise  # a replacement's own failure: `recover` tries again
            self.fail(w, exc)

    def fail(self, w: int, exc: BaseException) -> None:
        """Raise what a call on worker `w` raised; for a dead worker, after closing the group."""
        if not _machine_fault(exc):
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
        with self.lock:
            self.closed = True
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
        segment.close()
