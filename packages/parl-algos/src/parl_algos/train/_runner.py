"""Running a config: the run directory, progress.csv, checkpoints, and the single-process mode.

A run directory holds `config.toml` (the resolved config), the TensorBoard events and
`log.log` (through `TrainingRun`), `progress.csv`, `learning_curve.png`, the final
`agent.ckpt`, and `checkpoints/step-<env steps>/`: `agent.ckpt` (`Agent.save`: every model,
the optimizers, the agent's counters) and `state.pkl` (the training loop's objects: the
environments, the replay memory, the episodes under way; the RNG states of python, numpy,
torch and of the agent's own generators; the run's counters, curves and schedules).

`run_single` trains with the loops of `parl_algos.training`: `train_on_policy` on a sampler
(`parl.samplers`: a `SerialSampler` in `single` mode, a `ParallelSampler` of remote workers
in `sync` mode, an `AsyncSampler` in `async` mode) for the trajectory-based algorithms;
`train_off_policy` (single) or `train_off_policy_rounds` (workers filling the replay memory
through a `ReplayWriter`; for the DQN family Ape-X style in `async` mode, see `_apex`) for
the replay-based ones. Evaluation runs in this process between training steps in `single`
mode (and wherever videos are recorded), in an actor of its own in the others (`_evaluator`),
with the latest weights, so that it never stalls training. In `single` mode every piece of
state is in the checkpoint, so a run stopped (Ctrl-C, or killed after a periodic checkpoint)
and resumed writes the same rows of progress.csv as the run left alone; in the other modes
the workers' environments start afresh on resume.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import os
import pickle
import random
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from parl.utils import NStepAdder, logger
from parl_algos._common import to_tensor
from parl_algos.rollout import Episode, Trajectory, make_atari_env, make_rescaled_env
from parl_algos.train._algorithms import AlgorithmSpec, Learner, get_spec, stat_columns
from parl_algos.train._apex import QActing, ReplayWriter
from parl_algos.train._config import Config, dump_config
from parl_algos.training import (
    OffPolicyArgs,
    OffPolicyState,
    OnPolicyArgs,
    RunArgs,
    TrainingRun,
    train_off_policy,
    train_on_policy,
)

__all__ = [
    "ASYNC_WORKER_NICE",
    "BatchActing",
    "INTERRUPTED_EXIT_CODE",
    "ProgressLog",
    "RunResult",
    "SamplerCollector",
    "default_logdir",
    "env_name",
    "latest_checkpoint",
    "load_checkpoint",
    "make_collector",
    "make_env",
    "make_env_fn",
    "make_eval_env",
    "run_single",
    "save_checkpoint",
    "train_off_policy_rounds",
]

INTERRUPTED_EXIT_CODE = 130
"""What `parl-train` exits with after Ctrl-C (128 + SIGINT, as a shell reports it)."""

ASYNC_WORKER_NICE = 5
"""The niceness of on-policy `async` workers: below the learner, whose update bounds the rate.

