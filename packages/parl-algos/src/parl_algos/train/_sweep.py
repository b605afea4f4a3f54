"""Sweeps of `parl-train`: Optuna decides, the cluster runs the trials, each a run directory.

    parl-train ppo/cartpole --sweep space.toml --trials 16 --parallel 2 [--seeds 3]

A space file names the keys to search by their dotted names, each with its distribution, and
how to search:

    [space]
    "agent.lr" = { log_uniform = [1e-5, 1e-2] }
    "agent.n_steps" = { choice = [16, 32, 64] }
    "agent.clip_coef" = { uniform = [0.1, 0.3] }
    "agent.update_epochs" = { int = [4, 20] }
    [sweep]
    objective = "final"      # "auc" (mean return over the run), "steps_to_target"
    sampler = "tpe"           # "random", "grid"
    pruner = "median"         # "none", "halving"

`read_space` checks it against the config before anything starts (a key the config lacks, a
distribution of another type than the key's, an empty range: one `ConfigError` naming the
key). `sweep` drives the study with Optuna's ask-and-tell interface: it asks a trial, runs its
seeds side by side as actors of the cluster (`TrialRunner`, `parallel` trials at a time: an
embedded cluster has `parallel * seeds` slots) and tells Optuna its objective, the median over
the trial's seeds of what its runs' progress rows say. A trial's runs
report the objective of their rows so far at each of their checkpoints, to the study's storage,
and stop when Optuna's pruner says so: a pruned trial's rows end before its budget.

The study lives in Optuna's storage (`study.db`, SQLite, in the sweep directory, or the
`--storage` URL), so the same command continues a sweep that was stopped: trials that
finished are kept, trials left running by a process that is gone are marked failed and run
again with their parameters, and `--trials` counts the completed and pruned trials in all. A
running trial's actor records Optuna's heartbeat in the storage (`HEARTBEAT_S`); a trial
whose heartbeat is older than `HEARTBEAT_GRACE_S` was left by an actor or host that went,
wherever it ran, and is run again too, as is a trial whose actor dies while the sweep runs.
At the end the sweep directory holds `trials.csv` (a row a trial), `best.toml` (the best
trial's complete config, runnable as `parl-train DIR/best.toml`), `sweep.png` (the
objective by trial and the parameters' importances) and a summary table on the terminal.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import math
import os
import socket
import statistics
import threading
import time
import tomllib
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import parl
from parl.utils import logger
from parl_algos.train._config import (
    SECTIONS,
    Config,
    ConfigError,
    TrainSection,
    dump_config,
    section_from_table,
)
from parl_algos.train._run import Run, env_name
from parl_algos.train._skeleton import run
from parl_algos.train._spec import AlgorithmSpec, check_config
from parl_remote import RemoteActorDiedError

__all__ = [
    "DISTRIBUTIONS",
    "HEARTBEAT_GRACE_S",
    "HEARTBEAT_S",
    "OBJECTIVES",
    "PRUNERS",
    "Param",
    "RemoteTrialRunner",
    "SAMPLERS",
    "Space",
    "SweepResult",
    "TrialJob",
    "TrialOutcome",
    "TrialRunner",
    "apply_params",
    "check_single",
    "connect_cluster",
    "default_sweep_dir",
    "objective_of_rows",
    "read_space",
    "read_space_table",
    "run_dirs",
    "space_params",
    "sweep",
    "write_outputs",
]

DISTRIBUTIONS = ("log_uniform", "uniform", "int", "choice")
OBJECTIVES = ("final", "auc", "steps_to_target")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "none", "halving")
_SWEEP_KEYS = ("objective", "sampler", "pruner", "startup_trials", "warmup_steps")
_INSTALL = "pip install 'parl-algos[sweep]'"
_DRIVER = "parl_driver"  # user attribute of a trial: the host and pid of the process asking it
_PRUNED = "pruned_at"  # user attribute of a trial: the env step a seed's run was pruned at
_POLL_S = 0.2
HEARTBEAT_S = 10
"""Seconds between two heartbeats of a running trial, recorded in the study's storage."""
HEARTBEAT_GRACE_S = 60
"""A running trial without a heartbeat for this long is failed and run again."""


