"""A run of `parl-train` as its training loop sees it: `Run`, progress.csv and `RunResult`.

`Run` is a `TrainingRun` (TensorBoard, `log.log`, the curves, the target, the progress bar)
that also writes a row of `progress.csv` past every multiple of `log_every`, asks for a
checkpoint past every multiple of `checkpoint_every`, sends evaluations to an evaluator actor
when the run has one (and replaces it when it dies, where `make_evaluator` is set), counts
the actors replaced (`actor_restarts`: progress.csv's last column, a TensorBoard scalar), and
turns `done` on Ctrl-C. Trainers call `run.record` then
`run.maybe_evaluate` after every step of their loop; the run skeleton (`_skeleton`) makes the
run and says what a checkpoint writes.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from parl.utils import summary
from parl_algos.rollout import Episode
from parl_algos.samplers import Replacements
from parl_algos.train._config import Config
from parl_algos.training import TrainingRun
from parl_remote import RemoteActorDiedError, RemoteError

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "ProgressLog",
    "Run",
    "RunResult",
    "default_logdir",
    "env_name",
    "latest_checkpoint",
]

INTERRUPTED_EXIT_CODE = 130
"""What `parl-train` exits with after Ctrl-C (128 + SIGINT, as a shell reports it)."""

_EVALUATION_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a run ended."""

    logdir: str
    """The run directory."""
    env_steps: int
    """Env steps taken, over every session of the run."""
    interrupted: bool
    """True when Ctrl-C stopped it (a checkpoint was written; `--resume` continues it)."""
    summary: dict[str, Any]
    """`TrainingRun.finish`'s `RunResult`, as a dict."""


def env_name(env_id: str) -> str:
    """The short, lower-case name of an environment id: `CartPole-v1` -> `cartpole`."""
    return re.sub(r"-v\d+$", "", env_id).replace("/", "_").lower()


def default_logdir(config: Config, root: str = "train_log") -> str:
    """`train_log/<algorithm>-<env>/<timestamp>`, lower-case, made unique with a suffix."""
    base = os.path.join(
        root,
        f"{config.algorithm.lower()}-{env_name(config.env.id)}",
        time.strftime("%Y-%m-%d_%H-%M-%S"),
    )
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