Two workers at 5 weigh less together than one process at 0, so a scheduler balancing two
cores leaves the learner a core of its own; under others' load the workers still get a share.
"""

_CHECKPOINT_FORMAT = "parl-train/1"
_EVALUATION_TIMEOUT = 600.0
_KEEP_CHECKPOINTS = 2


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
    """`progress.csv`: `env_step`, `seconds`, `mean_return`, then the algorithm's stats.

    Args:
        path: the CSV file.
        columns: the algorithm's stats columns (see `stat_columns`).
        resume_step: when continuing a run, the env step of its checkpoint: later rows are
            dropped (they are written again); None starts a new file with its header.
    """

    def __init__(self, path: str, columns: list[str], *, resume_step: int | None = None) -> None:
        self.path = path
        self.columns = columns
        header = ["env_step", "seconds", "mean_return", *columns]
        if resume_step is None or not os.path.exists(path):
            with open(path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerow(header)
        else:
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
            kept = [row for row in rows[1:] if row and int(row[0]) <= resume_step]
            with open(path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerows([header, *kept])

    def write(self, env_step: int, seconds: float, mean_return: float | None, stats: Any) -> None:
        """Append one row (`mean_return` None: empty; `stats` None: empty stats columns)."""
        row = [env_step, f"{seconds:.2f}", "" if mean_return is None else repr(mean_return)]
        for name in self.columns:
            value = None if stats is None else getattr(stats, name, None)
            row.append("" if value is None else repr(float(value)))
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.writer(f).writerow(row)


def latest_checkpoint(logdir: str) -> str | None:
    """The newest complete checkpoint directory of a run (None when there is none)."""
    root = os.path.join(logdir, "checkpoints")
    if not os.path.isdir(root):
        return None
    steps = sorted(
        int(m.group(1)) for name in os.listdir(root) if (m := re.fullmatch(r"step-(\d+)", name))
    )
    return os.path.join(root, f"step-{steps[-1]:010d}") if steps else None


class SamplerCollector:
    """A sampler (`parl.samplers`) with the face of a `VectorCollector`, for `train_on_policy`.

    Each `collect` first sends the agent's weights to the sampler's workers (nothing for a
    `SerialSampler`), or with `weights_every` only once that many env steps passed since the
    last send, then returns the sampler's next batch as a `Trajectory`. `offset` counts the env
    steps of earlier sessions of the run, when a resumed run starts a fresh sampler.

    Args:
        sampler: a `SerialSampler` or `ParallelSampler` built with the agent.
        offset: env steps taken before this sampler's first.
        weights_every: env steps between two sends of the weights (0: before every batch;
            the first batch always gets them).

    Attributes:
        weights_sent: sends of the weights so far.
    """

    def __init__(self, sampler: Any, *, offset: int = 0, weights_every: int = 0) -> None:
        self.sampler = sampler
        self.offset = offset
        self.weights_every = weights_every
        self.weights_sent = 0
        self._sent_at: int | None = None

    @property
    def env_steps(self) -> int:
        """Env steps of the run so far, summed over the environments."""
        return self.offset + self.sampler.env_steps

    def collect(self, n_steps: int, act: Any = None) -> Trajectory:
        """The sampler's next batch (its own `horizon` steps, with its own agent)."""
        steps = self.sampler.env_steps
        if self._sent_at is None or steps - self._sent_at >= self.weights_every:
            self.sampler.sync_weights()
            self.weights_sent += 1
            self._sent_at = steps
        return Trajectory.from_batch(self.sampler.collect())

    def pop_episodes(self) -> list[Episode]:
        """The episodes finished since the last call, dated by the run's env steps."""
        return [e._replace(env_step=e.env_step + self.offset) for e in self.sampler.episodes()]

    def close(self) -> None:
        """Close the sampler (its environments, and its workers if it has any)."""
        self.sampler.close()


class BatchActing:
    """An off-policy agent acting on a batch of observations, as the samplers' workers need.

    The first `random_steps` steps (counted over the batches this copy acted on) take uniformly
    random actions, as `train_off_policy`'s warm-up does; after that, the agent's `sample`
    acts on each observation. Weights go to and from the agent.

    Args:
        agent: a `DQNAgent` or `ContinuousAgent`.
        action_space: the environment's action space (its own seeded generator).
        random_steps: steps of random actions before the agent acts.
    """

    def __init__(self, agent: Any, action_space: gym.Space, random_steps: int) -> None:
        self.agent = agent
        self.action_space = action_space
        self.random_steps = random_steps
        self.steps = 0

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """One action per row of `obs`."""
        self.steps += len(obs)
        if self.steps <= self.random_steps:
            return np.stack([self.action_space.sample() for _ in obs])
        return np.stack([np.asarray(self.agent.sample(o)) for o in obs])

    def get_weights(self) -> dict:
        """The agent's weights."""
        return self.agent.get_weights()

    def set_weights(self, weights: dict) -> None:
        """Load weights into the agent."""
        self.agent.set_weights(weights)


def train_off_policy_rounds(
    run: TrainingRun,
    collector: SamplerCollector,
    agent: Any,
    writer: ReplayWriter,
    args: OffPolicyArgs,
    *,
    after_step: Callable[[int], None] | None = None,
    acting: QActing | None = None,
    eval_policy: Callable[[np.ndarray], Any] | None = None,
) -> None:
    """Off-policy learning from workers: they fill the replay memory, the learner learns.

    Each round the workers get the latest weights (with `acting`, the exploration it decides
    at the run's env-step count) and the learner takes the next batch: every worker's `horizon`
    steps (`sync`), or one worker's as soon as it has them (`async`, Ape-X style: the workers
    never wait). `writer` stores every transition; then, for each env step of the batch, the
    learner does what `train_off_policy` does after that step: `gradient_steps` updates at
    every multiple of `train_freq` past `learning_starts`, then `after_step`. Evaluations in
    this process run `eval_policy` (default: `agent.predict`).
    """
    run.start()
    stats = None
    while collector.env_steps < args.total_steps and not run.done:
        before = collector.env_steps
        if acting is not None:
            acting.env_steps = before
        trajectory = collector.collect(0)
        if acting is not None:
            acting.observe(trajectory)
        writer.store(trajectory)
        steps = collector.env_steps
        for step in range(before + 1, steps + 1):  # train_off_policy's schedule, step by step
            if step > args.learning_starts and step % args.train_freq == 0:
                for _ in range(args.gradient_steps):
                    stats = agent.learn(writer.memory, args.batch_size)
            if after_step is not None:
                after_step(step)
        run.record(steps, collector.pop_episodes(), stats)
        run.maybe_evaluate(agent.predict if eval_policy is None else eval_policy)


