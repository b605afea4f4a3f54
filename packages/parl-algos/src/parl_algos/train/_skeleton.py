"""The run skeleton of `parl-train`, written once: every algorithm's run goes through `run`.

`run(config, spec, logdir)` makes the run directory and drives the algorithm's `Trainer` (see
`_spec.Trainer`); it decides, the Trainer does. A run directory holds `config.toml` (the
resolved config), the TensorBoard events and `log.log`, `progress.csv`, `learning_curve.png`,
the final `agent.ckpt`, and `checkpoints/step-<env steps>/`, which the skeleton writes from the
Trainer's `state_dict` (the one owner of what a checkpoint holds): `agent.ckpt` (its `agent`:
every model, the optimizers, the agent's counters, as `Agent.save` writes them) and `state.pkl`
(the rest of it: the environments, the replay memory, the episodes under way, the RNG states;
and the run's own counters, curves and schedules).

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
import re
import shutil
import signal
from collections.abc import Callable
from typing import Any

import cloudpickle
import torch

from parl.utils import logger
from parl_algos.train._config import Config, dump_config
from parl_algos.train._run import ProgressLog, Run, RunResult, latest_checkpoint
from parl_algos.train._spec import AlgorithmSpec, Trainer, run_args, stat_columns
from parl_algos.train._track import open_tracker

__all__ = ["make_run", "read_checkpoint", "run", "save_checkpoint"]

_CHECKPOINT_FORMAT = "parl-train/2"
_FORMAT_1 = "parl-train/1"
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
    trainer: Trainer | None = None

    def save() -> None:
        assert trainer is not None  # no checkpoint is due before the Trainer trains
        save_checkpoint(logdir, run, trainer.state_dict())

    tracker = open_tracker(config, logdir)
    on_row = None if tracker is None else tracker.log_row
    run = make_run(config, spec, logdir, save, resume_step=resume_step, on_row=on_row)
    try:
        state = None if checkpoint is None else read_checkpoint(checkpoint)
        if state is not None:  # first, so that the Trainer sees the env step it resumes at
            run.load_state_dict(state["run"])
        trainer = spec.trainer(config, spec, run, prepared)  # after the run's seeds
        run.title = trainer.title
        if state is not None:
            trainer.load_state_dict(state["trainer"], state["env_steps"])
            logger.info("resumed %s from %s (env step %d)", logdir, checkpoint, run.env_steps)
        run.eval_env = trainer.eval_env
        if train.mode != "single" and not train.capture_video:  # videos are written here
            run.evaluator = trainer.evaluator()
            run.weights = trainer.agent.get_weights
            if train.restart_actors:
                run.make_evaluator = trainer.evaluator
                run.max_restarts = train.max_restarts
        with _Interrupt(run):
            if not run.done and run.env_steps < train.total_steps:
                trainer.train(run)
            run.collect_evaluation(wait=True)
        if not run.interrupted and run.last_row != run.env_steps:
            run.write_row()  # the last step's row
        run.checkpoint()
    except BaseException:
        run.clear_progress()
        if tracker is not None:
            tracker.finish(logdir, failed=True)
        raise
    finally:
        run.evaluator = run._pending = None  # the actor goes with its handle and its call
        if trainer is not None:
            trainer.close()
    summary = dataclasses.asdict(run.finish(trainer.agent))
    run.eval_env.close()  # a video recorder writes its last video here
    if tracker is not None:
        tracker.finish(logdir, failed=False)
    return RunResult(logdir, run.env_steps, run.interrupted, summary)


def make_run(
    config: Config,
    spec: AlgorithmSpec,
    logdir: str,
    save_checkpoint: Callable[[], None],
    *,
    resume_step: int | None = None,
    on_row: Callable[[int, dict[str, float]], None] | None = None,
) -> Run:
    """The `Run` of `config` in `logdir`, which seeds every generator (before the Trainer).

    Args:
        config: the resolved config.
        spec: its algorithm's spec.
        logdir: the run directory.
        save_checkpoint: called when a checkpoint is due.
        resume_step: the env step of the checkpoint a resumed run continues from (the rows
            of progress.csv past it are dropped).
        on_row: called with each row of progress.csv (a tracker's `log_row`).
    """
    train = config.train
    progress_log = ProgressLog(
        os.path.join(logdir, "progress.csv"),
        stat_columns(spec.stats),
        resume_step=resume_step,
        on_row=on_row,
    )
    return spec.run_cls(
        f"{spec.name} on {config.env.id}",
        run_args(config, spec, logdir),
        total_steps=train.total_steps,
        log_every=train.log_every,
        progress=train.progress,
        progress_log=progress_log,
        checkpoint_every=train.checkpoint_every,
        save_checkpoint=save_checkpoint,
    )


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    return False


def _picklable(state: dict[str, Any]) -> dict[str, Any]:
    """`state` but the values that cannot be pickled (left out with a warning).

    cloudpickle, as the actors' calls: an environment's wrappers may hold closures (gymnasium's
    `RescaleAction`), which it pickles by value.
    """
    kept = {}
    for name, value in state.items():
        try:  # numpy arrays' bytes left out of band: a trial of a 3 GB memory is not a copy
            cloudpickle.dumps(value, protocol=5, buffer_callback=_out_of_band)
        except Exception as exc:  # an environment holding a renderer, a socket, ...
            logger.warning("checkpoint: %s cannot be saved (%s); a resume restarts it", name, exc)
            continue
        kept[name] = value
    return kept


def save_checkpoint(logdir: str, run: Run, trainer_state: dict[str, Any]) -> str:
    """Write `checkpoints/step-<env steps>/` atomically; keep the newest two; return its path.

    Args:
        logdir: the run directory.
        run: the `Run` (its counters, curves and schedules).
        trainer_state: the Trainer's `state_dict`: its `agent` goes to `agent.ckpt` (a file
            `Agent.restore` reads), the rest is pickled to `state.pkl` with the run's state;
            what cannot be pickled is left out with a warning (a resume makes it anew).
    """
    root = os.path.join(logdir, "checkpoints")
    final = os.path.join(root, f"step-{run.env_steps:010d}")
    tmp = os.path.join(root, f".tmp-step-{run.env_steps:010d}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    trainer_state = dict(trainer_state)
    torch.save(trainer_state.pop("agent"), os.path.join(tmp, "agent.ckpt"))
    state = {
        "format": _CHECKPOINT_FORMAT,
        "env_steps": run.env_steps,
        "run": run.state_dict(),
        "trainer": _picklable(trainer_state),
    }
    with open(os.path.join(tmp, "state.pkl"), "wb") as f:
        cloudpickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    older = sorted(n for n in os.listdir(root) if re.fullmatch(r"step-\d+", n))
    for name in older[:-_KEEP_CHECKPOINTS]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    logger.info("checkpoint at env step %d: %s", run.env_steps, final)
    return final


def read_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint's `env_steps`, the run's state (`run`) and the Trainer's (`trainer`).

    Reads both layouts: this one, and that of the first format, whose `state.pkl` kept the
    generators' states (`rng`) apart from the Trainer's own parts (`objects`).
    """
    with open(os.path.join(path, "state.pkl"), "rb") as f:
        state = pickle.load(f)  # the run's own file, written by save_checkpoint
    if state.get("format") == _FORMAT_1:
        state["trainer"] = {**state.pop("objects"), "rng_states": state.pop("rng")}
    elif state.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a parl-train checkpoint (format {state.get('format')!r})")
    agent = torch.load(os.path.join(path, "agent.ckpt"), weights_only=True)
    state["trainer"]["agent"] = agent
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