class ProgressLog:
    """`progress.csv`: `env_step`, `seconds`, `mean_return`, the stats, then `actor_restarts`.

    Args:
        path: the CSV file.
        columns: the algorithm's stats columns (see `stat_columns`).
        resume_step: when continuing a run, the env step of its checkpoint: later rows are
            dropped (they are written again); None starts a new file with its header.
        on_row: also called with each row's env step and its values by metric key
            (`time/seconds`, `rollout/mean_return`, `train/<stat>`; empty ones left out): a
            tracker's.
    """

    def __init__(
        self,
        path: str,
        columns: list[str],
        *,
        resume_step: int | None = None,
        on_row: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        self.path = path
        self.columns = columns
        self.on_row = on_row
        header = ["env_step", "seconds", "mean_return", *columns, "actor_restarts"]
        if resume_step is None or not os.path.exists(path):
            with open(path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerow(header)
        else:
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
            kept = [row for row in rows[1:] if row and int(row[0]) <= resume_step]
            with open(path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerows([header, *kept])

    def write(
        self,
        env_step: int,
        seconds: float,
        mean_return: float | None,
        stats: Any,
        actor_restarts: int = 0,
    ) -> None:
        """Append one row (`mean_return` None: empty; `stats` None: empty stats columns)."""
        row = [env_step, f"{seconds:.2f}", "" if mean_return is None else repr(mean_return)]
        metrics = {"time/seconds": round(seconds, 2)}
        if mean_return is not None:
            metrics["rollout/mean_return"] = float(mean_return)
        for name in self.columns:
            value = None if stats is None else getattr(stats, name, None)
            row.append("" if value is None else repr(float(value)))
            if value is not None:
                metrics[f"train/{name}"] = float(value)
        row.append(actor_restarts)
        metrics["train/actor_restarts"] = float(actor_restarts)
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.writer(f).writerow(row)
        if self.on_row is not None:
            self.on_row(env_step, metrics)


def latest_checkpoint(logdir: str) -> str | None:
    """The newest complete checkpoint directory of a run (None when there is none)."""
    root = os.path.join(logdir, "checkpoints")
    if not os.path.isdir(root):
        return None
    steps = sorted(
        int(m.group(1)) for name in os.listdir(root) if (m := re.fullmatch(r"step-(\d+)", name))
    )
    return os.path.join(root, f"step-{steps[-1]:010d}") if steps else None


class Run(TrainingRun):
    """A `TrainingRun` that also writes progress.csv, checkpoints on schedule, and stops on Ctrl-C.

    The training loops call `record` then `maybe_evaluate` after every step; rows are written
    in `record` when a multiple of `log_every` is crossed, checkpoints in `maybe_evaluate` (after
    the step's evaluation) when a multiple of `checkpoint_every` is. `done` turns true on Ctrl-C,
    which ends either loop after the current step.
    """

    def __init__(
        self,
        title: str,
        args: Any,
        *,
        progress_log: ProgressLog,
        checkpoint_every: int,
        save_checkpoint: Callable[[], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(title, args, **kwargs)
        self.interrupted = False
        self.progress_log = progress_log
        self.checkpoint_every = checkpoint_every
        self.save_checkpoint = save_checkpoint
        self.last_checkpoint = -1
        self.last_row = -1
        self._next_row = 0
        self._next_checkpoint = checkpoint_every
        self._stats: Any = None
        self._seconds_before = 0.0
        self.evaluator: Any = None
        """An `Evaluator` actor (sync, async): evaluations run there, not between steps."""
        self.weights: Callable[[], Any] | None = None
        """With an evaluator: the agent's latest weights."""
        self._pending: tuple[int, Any] | None = None
        self.make_evaluator: Callable[[], Any] | None = None
        """With an evaluator: makes a new one where one that dies is to be replaced."""
        self.max_restarts = 3
        """The most replacements of the evaluator within `_RESTART_WINDOW_S`."""
        self.restart_sources: list[Any] = []
        """What replaces actors of the run (samplers' collectors): each has `restarts`."""
        self._evaluator_replacements: Replacements | None = None
        self._restarts_before = 0

    @property
    def done(self) -> bool:
        """True once the target is reached (and stopping there is asked), or on Ctrl-C."""
        return super().done or self.interrupted

    def start(self) -> None:
        """Start the clock, going on from the seconds of the sessions before a resume."""
        super().start()
        self._start -= self._seconds_before
        if self._bar is not None and self.env_steps:
            self._bar.n = self._bar.last_print_n = self._bar.initial = self.env_steps
            self._bar.refresh()

    def clear_progress(self) -> None:
        """Take the progress bar off the terminal (the run failed: its error line follows)."""
        if self._bar is not None:
            self._bar.leave = False
            self._bar.close()

    def seconds(self) -> float:
        """Wall seconds of training so far, over every session of the run."""
        return time.perf_counter() - self._start

    def record(self, env_steps: int, episodes: Iterable[Episode] = (), stats: Any = None) -> None:
        """`TrainingRun.record`, then a row of progress.csv past each multiple of `log_every`."""
        super().record(env_steps, episodes, stats)
        if stats is not None:
            self._stats = stats
        if env_steps >= self._next_row:
            self._next_row = (env_steps // self.log_every + 1) * self.log_every
            self.write_row()

    def actor_restarts(self) -> int:
        """Actors replaced so far (samplers' workers, the evaluator), over every session."""
        evaluators = self._evaluator_replacements
        return (
            self._restarts_before
            + (evaluators.total if evaluators is not None else 0)
            + sum(source.restarts for source in self.restart_sources)
        )

    def write_row(self) -> None:
        """Write the current row of progress.csv."""
        self.last_row = self.env_steps
        restarts = self.actor_restarts()
        self.progress_log.write(
            self.env_steps, self.seconds(), self.mean_return(), self._stats, restarts
        )
        summary.add_scalar("train/actor_restarts", restarts, self.env_steps)

    def maybe_evaluate(self, policy: Callable[[np.ndarray], Any]) -> float | None:
        """`TrainingRun.maybe_evaluate` (or its evaluator's), then a checkpoint when due.

        With an evaluator, an evaluation due is sent to it with the latest weights and this
        returns at once; its result is recorded (at the env step of its weights) by the first
        call after it came back, and the next evaluation waits for it.
        """
        if self.evaluator is None:
            result = super().maybe_evaluate(policy)
        else:
            result = self.collect_evaluation(wait=False)
            if self.eval_every and self.env_steps >= self._next_eval and self._pending is None:
                self._next_eval = self.env_steps + self.eval_every
                weights, seed = self.weights(), self.eval_seed()
                try:
                    future = self.evaluator.evaluate(weights, self.eval_episodes, seed)
                except RemoteError as exc:  # known dead already
                    if not self._replaceable(exc):
                        raise
                    self._replace_evaluator(self.env_steps, exc)
                    future = self.evaluator.evaluate(weights, self.eval_episodes, seed)
                self._pending = (self.env_steps, future)
        if self.env_steps >= self._next_checkpoint:
            self._next_checkpoint = (
                self.env_steps // self.checkpoint_every + 1
            ) * self.checkpoint_every
            self.checkpoint()
        return result

    def collect_evaluation(self, *, wait: bool) -> float | None:
        """Record the evaluator's result if it is back (`wait`: wait for it); return it."""
        if self._pending is None or not (wait or self._pending[1].done()):
            return None
        (env_step, future), self._pending = self._pending, None
        try:
            mean = float(future.get(timeout=_EVALUATION_TIMEOUT))
        except RemoteError as exc:
            if not self._replaceable(exc):
                raise
            error = exc
        else:
            self.record_evaluation(env_step, mean)
            return mean
        del future  # a call holds its actor
        self._replace_evaluator(env_step, error)
        return None

    def _replaceable(self, exc: BaseException) -> bool:
        """Whether `exc` of an evaluator's call means a new evaluator (not its own code's fault)."""
        return self.make_evaluator is not None and type(exc) in (RemoteError, RemoteActorDiedError)

    def _replace_evaluator(self, env_step: int, exc: BaseException) -> None:
        """A new evaluator for one that died (its evaluation at `env_step` is dropped)."""
        if self._evaluator_replacements is None:
            self._evaluator_replacements = Replacements(
                "the evaluator", self.max_restarts, setting="train.max_restarts"
            )
        note = f", its evaluation at env step {env_step} dropped"
        assert self.make_evaluator is not None
        make = self.make_evaluator
        self.evaluator = None  # its last handle: the actor and its slot are freed
        self.evaluator = self._evaluator_replacements.replace(0, exc, lambda r: make(), note)

    def checkpoint(self) -> None:
        """Write a checkpoint of the current step (once per step)."""
        if self.last_checkpoint != self.env_steps:
            self.save_checkpoint()
            self.last_checkpoint = self.env_steps

    def state_dict(self) -> dict[str, Any]:
        """`TrainingRun.state_dict` plus the schedules of rows and checkpoints."""
        return {
            **super().state_dict(),
            "next_row": self._next_row,
            "last_row": self.last_row,
            "next_checkpoint": self._next_checkpoint,
            "stats": self._stats,
            "actor_restarts": self.actor_restarts(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s result."""
        super().load_state_dict(state)
        self._next_row = state["next_row"]
        self.last_row = state["last_row"]
        self._next_checkpoint = state["next_checkpoint"]
        self._stats = state["stats"]
        self._seconds_before = state["seconds"]
        self._restarts_before = state.get("actor_restarts", 0)  # none in older checkpoints
        self.last_checkpoint = self.env_steps