class _Run(TrainingRun):
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

    def write_row(self) -> None:
        """Write the current row of progress.csv."""
        self.last_row = self.env_steps
        self.progress_log.write(self.env_steps, self.seconds(), self.mean_return(), self._stats)

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
                future = self.evaluator.evaluate(
                    self.weights(), self.eval_episodes, self.eval_seed()
                )
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
        mean = float(future.get(timeout=_EVALUATION_TIMEOUT))
        self.record_evaluation(env_step, mean)
        return mean

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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s result."""
        super().load_state_dict(state)
        self._next_row = state["next_row"]
        self.last_row = state["last_row"]
        self._next_checkpoint = state["next_checkpoint"]
        self._stats = state["stats"]
        self._seconds_before = state["seconds"]
        self.last_checkpoint = self.env_steps


def _run_args(config: Config, spec: AlgorithmSpec, logdir: str) -> RunArgs:
    """The `RunArgs` of the training loops, filled from the config's sections.

    The shared loops' families get their own (`OnPolicyArgs`, `OffPolicyArgs`); the
    algorithms with loops of their own (multi-agent, offline) the schedule alone, so that the
    run's first log line shows no replay settings that they do not have.
    """
    cls: type[RunArgs] = RunArgs
    if spec.family == "on_policy":
        cls = OnPolicyArgs
    elif spec.family in ("off_policy", "recurrent"):
        cls = OffPolicyArgs
    values = {
        **dataclasses.asdict(config.env),
        **dataclasses.asdict(config.agent),
        **dataclasses.asdict(config.train),
        "env_id": config.env.id,
        "logdir": logdir,
    }
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


def make_env(env_id: str, *, atari: bool = False, **kwargs: Any) -> gym.Env:
    """One environment; Box actions are rescaled to `[-1, 1]` (the range of a tanh policy).

    Actions outside `[-1, 1]` (a Gaussian policy's draws) are clipped to it, and float64
    observations (MuJoCo's) become float32, the models' dtype. `atari`: an Atari game with the
    Nature DQN's preprocessing (`make_atari_env`: 4 stacked 84x84 uint8 frames).
    """
    if atari:
        return make_atari_env(env_id, **kwargs)
    env = gym.make(env_id, **kwargs)
    if isinstance(env.action_space, gym.spaces.Box):
        env.close()
        env = gym.wrappers.ClipAction(make_rescaled_env(env_id, **kwargs))
    space = env.observation_space
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
        low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        env = gym.wrappers.TransformObservation(env, _float32, gym.spaces.Box(low, high))
    return env


def _float32(obs: np.ndarray) -> np.ndarray:
    return obs.astype(np.float32)


def make_env_fn(config: Config) -> Callable[[], gym.Env]:
    """A picklable zero-argument maker of the config's environment (`make_env`'s)."""
    return functools.partial(make_env, config.env.id, atari=getattr(config.env, "atari", False))


def make_eval_env(config: Config, logdir: str) -> gym.Env:
    """The evaluation environment; with `train.capture_video`, its episodes are recorded."""
    if not config.train.capture_video:
        return make_env_fn(config)()
    if getattr(config.env, "atari", False):  # the game's frames, not the network's
        env = make_atari_env(config.env.id, render_mode="rgb_array")
    else:
        env = gym.make(config.env.id, render_mode="rgb_array")
    env = gym.wrappers.RecordVideo(
        env,
        os.path.join(logdir, "videos"),
        episode_trigger=lambda episode: True,
        name_prefix="eval",
        disable_logger=True,
    )
    if isinstance(env.action_space, gym.spaces.Box):
        shape, dtype = env.action_space.shape, env.action_space.dtype
        env = gym.wrappers.RescaleAction(
            env, np.full(shape, -1.0, dtype=dtype), np.full(shape, 1.0, dtype=dtype)
        )
    return env


def _generators(obj: Any) -> dict[str, Any]:
    """The states of the numpy and torch generators in `obj`'s attributes."""
    states = {}
    for name, value in vars(obj).items():
        if isinstance(value, np.random.Generator):
            states[name] = value.bit_generator.state
        elif isinstance(value, torch.Generator):
            states[name] = value.get_state()
    return states


def _set_generators(obj: Any, states: dict[str, Any]) -> None:
    for name, state in states.items():
        value = getattr(obj, name)
        if isinstance(value, np.random.Generator):
            value.bit_generator.state = state
        else:
            value.set_state(state)


def _rng_state(agent: Any) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "agent": _generators(agent),
        "algorithm": _generators(agent.alg),
    }