@dataclass(frozen=True)
class Param:
    """One key of the search space.

    Attributes:
        key: the config's dotted key (`agent.lr`).
        kind: one of `DISTRIBUTIONS`.
        values: `(low, high)` for the ranges, the values for `choice`.
    """

    key: str
    kind: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Space:
    """A space file, checked: the parameters and how to search them.

    Attributes:
        params: the keys searched, in the file's order.
        objective: `final` (the last row's mean return), `auc` (the mean of every row's) or
            `steps_to_target` (the first env step whose row reaches `train.target_return`,
            minimized; a run that never does scores its budget).
        sampler: Optuna's `TPESampler`, `RandomSampler` or `GridSampler` (choice and int only).
        pruner: Optuna's `MedianPruner`, none, or `SuccessiveHalvingPruner`.
        startup_trials: the median pruner prunes nothing before this many trials completed.
        warmup_steps: nor before this many env steps of a run.
        text: the file's text (kept with the study: a sweep continues with the same space).
    """

    params: tuple[Param, ...]
    objective: str = "final"
    sampler: str = "tpe"
    pruner: str = "median"
    startup_trials: int = 5
    warmup_steps: int = 0
    text: str = ""

    @property
    def direction(self) -> str:
        """`maximize` for the returns, `minimize` for `steps_to_target`."""
        return "minimize" if self.objective == "steps_to_target" else "maximize"


@dataclass(frozen=True)
class SweepResult:
    """How a sweep ended.

    Attributes:
        sweep_dir: its directory.
        completed: completed and pruned trials in its study.
        best_number: the best completed trial (None: none completed).
        best_value: its objective.
        interrupted: True when Ctrl-C stopped it (the same command continues it).
    """

    sweep_dir: str
    completed: int
    best_number: int | None
    best_value: float | None
    interrupted: bool = False


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(f"--sweep needs optuna: {_INSTALL}") from None
    return optuna


# -- the space ------------------------------------------------------------------------------------


