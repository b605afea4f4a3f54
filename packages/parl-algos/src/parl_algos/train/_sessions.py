"""Runs of the algorithms whose training loop is their own: a `Session` inside the run directory.

R2D2 (sequences from recurrent actors), A3C (gradients from actors) and GA3C (a predictor
thread and a queue) do not fit the two loops of `parl_algos.training`. Their specs name a
`session` factory and the modes it serves (`AlgorithmSpec.session_modes`); `run_single` hands
those modes to `run_session`, which keeps every rule of a `parl-train` run (config.toml,
progress.csv, TensorBoard events, checkpoints, resume, Ctrl-C, the evaluation actor, the
learning curve) and lets the session do the training.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from parl.utils import logger
from parl_algos.train._config import Config, dump_config

__all__ = ["Session", "connect", "run_session"]


class Session:
    """An algorithm's own training loop, as `run_session` drives it.

    A subclass builds the agent (and its memory) in its constructor, starts its actors in
    `train` (after a resume has restored the agent, so that they get its weights; in the
    `sync` and `async` modes the run is connected to its cluster by then) and stops them in
    `close`.

    Attributes:
        agent: the learner's agent (saved in checkpoints and at the end).
        eval_env: the environment of evaluations in this process (`single` mode, videos).
        title: what is trained on what, for the log and the plot.
    """

    agent: Any
    eval_env: gym.Env
    title: str

    def policy(self) -> Callable[[Any], Any]:
        """The greedy policy evaluations in this process run."""
        return self.agent.predict

    def evaluator(self) -> Any:
        """The evaluation actor of the `sync` and `async` modes (a `RemoteEvaluator`)."""
        raise NotImplementedError

    def objects(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the agent (memory, environments, counters)."""
        return {}

    def restore(self, objects: dict[str, Any], env_steps: int) -> None:
        """Continue from a checkpoint's `objects`, taken at `env_steps`."""

    def train(self, run: Any) -> None:
        """Train until the run's budget is spent or it is done (target, Ctrl-C)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the actors and close the environments (called once, also after an error)."""


def run_session(config: Config, logdir: str, *, resume: bool = False) -> Any:
    """Train `config` with its algorithm's `Session`, writing the run directory `logdir`.

    The counterpart of `run_single` for the modes of `AlgorithmSpec.session_modes`; it
    returns the same `RunResult`.
    """
    from parl_algos.train._algorithms import get_spec, stat_columns
    from parl_algos.train._runner import (
        ProgressLog,
        RunResult,
        _Interrupt,
        _Run,
        _run_args,
        _set_rng_state,
        latest_checkpoint,
        load_checkpoint,
        save_checkpoint,
    )

    spec = get_spec(config.algorithm)
    if spec.session is None:
        raise ValueError(f"{spec.name} has no session of its own")
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "config.toml"), "w", encoding="utf-8") as f:
        f.write(dump_config(config))
    checkpoint = latest_checkpoint(logdir) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"{logdir} has no checkpoint to resume from")
    resume_step = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else None
    train = config.train
    progress_log = ProgressLog(
        os.path.join(logdir, "progress.csv"), stat_columns(spec.stats), resume_step=resume_step
    )
    holder: list[Session] = []
    run = _Run(
        f"{spec.name} on {config.env.id}",
        _run_args(config, spec, logdir),
        total_steps=train.total_steps,
        log_every=train.log_every,
        progress=train.progress,
        progress_log=progress_log,
        checkpoint_every=train.checkpoint_every,
        save_checkpoint=lambda: save_checkpoint(logdir, holder[0].agent, run, holder[0].objects()),
    )
    try:
        session = spec.session(config, logdir)  # after the run seeded every generator
    except BaseException:
        run.clear_progress()
        raise
    holder.append(session)
    run.title, run.eval_env = session.title, session.eval_env
    try:
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, session.agent)
            session.restore(state["objects"], state["env_steps"])
            run.load_state_dict(state["run"])
            _set_rng_state(session.agent, state["rng"])
            logger.info("resumed %s from %s (env step %d)", logdir, checkpoint, run.env_steps)
        if train.mode != "single":
            connect(config)
        if train.mode != "single" and not train.capture_video:  # videos are written here
            run.evaluator = session.evaluator()
            run.weights = session.agent.get_weights
        with _Interrupt(run):
            if not run.done and run.env_steps < train.total_steps:
                session.train(run)
            run.collect_evaluation(wait=True)
        if not run.interrupted and run.last_row != run.env_steps:
            run.write_row()  # the last step's row
        run.checkpoint()
    except BaseException:
        run.clear_progress()
        raise
    finally:
        run.evaluator = run._pending = None  # the actor goes with its handle and its call
        session.close()
    summary = dataclasses.asdict(run.finish(session.agent))
    run.eval_env.close()
    return RunResult(logdir, run.env_steps, run.interrupted, summary)


def connect(config: Config) -> None:
    """Connect to the run's cluster: `train.address`, or an embedded one of `actors + 1` slots."""
    import parl

    train = config.train
    if train.address is None:
        parl.connect(cpu_num=train.actors + 1, backend=train.backend)
    else:
        parl.connect(train.address, backend=train.backend)