def _set_rng_state(agent: Any, state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    _set_generators(agent, state["agent"])
    _set_generators(agent.alg, state["algorithm"])


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    return False


def _picklable(objects: dict[str, Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """`objects` but `skip`, and those that cannot be pickled left out (with a warning)."""
    kept = {}
    for name, value in objects.items():
        if name in skip:
            continue
        try:  # numpy arrays' bytes left out of band: a trial of a 3 GB memory is not a copy
            pickle.dumps(value, protocol=5, buffer_callback=_out_of_band)
        except Exception as exc:  # an environment holding a renderer, a socket, ...
            logger.warning("checkpoint: %s cannot be saved (%s); a resume restarts it", name, exc)
            continue
        kept[name] = value
    return kept


def save_checkpoint(
    logdir: str, agent: Any, run: _Run, objects: dict[str, Any], *, skip: Iterable[str] = ()
) -> str:
    """Write `checkpoints/step-<env steps>/` atomically; keep the newest two; return its path.

    Args:
        logdir: the run directory.
        agent: the agent (saved with `Agent.save`).
        run: the `TrainingRun` (its counters, curves and schedules).
        objects: the loop's objects to pickle (environments, memory, loop state).
        skip: names of `objects` not to save (a sampler whose environments are in workers).
    """
    root = os.path.join(logdir, "checkpoints")
    final = os.path.join(root, f"step-{run.env_steps:010d}")
    tmp = os.path.join(root, f".tmp-step-{run.env_steps:010d}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    agent.save(os.path.join(tmp, "agent.ckpt"))
    state = {
        "format": _CHECKPOINT_FORMAT,
        "env_steps": run.env_steps,
        "run": run.state_dict(),
        "rng": _rng_state(agent),
        "objects": _picklable(objects, skip=skip),
    }
    with open(os.path.join(tmp, "state.pkl"), "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    older = sorted(n for n in os.listdir(root) if re.fullmatch(r"step-\d+", n))
    for name in older[:-_KEEP_CHECKPOINTS]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    logger.info("checkpoint at env step %d: %s", run.env_steps, final)
    return final


def load_checkpoint(path: str, agent: Any) -> dict[str, Any]:
    """Restore `agent` from a checkpoint directory; return the rest of its state."""
    agent.restore(os.path.join(path, "agent.ckpt"))
    with open(os.path.join(path, "state.pkl"), "rb") as f:
        state = pickle.load(f)  # the run's own file, written by save_checkpoint
    if state.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a parl-train checkpoint (format {state.get('format')!r})")
    return state


class _Interrupt:
    """While active, the first Ctrl-C asks the run to stop (checkpoint first); a second quits."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        logger.warning("interrupted: writing a checkpoint (Ctrl-C again to quit at once)")
        self.run.interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> _Interrupt:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def run_single(config: Config, logdir: str, *, resume: bool = False) -> RunResult:
    """Train `config` in this process, writing the run directory `logdir`.

    Args:
        config: the resolved config.
        logdir: the run directory (created if needed).
        resume: continue from the newest checkpoint in `logdir`.
    """
    spec = get_spec(config.algorithm)
    if config.train.mode in spec.session_modes:  # R2D2, A3C, GA3C: loops of their own
        from parl_algos.train._sessions import run_session

        return run_session(config, logdir, resume=resume)
    if spec.run is not None:  # offline and multi-agent loops (`_own_loop`)
        return spec.run(config, logdir, resume=resume)
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "config.toml"), "w", encoding="utf-8") as f:
        f.write(dump_config(config))
    checkpoint = latest_checkpoint(logdir) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"{logdir} has no checkpoint to resume from")
    resume_step = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else None

    train = config.train
    args = _run_args(config, spec, logdir)
    title = f"{spec.name} on {config.env.id}"
    eval_env = make_eval_env(config, logdir)
    objects: dict[str, Any] = {}
    progress_log = ProgressLog(
        os.path.join(logdir, "progress.csv"), stat_columns(spec.stats), resume_step=resume_step
    )
    run = _Run(
        title,
        args,
        total_steps=train.total_steps,
        eval_env=eval_env,
        log_every=train.log_every,
        progress=train.progress,
        progress_log=progress_log,
        checkpoint_every=train.checkpoint_every,
        save_checkpoint=lambda: save_checkpoint(
            logdir,
            learner.agent,
            run,
            objects,
            skip=() if train.mode == "single" else ["collector"],
        ),
    )
    try:
        if spec.family == "on_policy":
            learner = spec.build(config, eval_env.observation_space, eval_env.action_space)
            objects.update(collector=make_collector(config, learner.agent), eval_env=eval_env)
        else:
            env = make_env_fn(config)()
            learner = spec.build(config, env.observation_space, env.action_space)
            memory = learner.memory
            if learner.eval_agent is not None:  # its generator, for an exact resume
                objects["eval_rng"] = learner.eval_agent.rng
            if train.mode == "single":
                if learner.n_step > 1:
                    memory = NStepAdder(memory, learner.n_step, config.agent.gamma)
                objects.update(env=env, loop=OffPolicyState.start(env, train.seed))
            else:
                objects["writer"] = ReplayWriter(
                    memory,
                    n_step=learner.n_step,
                    gamma=config.agent.gamma,
                    reward_fn=learner.reward_fn,
                )
                env.action_space.seed(train.seed)
                # The warm-up's random actions, each worker its share of what is left of them.
                warm_up = max(config.agent.learning_starts - (resume_step or 0), 0)
                random_steps = warm_up // train.actors
                acting = learner.acting or BatchActing(
                    learner.agent, env.action_space, random_steps
                )
                env.close()
                objects["collector"] = make_collector(config, acting)
            objects.update(eval_env=eval_env, memory=memory)

        if checkpoint is not None:
            state = load_checkpoint(checkpoint, learner.agent)
            objects.update(state["objects"])
            if "collector" in objects and "collector" not in state["objects"]:  # workers' envs
                objects["collector"].offset = state["env_steps"]
                if "writer" in objects:  # the episodes under way ended with their workers
                    objects["writer"].drop_pending()
            elif "collector" in objects:
                objects["collector"].sampler.agent = learner.agent  # not the pickled copy
            learner.memory = objects.get("memory", learner.memory)
            if "writer" in objects:
                objects["writer"].memory = learner.memory
            if "eval_rng" in objects:
                learner.eval_agent.rng = objects["eval_rng"]
            run.eval_env = objects["eval_env"]
            run.load_state_dict(state["run"])
            _set_rng_state(learner.agent, state["rng"])
            logger.info("resumed %s from %s (env step %d)", logdir, checkpoint, run.env_steps)

        if learner.acting is not None and "writer" in objects:  # priorities from the actors' Q
            objects["writer"].bootstrap_q = functools.partial(_outputs, learner.agent)
            objects["writer"].priority = functools.partial(_priority, learner.agent)
        # Videos are written here; without evaluations (eval_every 0) no evaluator is started.
        if train.mode != "single" and not train.capture_video and train.eval_every > 0:
            from parl_algos.train._evaluator import RemoteEvaluator

            run.evaluator = RemoteEvaluator(
                make_env_fn(config), learner.eval_agent or learner.agent
            )
            run.weights = learner.agent.get_weights
        with _Interrupt(run):
            _train_loop(spec, learner, run, objects, args)
            run.collect_evaluation(wait=True)
        if not run.interrupted and run.last_row != run.env_steps:
            run.write_row()  # the last step's row
        run.checkpoint()
    except BaseException:
        run.clear_progress()
        raise
    finally:
        run.evaluator = run._pending = None  # the actor goes with its handle and its call
        if "collector" in objects:
            objects["collector"].close()
    summary = dataclasses.asdict(run.finish(learner.agent))
    run.eval_env.close()  # a video recorder writes its last video here
    return RunResult(logdir, run.env_steps, run.interrupted, summary)


def make_collector(config: Config, agent: Any) -> SamplerCollector:
    """The sampler of a run: in-process (`single`) or on worker actors (`sync`, `async`).

    `async` uses an `AsyncSampler` where `sync` uses a `ParallelSampler`: workers never wait
    for the learner, which takes each worker's batch as it comes (IMPALA's V-trace corrects
    for the policy lag; off-policy algorithms learn from the replay memory, Ape-X style).

    On-policy, `single` steps `env.num_envs` environments with a `SerialSampler` and `sync`
    splits them over `train.actors` workers of a `ParallelSampler` (at least one each), for
    `agent.n_steps` steps a round. Off-policy (`sync`, `async`), each worker steps one
    environment for `train_freq / actors` steps a batch (at least 8), acting with `agent`
    (a DQN-family agent's `QActing`: the exploration the learner decides). Workers run on the
    cluster of `train.address`, or on an embedded one of `actors + 1` slots.

    On-policy `async` keeps the batches fresh and the learner first: with several workers each
    has one rollout under way or waiting (not two: half the policy lag, the learner still fed
    while a worker's rollout lasts no longer than two of its updates), and the workers run at
    niceness `ASYNC_WORKER_NICE` (`AsyncSampler`'s `worker_nice`). The learner's update is
    what bounds the rate there; at equal priority each worker's session took as large a share
    of a busy core as the learner's, and the workers' lead only aged the data.
    """
    from parl.samplers import AsyncSampler, ParallelSampler, SerialSampler

    train = config.train
    if get_spec(config.algorithm).family == "on_policy":
        horizon, num_envs = config.agent.n_steps, config.env.num_envs
    else:
        horizon, num_envs = max(config.agent.train_freq // train.actors, 8), train.actors
    if train.mode == "single":
        sampler = SerialSampler(
            make_env_fn(config),
            agent,
            num_workers=1,
            envs_per_worker=num_envs,
            horizon=horizon,
            seed=train.seed,
        )
        return SamplerCollector(sampler)
    import parl

    if train.address is None:
        parl.connect(cpu_num=train.actors + 1, backend=train.backend)
    else:
        parl.connect(train.address, backend=train.backend)
    options = _async_options(config) if train.mode == "async" else {}
    sampler_cls = ParallelSampler if train.mode == "sync" else AsyncSampler
    sampler = sampler_cls(
        make_env_fn(config),
        agent,
        num_workers=train.actors,
        envs_per_worker=max(num_envs // train.actors, 1),
        horizon=horizon,
        seed=train.seed,
        **options,
    )
    return SamplerCollector(sampler, weights_every=train.weights_every)


def _async_options(config: Config) -> dict[str, Any]:
    """`AsyncSampler`'s `slots` and `worker_nice` for an `async` run (see `make_collector`)."""
    if get_spec(config.algorithm).family != "on_policy":
        return {}
    return {"slots": 1 if config.train.actors > 1 else 2, "worker_nice": ASYNC_WORKER_NICE}


def _train_loop(
    spec: AlgorithmSpec, learner: Learner, run: _Run, objects: dict[str, Any], args: Any
) -> None:
    if run.done or run.env_steps >= args.total_steps:
        return
    eval_policy = None if learner.eval_agent is None else learner.eval_agent.predict
    if spec.family == "on_policy":
        train_on_policy(
            run, objects["collector"], learner.agent, args, before_learn=learner.before_learn
        )
    elif "collector" in objects:
        train_off_policy_rounds(
            run,
            objects["collector"],
            learner.agent,
            objects["writer"],
            args,
            after_step=learner.after_step,
            acting=learner.acting,
            eval_policy=eval_policy,
        )
    else:
        train_off_policy(
            run,
            objects["env"],
            learner.agent,
            objects["memory"],
            args,
            after_step=learner.after_step,
            reward_fn=learner.reward_fn,
            eval_policy=eval_policy,
            state=objects["loop"],
        )


@torch.no_grad()
def _outputs(agent: Any, obs: np.ndarray) -> np.ndarray:
    """The learner's network outputs for a batch of observations (a distribution's too)."""
    return agent.alg.model(to_tensor(obs, agent.device)).cpu().numpy()


def _priority(agent: Any, *arrays: np.ndarray) -> np.ndarray:
    """`DQN.priority` on numpy arrays (see `ReplayWriter`)."""
    tensors = [to_tensor(np.asarray(a, np.float32), agent.device) for a in arrays]
    return agent.alg.priority(*tensors).cpu().numpy()