def read_space(path: str, config: Config) -> Space:
    """Read the space file `path` and check it against `config`.

    Raises:
        ConfigError: the file is missing or not TOML; a key the config lacks; a distribution
            unknown or of another type than its key; an empty range; a bad `[sweep]` value;
            optuna missing (the extra to install).
    """
    _optuna()
    text, table = read_space_table(path, ("space", "sweep"))
    params = space_params(path, table, config)
    options = table.get("sweep", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: 'sweep' must be a table ([sweep])")
    for key in options:
        if key not in _SWEEP_KEYS:
            raise ConfigError(
                f"{path}: unknown key sweep.{key}; allowed in [sweep]: {', '.join(_SWEEP_KEYS)}"
            )
    chosen = {}
    for key, allowed in (("objective", OBJECTIVES), ("sampler", SAMPLERS), ("pruner", PRUNERS)):
        value = options.get(key, allowed[0] if key != "sampler" else "tpe")
        if value not in allowed:
            raise ConfigError(f"{path}: sweep.{key}={value!r}; allowed: {', '.join(allowed)}")
        chosen[key] = value
    for key in ("startup_trials", "warmup_steps"):
        value = options.get(key, {"startup_trials": 5, "warmup_steps": 0}[key])
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{path}: sweep.{key}={value!r} must be an integer, 0 or more")
        chosen[key] = value
    result = Space(params=params, text=text, **chosen)
    if result.sampler == "grid":
        ranges = [p.key for p in params if p.kind in ("log_uniform", "uniform")]
        if ranges:
            raise ConfigError(
                f"{path}: sampler 'grid' searches choice and int keys only; {ranges[0]} is a "
                "continuous range (give it as choice = [...])"
            )
    if result.objective == "steps_to_target" and config.train.target_return is None:
        raise ConfigError(
            f"{path}: objective 'steps_to_target' needs train.target_return in the config"
        )
    return result


def read_space_table(path: str, tables: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """The text of the space file `path` and its TOML, whose tables must be among `tables`.

    Raises:
        ConfigError: the file is missing, not TOML, or has another table.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        table = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"space file {path!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"space file {path!r} is not valid TOML: {exc}") from None
    unknown = sorted(table.keys() - set(tables))
    if unknown:
        shown = ", ".join(f"[{t}]" for t in tables)
        raise ConfigError(f"{path}: unknown table(s) {unknown}; a space file has {shown}")
    return text, table


def space_params(path: str, table: dict[str, Any], config: Config) -> tuple[Param, ...]:
    """The `[space]` of a space file's `table`, each key checked against `config`.

    Raises:
        ConfigError: no key; a key the config lacks; a distribution unknown or of another type
            than its key; an empty range.
    """
    space = table.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(
            f'{path}: [space] must name at least one key, e.g. "agent.lr" = '
            "{ log_uniform = [1e-5, 1e-2] }"
        )
    return tuple(_param(path, key, value, config) for key, value in space.items())


def _param(path: str, key: str, value: Any, config: Config) -> Param:
    """One `[space]` entry, checked against the type of the config's key."""
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name or "." in name:
        raise ConfigError(
            f"{path}: space key {key!r} must be section.key with a section among "
            f"{', '.join(SECTIONS)}"
        )
    if key in ("train.seed", "train.logdir", "train.mode", "train.address"):
        raise ConfigError(f"{path}: space key {key} is the sweep's own, not a hyperparameter")
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
        raise ConfigError(
            f"{path}: {key} must be one of {{ log_uniform = [LOW, HIGH] }}, "
            "{ uniform = [LOW, HIGH] }, { int = [LOW, HIGH] }, { choice = [A, B, ...] }"
        )
    ((kind, values),) = value.items()
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{path}: {key}: {kind} needs a non-empty list, got {values!r}")
    checked = [_checked(path, config, section, name, v) for v in values]
    if kind == "choice":
        if len(set(map(repr, checked))) < len(checked):
            raise ConfigError(f"{path}: {key}: choice has a value twice: {values!r}")
        return Param(key, kind, tuple(checked))
    if len(checked) != 2:
        raise ConfigError(f"{path}: {key}: {kind} needs [LOW, HIGH], got {values!r}")
    low, high = checked
    is_float = isinstance(low, float)
    if kind == "int" and is_float:
        raise ConfigError(f"{path}: {key} is a number: search it with uniform or log_uniform")
    if kind != "int" and not is_float:
        what = "not a number" if isinstance(low, bool | str) else "an integer"
        raise ConfigError(f"{path}: {key} is {what}: search it with int or choice")
    if not low < high:
        raise ConfigError(f"{path}: {key}: the range [{low}, {high}] is empty (LOW < HIGH)")
    if kind == "log_uniform" and low <= 0:
        raise ConfigError(f"{path}: {key}: log_uniform needs LOW > 0, got {low}")
    return Param(key, kind, (low, high))


def _checked(path: str, config: Config, section: str, name: str, value: Any) -> Any:
    """`value` as the config's `section.name` takes it (ConfigError naming the key if not)."""
    current = config.section(section)
    table = {**dataclasses.asdict(current), name: value}
    table = {k: v for k, v in table.items() if v is not None}  # none: an absent key
    try:
        checked = section_from_table(section, type(current), table, path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return getattr(checked, name)


def apply_params(config: Config, params: dict[str, Any]) -> Config:
    """A copy of `config` with each dotted key of `params` set."""
    result = copy.deepcopy(config)
    for key, value in params.items():
        section, _, name = key.partition(".")
        setattr(result.section(section), name, value)
    return result


def _distributions(space: Space) -> dict[str, Any]:
    optuna = _optuna()
    d = optuna.distributions
    made: dict[str, Any] = {}
    for p in space.params:
        if p.kind == "choice":
            made[p.key] = d.CategoricalDistribution(list(p.values))
        elif p.kind == "int":
            made[p.key] = d.IntDistribution(p.values[0], p.values[1])
        else:
            made[p.key] = d.FloatDistribution(p.values[0], p.values[1], log=p.kind == "log_uniform")
    return made


def _sampler(space: Space, seed: int) -> Any:
    samplers = _optuna().samplers
    if space.sampler == "random":
        return samplers.RandomSampler(seed=seed)
    if space.sampler == "grid":
        grid = {
            p.key: list(p.values)
            if p.kind == "choice"
            else list(range(p.values[0], p.values[1] + 1))
            for p in space.params
        }
        return samplers.GridSampler(grid, seed=seed)
    return samplers.TPESampler(seed=seed)


def _grid_size(space: Space) -> int:
    return math.prod(
        len(p.values) if p.kind == "choice" else p.values[1] - p.values[0] + 1 for p in space.params
    )


def _pruner(space: Space) -> Any:
    pruners = _optuna().pruners
    if space.pruner == "median":
        return pruners.MedianPruner(
            n_startup_trials=space.startup_trials, n_warmup_steps=space.warmup_steps
        )
    if space.pruner == "halving":
        return pruners.SuccessiveHalvingPruner()
    return pruners.NopPruner()


def _storage(url: str, grace_s: int = HEARTBEAT_GRACE_S) -> Any:
    """Optuna's RDB storage at `url`, with heartbeats; SQLite waits for a writer.

    A running trial's actor records its heartbeat every `HEARTBEAT_S`; a trial whose last
    heartbeat is older than `grace_s` was left by a process that is gone, wherever it ran.
    """
    optuna = _optuna()
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with _experimental():
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=kwargs,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=max(grace_s, 1),
            heartbeat_stale_trial_callback=_requeue_stale,
        )


@contextlib.contextmanager
def _experimental() -> Iterator[None]:
    """Optuna's heartbeats without its warnings: experimental, and meant for `Study.optimize`.

    The trials' heartbeats are recorded here, by their actors (ask-and-tell has none of its
    own), which the second warning at each `Study.ask` does not know.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _optuna().exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed", UserWarning)
        yield


# -- the objective ------------------------------------------------------------------------------


def objective_of_rows(
    rows: Sequence[tuple[int, float | None]], objective: str, *, target: float | None, budget: int
) -> float | None:
    """The objective of a run's progress rows `(env_step, mean_return)` (None: no return yet).

    Args:
        rows: the rows so far (a mean return of None: no episode had finished).
        objective: one of `OBJECTIVES`.
        target: `train.target_return` (for `steps_to_target`).
        budget: `train.total_steps`: what a run scores that never reaches the target.
    """
    returns = [(step, r) for step, r in rows if r is not None and math.isfinite(r)]
    if objective == "steps_to_target":
        assert target is not None  # read_space refuses the objective without one
        reached = [step for step, r in returns if r >= target]
        return float(reached[0]) if reached else float(budget)
    if not returns:
        return None
    if objective == "auc":
        return float(statistics.fmean(r for _, r in returns))
    return float(returns[-1][1])


def _read_rows(path: str) -> list[tuple[int, float | None]]:
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [
            (int(row["env_step"]), float(row["mean_return"]) if row["mean_return"] else None)
            for row in csv.DictReader(f)
        ]


class _Reporting(Run):
    """A run that tells a reporter its env step after each checkpoint, and stops when told.

    `sweep` makes a subclass of it and the algorithm's own `Run` class per trial run, with
    `reporter` set: it returns True when the trial is to be pruned.
    """

    reporter: Callable[[int], bool]
    pruned = False

    @property
    def done(self) -> bool:
        """The run's own `done`, or pruned."""
        return super().done or self.pruned

    def checkpoint(self) -> None:
        """Write the checkpoint, then report the run's env step."""
        before = self.last_checkpoint
        super().checkpoint()
        if self.last_checkpoint != before:
            self.pruned = type(self).reporter(self.env_steps)


def _reporting(run_cls: type[Run], reporter: Callable[[int], bool]) -> type[Run]:
    bases = (_Reporting,) if run_cls is Run else (_Reporting, run_cls)
    return type(f"Sweep{run_cls.__name__}", bases, {"reporter": staticmethod(reporter)})


# -- a trial, in an actor -------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialJob:
    """What an actor needs to run one seed of a trial: `seeds[index]`.

    The trial's seeds run side by side, each in an actor of its own.
    """

    config: Config
    spec: AlgorithmSpec
    trial_dir: str
    seeds: tuple[int, ...]
    space: Space
    storage: str
    study_name: str
    number: int
    index: int = 0


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial's runs came to.

    Attributes:
        values: each seed's objective, in seed order (fewer when one failed).
        pruned: Optuna's pruner stopped it.
        error: the first line of what failed (the traceback is in the run's log.log).
    """

    values: tuple[float | None, ...]
    pruned: bool
    error: str | None = None


def run_dirs(trial_dir: str, seeds: Sequence[int]) -> list[str]:
    """The run directory of each seed: the trial's own with one seed, `seed-<n>/` with more."""
    if len(seeds) == 1:
        return [trial_dir]
    return [os.path.join(trial_dir, f"seed-{seed}") for seed in seeds]


class TrialRunner:
    """Runs one seed of a trial of a sweep at a time, in an actor of the cluster, in `single` mode.

    The run reports the objective of its progress rows at its checkpoints to the study's
    storage (as `<seed index> * total_steps + env step`, so that runs of the same seed are
    compared at the same steps) and stops when the study's pruner says so, or when another
    seed of its trial was pruned (the trial's `pruned` attribute in the storage).
    """

    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)  # one slot, one core

    def run_trial(self, job: TrialJob) -> TrialOutcome:
        """Run `job`'s seed; its objective, or where it stopped."""
        optuna = _optuna()
        storage = _storage(job.storage)
        study = optuna.load_study(
            study_name=job.study_name, storage=storage, pruner=_pruner(job.space)
        )
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(job.study_name), job.number
        )
        trial = optuna.trial.Trial(study, trial_id)
        stop = threading.Event()
        beat = threading.Thread(
            target=_heartbeats, args=(storage, trial_id, stop), name="heartbeat", daemon=True
        )
        beat.start()
        try:
            return self._run_seed(
                job, trial, lambda: _PRUNED in storage.get_trial_user_attrs(trial_id)
            )
        finally:
            stop.set()
            beat.join()

    def _run_seed(
        self, job: TrialJob, trial: Any, sibling_pruned: Callable[[], bool]
    ) -> TrialOutcome:
        budget, target = job.config.train.total_steps, job.config.train.target_return
        index = job.index
        logdir = run_dirs(job.trial_dir, job.seeds)[index]
        config = copy.deepcopy(job.config)
        config.train.seed = job.seeds[index]
        config.train.logdir = logdir
        config.train.progress = False
        rows = os.path.join(logdir, "progress.csv")
        pruned: list[int] = []  # the env step the pruner stopped this run at

        def report(env_step: int) -> bool:
            value = objective_of_rows(
                _read_rows(rows), job.space.objective, target=target, budget=budget
            )
            if value is None or env_step >= budget:  # the last checkpoint: nothing to stop
                return False
            if sibling_pruned():
                pruned.append(env_step)
                return True
            trial.report(value, index * budget + env_step)
            if trial.should_prune():
                trial.set_user_attr(_PRUNED, env_step)  # the trial's other seeds stop too
                pruned.append(env_step)
            return bool(pruned)

        spec = dataclasses.replace(job.spec, run_cls=_reporting(job.spec.run_cls, report))
        try:
            result = run(config, spec, logdir)
        except Exception as exc:
            os.makedirs(logdir, exist_ok=True)
            with open(os.path.join(logdir, "log.log"), "a", encoding="utf-8") as f:
                f.write("".join(traceback.format_exception(exc)))
            line = (str(exc).strip().splitlines() or [""])[0]
            return TrialOutcome((), False, f"{type(exc).__name__}: {line}")
        value = objective_of_rows(
            _read_rows(rows), job.space.objective, target=target, budget=budget
        )
        if pruned:
            return TrialOutcome((value,), True)
        if result.interrupted:
            return TrialOutcome((value,), False, f"interrupted at env step {result.env_steps}")
        return TrialOutcome((value,), False)


def _combined(outcomes: Sequence[TrialOutcome]) -> TrialOutcome:
    """A trial's outcome from its seeds' (in seed order): pruned if one was, its first error."""
    errors = [o.error for o in outcomes if o.error is not None]
    return TrialOutcome(
        tuple(v for o in outcomes for v in o.values),
        any(o.pruned for o in outcomes),
        errors[0] if errors else None,
    )


def _heartbeats(storage: Any, trial_id: int, stop: threading.Event) -> None:
    """Record the trial's heartbeat every `HEARTBEAT_S` until `stop` is set."""
    while True:
        try:
            storage.record_heartbeat(trial_id)
        except Exception as exc:  # a busy database: the next beat may pass
            logger.warning("sweep: trial heartbeat not recorded (%s)", exc)
        if stop.wait(HEARTBEAT_S):
            return


RemoteTrialRunner = parl.remote_class(wait=False)(TrialRunner)
"""`TrialRunner` as an actor whose calls return futures."""


# -- the sweep ------------------------------------------------------------------------------------


def check_single(config: Config, what: str) -> None:
    """Raise ConfigError unless `config` trains in `single` mode (`what`: "a sweep", "PBT").

    Sweeps and populations are parallel across their runs: each run is one actor, the cluster's
    slots run many side by side. A run in sync or async mode would want slots of its own for
    its sampling actors, taken from the other runs of the same cluster; the same slots give
    more when each runs a whole trial.
    """
    if config.train.mode != "single":
        raise ConfigError(
            f"{what} trains each run in single mode, one actor a run, and puts the cluster's "
            f"slots to running runs side by side (train.mode={config.train.mode!r}); give "
            "--mode single, and --parallel K (a sweep) or --population P for more at a time"
        )


def connect_cluster(config: Config, slots: int) -> None:
    """Connect to the cluster the runs of a sweep or a population go to, on `train.backend`.

    `train.address` (xparl's master, or what `ray.init` takes), else an embedded cluster of
    `slots` slots (a local Ray of `slots` CPUs with `backend = "ray"`). A run's lines go to its
    run directory's log.log, not to this terminal.
    """
    train = config.train
    if train.address is None:
        parl.connect(cpu_num=slots, backend=train.backend, log_to_driver=False)
    else:
        parl.connect(train.address, backend=train.backend, log_to_driver=False)


def default_sweep_dir(
    config: Config, space_path: str, root: str = "train_log", kind: str = "sweep"
) -> str:
    """`train_log/<algorithm>-<env>/<kind>-<space file's name>`: the same for the same command.

    `kind` is "sweep", or "pbt" for a population.
    """
    stem = os.path.splitext(os.path.basename(space_path))[0]
    return os.path.join(
        root, f"{config.algorithm.lower()}-{env_name(config.env.id)}", f"{kind}-{stem}"
    )


def _alive(driver: Any) -> bool:
    """Whether the process that asked a trial may still run it (only this host's are known)."""
    if not isinstance(driver, dict) or driver.get("host") != socket.gethostname():
        return True
    pid = driver.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return pid == os.getpid()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _requeue_orphans(study: Any) -> int:
    """Fail the trials left running by a process that is gone; ask them again. How many.

    Gone: a driver of this host that no longer runs, or, wherever it ran, a trial whose last
    heartbeat is older than the storage's grace period (its actor, or its host, went).
    """
    optuna = _optuna()
    TrialState = optuna.trial.TrialState

    def running() -> list[Any]:
        return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    before = {t.number for t in running()}
    with _experimental():
        optuna.storages.fail_stale_trials(study)  # each asked again by _requeue_stale
    left = running()
    orphans = [t for t in left if not _alive(t.user_attrs.get(_DRIVER))]
    for t in orphans:
        _fail_and_requeue(study, t.number, t.params)
    return len(before) - len(left) + len(orphans)


def _requeue_stale(study: Any, trial: Any) -> None:
    """Ask a trial that `fail_stale_trials` failed again, with its parameters."""
    study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
    logger.info("trial %d lost its heartbeat: it runs again", trial.number)


def _finish(study: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
    """`study.tell`, where the grid sampler's end of the grid is no error.

    `GridSampler` calls `Study.stop` once every point of its grid was asked, which raises
    outside `Study.optimize`; the trial is stored all the same (Optuna stores it in a
    `finally`), and the sweep asks no more than the grid's points anyway.
    """
    try:
        study.tell(trial, *args, **kwargs)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise


def _fail_and_requeue(study: Any, number: int, params: dict[str, Any]) -> None:
    TrialState = _optuna().trial.TrialState
    _finish(study, number, state=TrialState.FAIL, skip_if_finished=True)
    study.enqueue_trial(params, user_attrs={"retry_of": number})
    logger.info("trial %d was interrupted: it runs again", number)


@dataclass
class _Running:
    """A trial being run: its seeds' actors and futures, and the outcomes of those done."""

    trial: Any
    seeds: dict[int, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    outcomes: dict[int, TrialOutcome] = dataclasses.field(default_factory=dict)


def sweep(
    config: Config,
    spec: AlgorithmSpec,
    space: Space,
    *,
    trials: int,
    parallel: int,
    seeds: int = 1,
    sweep_dir: str,
    storage: str | None = None,
    out: Callable[[str], None] = print,
) -> SweepResult:
    """Run the sweep of `space` over `config` until `trials` trials completed or were pruned.

    Args:
        config: the base config (each trial sets the space's keys, its seed and run directory).
        spec: its algorithm's spec.
        space: the checked space (`read_space`).
        trials: completed and pruned trials the study should hold in the end.
        parallel: trials run at a time, each with an actor a seed.
        seeds: runs a trial, side by side, seeds `train.seed`, `train.seed + 1`, ...; the
            median is its objective.
        sweep_dir: the sweep's directory (its trials, outputs and default storage).
        storage: Optuna's storage URL (None: `sqlite:///<sweep_dir>/study.db`).
        out: where the terminal's lines go.

    Raises:
        ConfigError: the sweep directory's study was made with another config or space.
    """
    optuna = _optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    TrialState = optuna.trial.TrialState
    os.makedirs(sweep_dir, exist_ok=True)
    url = storage or f"sqlite:///{os.path.abspath(os.path.join(sweep_dir, 'study.db'))}"
    study_name = os.path.abspath(sweep_dir)
    base_text = dump_config(dataclasses.replace(config, train=_trial_train(config, sweep_dir)))
    rdb = _storage(url)
    study = optuna.create_study(
        study_name=study_name,
        storage=rdb,
        sampler=_sampler(space, config.train.seed),
        pruner=_pruner(space),
        direction=space.direction,
        load_if_exists=True,
    )
    for key, text in (("config", base_text), ("space", space.text), ("seeds", seeds)):
        stored = study.user_attrs.get(key)
        if stored is None:
            study.set_user_attr(key, text)
        elif stored != text:
            raise ConfigError(
                f"{sweep_dir} holds a sweep of another {key}; continue it with its own "
                "command, or give this one another --logdir"
            )
    study_id = rdb.get_study_id_from_name(study_name)
    requeued = _requeue_orphans(study)
    if requeued:
        out(f"sweep: {requeued} interrupted trial(s) run again")
    distributions = _distributions(space)
    if space.sampler == "grid" and trials > (points := _grid_size(space)):
        out(f"sweep: the grid has {points} points: {points} trials, not {trials}")
        trials = points
    seed_list = tuple(config.train.seed + i for i in range(seeds))
    done_states = (TrialState.COMPLETE, TrialState.PRUNED)

    def done_count() -> int:
        return len(study.get_trials(deepcopy=False, states=done_states))

    connect_cluster(config, parallel * seeds)
    slots = min(parallel, max(trials - done_count(), 0)) * len(seed_list)
    idle = [RemoteTrialRunner() for _ in range(slots)]
    running: dict[int, _Running] = {}
    ending: list[tuple[Any, Any]] = []  # (runner, future) of the seeds of a trial run again
    failures = lost = 0
    interrupted = False

    def replacement() -> Any:
        """A new actor for one that died (bounded: a trial is not run again for ever)."""
        nonlocal lost
        lost += 1
        if lost > trials * len(seed_list):
            raise RuntimeError(f"{lost} trial actors died; see the trials' log.log")
        return RemoteTrialRunner()

    try:
        while done_count() < trials:
            while len(idle) >= len(seed_list) and done_count() + len(running) < trials:
                with _experimental():
                    trial = study.ask(distributions)
                trial.set_user_attr(_DRIVER, {"host": socket.gethostname(), "pid": os.getpid()})
                rdb.record_heartbeat(  # the actors' go on from here
                    rdb.get_trial_id_from_study_id_trial_number(study_id, trial.number)
                )
                trial_dir = os.path.join(sweep_dir, f"trial-{trial.number:04d}")
                trial.set_user_attr("run_dir", trial_dir)
                trial_config = apply_params(config, trial.params)
                trial_config.train = _trial_train(trial_config, sweep_dir)
                try:
                    check_config(trial_config, spec)
                except ConfigError as exc:
                    _finish(study, trial, state=TrialState.FAIL)
                    failures += 1
                    out(f"sweep: trial {trial.number} cannot run: {exc}")
                    if failures >= trials:
                        raise
                    continue
                job = TrialJob(
                    trial_config,
                    spec,
                    os.path.abspath(trial_dir),  # an actor's working directory is its own
                    seed_list,
                    space,
                    url,
                    study_name,
                    trial.number,
                )
                started = _Running(trial)
                for index in range(len(seed_list)):  # side by side, an actor a seed
                    runner = idle.pop()
                    future = runner.run_trial(dataclasses.replace(job, index=index))
                    started.seeds[index] = (runner, future)
                running[trial.number] = started
                out(f"sweep: trial {trial.number} started: {_shown(trial.params)}")
            for runner, future in [pair for pair in ending if pair[1].done()]:
                ending.remove((runner, future))
                try:
                    future.get()  # ended by its trial's failure: its value is no one's
                    idle.append(runner)
                except RemoteActorDiedError:
                    idle.append(replacement())
                except Exception as exc:  # the trial it reported to was failed meanwhile
                    logger.info("sweep: a seed of a trial run again ended with %s", exc)
                    idle.append(runner)
            finished = [
                (number, index)
                for number, r in running.items()
                for index, (_, future) in r.seeds.items()
                if future.done()
            ]
            if not finished:
                time.sleep(_POLL_S)
                continue
            for number, index in finished:
                r = running.get(number)
                if r is None:  # run again since: its seeds went to `ending`
                    continue
                runner, future = r.seeds.pop(index)
                try:
                    r.outcomes[index] = future.get()
                except RemoteActorDiedError as exc:  # its process or its host went
                    del future
                    idle.append(replacement())
                    del running[number]
                    ending.extend(r.seeds.values())
                    _fail_and_requeue(study, number, r.trial.params)
                    line = (str(exc).strip().splitlines() or [""])[0]
                    out(f"sweep: trial {number}'s actor died ({line}); it runs again")
                    continue
                idle.append(runner)
                if r.seeds:
                    continue  # its other seeds still run
                del running[number]
                outcome = _combined([r.outcomes[i] for i in sorted(r.outcomes)])
                failures += _tell(study, r.trial, outcome, out)
                if failures >= trials:
                    raise RuntimeError(
                        f"{failures} trials failed, the last with {outcome.error}; see its "
                        f"run directory's log.log ({r.trial.user_attrs['run_dir']})"
                    )
    except KeyboardInterrupt:
        interrupted = True
        for r in running.values():
            _fail_and_requeue(study, r.trial.number, r.trial.params)
        out("sweep: interrupted; the same command continues it")
    finally:
        del idle, running, ending
    best = write_outputs(study, space, config, sweep_dir, out=out)
    return SweepResult(
        sweep_dir,
        done_count(),
        None if best is None else best.number,
        None if best is None else best.value,
        interrupted,
    )


def _trial_train(config: Config, sweep_dir: str) -> Any:
    """The `[train]` section that each trial runs with: no cluster of its own, no bar.

    With tracking, every trial is a run of the sweep's experiment.
    """
    experiment = config.train.track_experiment
    if config.train.track is not None and experiment is None:
        experiment = f"{config.algorithm.lower()}-{env_name(config.env.id)}-"
        experiment += os.path.basename(os.path.normpath(sweep_dir))
    uri = config.train.track_uri
    if config.train.track == "mlflow" and (uri is None or "://" not in uri):
        uri = os.path.abspath(uri or "mlruns")  # here, not in an actor's working directory
    return dataclasses.replace(
        config.train,
        logdir=None,
        address=None,
        backend=TrainSection.backend,  # a trial needs no cluster: continued on any backend
        progress=False,
        track_experiment=experiment,
        track_uri=uri,
    )


def _shown(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _tell(study: Any, trial: Any, outcome: TrialOutcome, out: Callable[[str], None]) -> int:
    """Tell Optuna how `trial` ended and say it; 1 if it failed, else 0."""
    TrialState = _optuna().trial.TrialState
    values = [v for v in outcome.values if v is not None]
    trial.set_user_attr("seed_objectives", list(outcome.values))
    if outcome.error is not None:
        _finish(study, trial, state=TrialState.FAIL)
        out(f"sweep: trial {trial.number} failed: {outcome.error}")
        return 1
    if outcome.pruned:
        _finish(study, trial, state=TrialState.PRUNED)
        out(f"sweep: trial {trial.number} pruned")
        return 0
    if not values:
        _finish(study, trial, state=TrialState.FAIL)
        out(f"sweep: trial {trial.number} failed: its runs finished no episode")
        return 1
    value = float(statistics.median(values))
    _finish(study, trial, value)
    out(f"sweep: trial {trial.number} finished: objective {value:.4g}")
    return 0


# -- outputs --------------------------------------------------------------------------------------


def _value(trial: Any) -> float | None:
    """A trial's objective: its value, or a pruned trial's last reported one."""
    if trial.value is not None:
        return float(trial.value)
    if trial.intermediate_values:
        return float(trial.intermediate_values[max(trial.intermediate_values)])
    return None


def write_outputs(
    study: Any, space: Space, config: Config, sweep_dir: str, *, out: Callable[[str], None]
) -> Any:
    """Write trials.csv, best.toml and sweep.png, print the summary; return the best trial."""
    TrialState = _optuna().trial.TrialState
    keys = [p.key for p in space.params]
    trials = study.get_trials(deepcopy=False)
    with open(os.path.join(sweep_dir, "trials.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["number", "state", "objective", *keys, "run_dir"])
        for t in trials:
            value = _value(t)
            writer.writerow(
                [
                    t.number,
                    t.state.name,
                    "" if value is None else repr(value),
                    *(repr(t.params[k]) if k in t.params else "" for k in keys),
                    t.user_attrs.get("run_dir", ""),
                ]
            )
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if completed else None
    if best is not None:
        best_config = apply_params(config, best.params)
        best_config.train = dataclasses.replace(best_config.train, logdir=None)
        with open(os.path.join(sweep_dir, "best.toml"), "w", encoding="utf-8") as f:
            f.write(
                f"# The best trial ({best.number}) of the sweep in {sweep_dir}: "
                f"{space.objective} = {best.value:.6g}\n"
            )
            f.write(dump_config(best_config))
    _plot(study, space, trials, os.path.join(sweep_dir, "sweep.png"))
    _summary(trials, keys, space, best, sweep_dir, out)
    return best


def _plot(study: Any, space: Space, trials: list[Any], path: str) -> None:
    """The objective by trial (best so far as a line) and the parameters' importances."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    optuna = _optuna()
    TrialState = optuna.trial.TrialState
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for state, marker, label in (
        (TrialState.COMPLETE, "o", "completed"),
        (TrialState.PRUNED, "x", "pruned (last reported)"),
    ):
        points = [
            (t.number, v) for t in trials if t.state == state and (v := _value(t)) is not None
        ]
        if points:
            left.scatter(*zip(*points, strict=True), marker=marker, label=label)
    completed = [(t.number, float(t.value)) for t in trials if t.state == TrialState.COMPLETE]
    if completed:
        pick = min if space.direction == "minimize" else max
        best, line = None, []
        for number, value in completed:
            best = value if best is None else pick(best, value)
            line.append((number, best))
        left.step(*zip(*line, strict=True), where="post", color="gray", label="best so far")
    left.xaxis.get_major_locator().set_params(integer=True)
    left.set_xlabel("trial")
    left.set_ylabel(f"objective ({space.objective})")
    left.set_title("objective by trial")
    left.grid(alpha=0.3)
    if completed:
        left.legend(loc="best", fontsize="small")
    importances: dict[str, float] = {}
    if len(completed) >= 2 and len(space.params) >= 1:
        try:
            importances = optuna.importance.get_param_importances(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            logger.warning("sweep: no parameter importances (%s)", exc)
    if importances:
        names = list(importances)[::-1]
        right.barh(names, [importances[n] for n in names])
        right.set_xlabel("importance (fANOVA)")
    else:
        right.text(0.5, 0.5, "importances need two completed trials", ha="center", va="center")
        right.set_axis_off()
    right.set_title("parameter importances")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summary(
    trials: list[Any],
    keys: list[str],
    space: Space,
    best: Any,
    sweep_dir: str,
    out: Callable[[str], None],
) -> None:
    """The trials as a table, best first, and where the outputs are."""
    reverse = space.direction == "maximize"
    finished = [t for t in trials if _value(t) is not None]
    finished.sort(key=lambda t: (t.state.name != "COMPLETE", -_value(t) if reverse else _value(t)))
    header = ["trial", "state", space.objective, *keys]
    rows = [
        [
            str(t.number),
            t.state.name.lower(),
            _fmt(_value(t)),
            *(_fmt(t.params.get(k)) for k in keys),
        ]
        for t in finished
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if best is None:
        out(f"sweep: no trial completed yet; outputs in {sweep_dir}")
    else:
        out(
            f"sweep: best trial {best.number} ({space.objective} {best.value:.4g}); run its "
            f"config with parl-train {os.path.join(sweep_dir, 'best.toml')}"
        )
