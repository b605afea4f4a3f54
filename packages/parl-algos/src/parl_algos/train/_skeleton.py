"""The run skeleton of `parl-train`, written once: every algorithm's run goes through `run`.

`run(config, spec, logdir)` makes the run directory and drives the algorithm's `Trainer` (see
`_spec.Trainer`); it decides, the Trainer does. A run directory holds `config.toml` (the
resolved config), the TensorBoard events and `log.log`, `progress.csv`, `learning_curve.png`,
the final `agent.ckpt`, and `checkpoints/step-<env steps>/`: `agent.ckpt` (`Agent.save`: every
model, the optimizers, the agent's counters) and `state.pkl` (the Trainer's `state_dict`: the
environments, the replay memory, the episodes under way; the RNG states of python, numpy,
torch and of the agent's own generators; the run's counters, curves and schedules).

The skeleton's order: the spec's `prepare` (before the run's seeds: a dataset, a cluster),
the `Run` (seeds, log, progress bar), the Trainer, the newest checkpoint's state when resuming,
the evaluator actor (`sync` and `async` modes, unless videos are recorded here), `train`
under Ctrl-C's handler, the last evaluation, row and checkpoint, `close`, the summary. Where
every piece of state is in the checkpoint (`single` mode), a run stopped (Ctrl-C, or killed
after a periodic checkpoint) and resumed writes the same rows of progress.csv as the run left
alone; in the other modes the workers' environments start afresh on resume.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import re
import shutil
import signal
from typing import Any

import numpy as np
import torch

from parl.utils import logger
from parl_algos.train._config import Config, dump_config
from parl_algos.train._run import ProgressLog, Run, RunResult, latest_checkpoint
from parl_algos.train._spec import AlgorithmSpec, Trainer, run_args, stat_columns

__all__ = ["run", "save_checkpoint"]

_CHECKPOINT_FORMAT = "parl-train/1"
_KEEP_CHECKPOINTS = 2


def run(config: Config, spec: AlgorithmSpec, logdir: str, *, resume: bool = False) -> RunResult:
    """Train `config` (an algorithm of `spec`) in this process, writing the run directory.

    Args:
        config: the resolved config.
        spec: its algorithm's spec.
        logdir: the run directory (created if needed).
        resume: continue from the newest checkpoint in `logdir`.
    """
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "config.toml"), "w", encoding="utf-8") as f:
        f.write(dump_config(config))
    checkpoint = latest_checkpoint(logdir) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"{logdir} has no checkpoint to resume from")
    resume_step = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else None
    prepared = None if spec.prepare is None else spec.prepare(config, logdir)
    train = config.train
    progress_log = ProgressLog(
        os.path.join(logdir, "progress.csv"), stat_columns(spec.stats), resume_step=resume_step
    )
    trainer: Trainer | None = None

    def save() -> None:
        assert trainer is not None  # no checkpoint is due before the Trainer trains
        save_checkpoint(logdir, trainer.agent, run, trainer.state_dict())

    run = spec.run_cls(
        f"{spec.name} on {config.env.id}",
        run_args(config, spec, logdir),
        total_steps=train.total_steps,
        log_every=train.log_every,
        progress=train.progress,
        progress_log=progress_log,
        checkpoint_every=train.checkpoint_every,
        save_checkpoint=save,
    )
    try:
        state = None if checkpoint is None else _read_state(checkpoint)
        if state is not None:  # first, so that the Trainer sees the env step it resumes at
            run.load_state_dict(state["run"])
        trainer = spec.trainer(config, spec, run, prepared)  # after the run's seeds
        run.title = trainer.title
        if state is not None:
            trainer.agent.restore(os.path.join(checkpoint, "agent.ckpt"))
            trainer.load_state_dict(state["objects"], state["env_steps"])
            _set_rng_state(trainer.agent, state["rng"])
            logger.info("resumed %s from %s (env step %d)", logdir, checkpoint, run.env_steps)
        run.eval_env = trainer.eval_env
        if train.mode != "single" and not train.capture_video:  # videos are written here
            run.evaluator = trainer.evaluator()
            run.weights = trainer.agent.get_weights
        with _Interrupt(run):
            if not run.done and run.env_steps < train.total_steps:
                trainer.train(run)
            run.collect_evaluation(wait=True)
        if not run.interrupted and run.last_row != run.env_steps:
            run.write_row()  # the last step's row
        run.checkpoint()
    except BaseException:
        run.clear_progress()
        raise
    finally:
        run.evaluator = run._pending = None  # the actor goes with its handle and its call
        if trainer is not None:
            trainer.close()
    summary = dataclasses.asdict(run.finish(trainer.agent))
    run.eval_env.close()  # a video recorder writes its last video here
    return RunResult(logdir, run.env_steps, run.interrupted, summary)


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


def _picklable(state: dict[str, Any]) -> dict[str, Any]:
    """`state` but the values that cannot be pickled (left out with a warning)."""
    kept = {}
    for name, value in state.items():
        try:  # numpy arrays' bytes left out of band: a trial of a 3 GB memory is not a copy
            pickle.dumps(value, protocol=5, buffer_callback=_out_of_band)
        except Exception as exc:  # an environment holding a renderer, a socket, ...
            logger.warning("checkpoint: %s cannot be saved (%s); a resume restarts it", name, exc)
            continue
        kept[name] = value
    return kept


def save_checkpoint(logdir: str, agent: Any, run: Run, trainer_state: dict[str, Any]) -> str:
    """Write `checkpoints/step-<env steps>/` atomically; keep the newest two; return its path.

    Args:
        logdir: the run directory.
        agent: the agent (saved with `Agent.save`).
        run: the `TrainingRun` (its counters, curves and schedules).
        trainer_state: the Trainer's `state_dict` to pickle (environments, memory, the
            loop's state); what cannot be pickled is left out with a warning (a resume makes
            it anew).
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
        "objects": _picklable(trainer_state),  # format 1's key for the Trainer's state
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


def _read_state(path: str) -> dict[str, Any]:
    """A checkpoint's `state.pkl`: the run's, the Trainer's and the RNGs' states."""
    with open(os.path.join(path, "state.pkl"), "rb") as f:
        state = pickle.load(f)  # the run's own file, written by save_checkpoint
    if state.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a parl-train checkpoint (format {state.get('format')!r})")
    return state


class _Interrupt:
    """While active, the first Ctrl-C asks the run to stop (checkpoint first); a second quits."""

    def __init__(self, run: Run) -> None:
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
