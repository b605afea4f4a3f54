"""A run of `parl-train` around a training loop of the algorithm's own (offline, multi-agent).

The replay and trajectory families run in `_runner.run_single`; algorithms whose loop is
neither (offline learners stepping through a fixed dataset, multi-agent learners stepping a
PettingZoo environment) give `run_own_loop` three functions and get the same run directory:
`config.toml`, progress.csv, TensorBoard events, `log.log`, checkpoints (`agent.ckpt` and
`state.pkl` with the loop's objects and every RNG state), resume from the newest checkpoint,
Ctrl-C, the learning curve and the final `agent.ckpt`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from parl.utils import logger
from parl_algos.train._algorithms import get_spec, stat_columns
from parl_algos.train._config import Config, dump_config
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

__all__ = ["OwnLoop", "run_own_loop"]


@dataclasses.dataclass(frozen=True)
class OwnLoop:
    """The three parts of an algorithm's own training loop.

    Attributes:
        prepare: `(config, logdir) -> data`, called before the run's clock and seeds start
            (making or loading a dataset: it may train and log on its own).
        build: `(config, data) -> (agent, eval_env, objects)`: the agent, the environment
            of the evaluations (a gymnasium one: `evaluate` plays it), and the loop's state,
            a dict of picklable objects saved with every checkpoint and given back on resume.
        loop: `(run, agent, objects, total_steps)`: train until `run.env_steps` reaches
            `total_steps` or `run.done`, calling `run.record` and `run.maybe_evaluate` after
            every step, and keeping `objects` current, so a checkpoint between two steps
            continues the run.
        run_cls: the `_Run` class (a subclass may define what `mean_return` is).
        skip: names of `objects` that checkpoints leave out (`build` makes them again, as
            a dataset read from its file).
    """

    prepare: Callable[[Config, str], Any]
    build: Callable[[Config, Any], tuple[Any, Any, dict[str, Any]]]
    loop: Callable[[Any, Any, dict[str, Any], int], None]
    run_cls: type = _Run
    skip: tuple[str, ...] = ()


def run_own_loop(config: Config, logdir: str, own: OwnLoop, *, resume: bool = False) -> RunResult:
    """Train `config` with `own`'s loop in this process, writing the run directory `logdir`.

    Args:
        config: the resolved config.
        logdir: the run directory (created if needed).
        own: the loop's parts.
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

    data = own.prepare(config, logdir)
    train = config.train
    progress_log = ProgressLog(
        os.path.join(logdir, "progress.csv"), stat_columns(spec.stats), resume_step=resume_step
    )
    objects: dict[str, Any] = {}
    holder: dict[str, Any] = {}
    run = own.run_cls(
        f"{spec.name} on {config.env.id}",
        _run_args(config, spec, logdir),
        total_steps=train.total_steps,
        log_every=train.log_every,
        progress=train.progress,
        progress_log=progress_log,
        checkpoint_every=train.checkpoint_every,
        save_checkpoint=lambda: save_checkpoint(
            logdir, holder["agent"], run, objects, skip=own.skip
        ),
    )
    try:
        agent, run.eval_env, built = own.build(config, data)
        holder["agent"] = agent
        objects.update(built)
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, agent)
            objects.update(state["objects"])
            run.load_state_dict(state["run"])
            _set_rng_state(agent, state["rng"])
            logger.info("resumed %s from %s (step %d)", logdir, checkpoint, run.env_steps)
        with _Interrupt(run):
            if not run.done and run.env_steps < train.total_steps:
                own.loop(run, agent, objects, train.total_steps)
    except BaseException:
        run.clear_progress()
        raise
    if not run.interrupted and run.last_row != run.env_steps:
        run.write_row()  # the last step's row
    run.checkpoint()
    summary = dataclasses.asdict(run.finish(agent))
    run.eval_env.close()
    return RunResult(logdir, run.env_steps, run.interrupted, summary)
