"""Running a config: the run directory, progress.csv, checkpoints, and the single-process mode.

A run directory holds `config.toml` (the resolved config), the TensorBoard events and
`log.log` (through `TrainingRun`), `progress.csv`, `learning_curve.png`, the final
`agent.ckpt`, and `checkpoints/step-<env steps>/`: `agent.ckpt` (`Agent.save`: every model,
the optimizers, the agent's counters) and `state.pkl` (the training loop's objects: the
environments, the replay memory, the episodes under way; the RNG states of python, numpy,
torch and of the agent's own generators; the run's counters, curves and schedules).

`run_single` trains in one process with the loops of `parl_algos.training`:
`train_on_policy` on a `VectorCollector` for the trajectory-based algorithms and
`train_off_policy` for the replay-based ones; evaluation runs between training steps. Because
every piece of state is in the checkpoint, a run stopped (Ctrl-C, or killed after a periodic
checkpoint) and resumed writes the same rows of progress.csv as the run left alone.
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

from parl.utils import logger
from parl_algos.rollout import Episode, VectorCollector, make_rescaled_env
from parl_algos.train._algorithms import AlgorithmSpec, Learner, get_spec, stat_columns
from parl_algos.train._config import Config, dump_config
from parl_algos.training import (
    OffPolicyArgs,
    OffPolicyState,
    OnPolicyArgs,
    TrainingRun,
    train_off_policy,
    train_on_policy,
)

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "ProgressLog",
    "RunResult",
    "default_logdir",
    "latest_checkpoint",
    "run_single",
]

INTERRUPTED_EXIT_CODE = 130
"""What `parl-train` exits with after Ctrl-C (128 + SIGINT, as a shell reports it)."""

_CHECKPOINT_FORMAT = "parl-train/1"
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
    """`TrainingRun.finish`'s results."""


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
        """`TrainingRun.maybe_evaluate`, then a checkpoint when a multiple is crossed."""
        result = super().maybe_evaluate(policy)
        if self.env_steps >= self._next_checkpoint:
            self._next_checkpoint = (
                self.env_steps // self.checkpoint_every + 1
            ) * self.checkpoint_every
            self.checkpoint()
        return result

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


def _run_args(config: Config, spec: AlgorithmSpec, logdir: str) -> OnPolicyArgs | OffPolicyArgs:
    """The `RunArgs` of the training loops, filled from the config's sections."""
    cls = OnPolicyArgs if spec.family == "on_policy" else OffPolicyArgs
    values = {
        **dataclasses.asdict(config.env),
        **dataclasses.asdict(config.agent),
        **dataclasses.asdict(config.train),
        "env_id": config.env.id,
        "logdir": logdir,
    }
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.SyncVectorEnv:
    """`num_envs` environments stepped in this process with `SAME_STEP` autoreset.

    As `parl_algos.rollout.make_vector_env`, but built from picklable parts, so that a
    checkpoint can hold the environments themselves (their state and random streams).
    """
    return gym.vector.SyncVectorEnv(
        [functools.partial(gym.make, env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """One environment; Box actions are rescaled to `[-1, 1]` (the range of a tanh policy)."""
    env = gym.make(env_id, **kwargs)
    if isinstance(env.action_space, gym.spaces.Box):
        env.close()
        return make_rescaled_env(env_id, **kwargs)
    return env


def make_eval_env(config: Config, logdir: str) -> gym.Env:
    """The evaluation environment; with `train.capture_video`, its episodes are recorded."""
    if not config.train.capture_video:
        return make_env(config.env.id)
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


def _picklable(objects: dict[str, Any]) -> dict[str, Any]:
    """`objects` with those that cannot be pickled left out (with a warning)."""
    kept = {}
    for name, value in objects.items():
        try:
            pickle.dumps(value)
        except Exception as exc:  # an environment holding a renderer, a socket, ...
            logger.warning("checkpoint: %s cannot be saved (%s); a resume restarts it", name, exc)
            continue
        kept[name] = value
    return kept


def save_checkpoint(logdir: str, agent: Any, run: _Run, objects: dict[str, Any]) -> str:
    """Write `checkpoints/step-<env steps>/` atomically; keep the newest two; return its path.

    Args:
        logdir: the run directory.
        agent: the agent (saved with `Agent.save`).
        run: the `TrainingRun` (its counters, curves and schedules).
        objects: the loop's objects to pickle (environments, memory, loop state).
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
        "objects": _picklable(objects),
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
        save_checkpoint=lambda: save_checkpoint(logdir, learner.agent, run, objects),
    )
    if spec.family == "on_policy":
        envs = make_vector_env(config.env.id, config.env.num_envs)
        learner = spec.build(config, envs.single_observation_space, envs.single_action_space)
        objects.update(collector=VectorCollector(envs, seed=train.seed), eval_env=eval_env)
    else:
        env = make_env(config.env.id)
        learner = spec.build(config, env.observation_space, env.action_space)
        objects.update(env=env, eval_env=eval_env, memory=learner.memory)
        objects["loop"] = OffPolicyState.start(env, train.seed)

    if checkpoint is not None:
        state = load_checkpoint(checkpoint, learner.agent)
        objects.update(state["objects"])
        learner.memory = objects.get("memory", learner.memory)
        run.eval_env = objects["eval_env"]
        run.load_state_dict(state["run"])
        _set_rng_state(learner.agent, state["rng"])
        logger.info("resumed %s from %s (env step %d)", logdir, checkpoint, run.env_steps)

    with _Interrupt(run):
        _train_loop(spec, learner, run, objects, args)
    if not run.interrupted and run.last_row != run.env_steps:
        run.write_row()  # the last step's row
    run.checkpoint()
    summary = run.finish(learner.agent)
    return RunResult(logdir, run.env_steps, run.interrupted, summary)


def _train_loop(
    spec: AlgorithmSpec, learner: Learner, run: _Run, objects: dict[str, Any], args: Any
) -> None:
    if run.done or run.env_steps >= args.total_steps:
        return
    if spec.family == "on_policy":
        train_on_policy(
            run, objects["collector"], learner.agent, args, before_learn=learner.before_learn
        )
    else:
        train_off_policy(
            run,
            objects["env"],
            learner.agent,
            objects["memory"],
            args,
            after_step=learner.after_step,
            state=objects["loop"],
        )
