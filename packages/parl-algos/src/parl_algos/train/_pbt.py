"""Population-based training of `parl-train`: members train side by side, the best spread.

    parl-train ppo/cartpole --pbt space.toml --population 4 [--pbt-interval 10000]

A space file names the hyperparameters to explore as a sweep's does, with an optional `[pbt]`
table:

    [space]
    "agent.lr" = { log_uniform = [1e-4, 3e-3] }
    "agent.clip_coef" = { uniform = [0.1, 0.3] }
    "agent.update_epochs" = { int = [4, 20] }
    [pbt]
    resample_probability = 0.25   # explore by drawing anew from the space, else perturb
    quantile = 0.25               # the share of the population that copies, and is copied

Each member starts from its own draw of the space (seed `train.seed + i`) and trains, as an
actor of the cluster, in `single` mode, in its own run directory (`member-<i>/`). The members
train in lockstep: each runs to the next multiple of the interval, where the run skeleton
writes its checkpoint, and stops; the members are ranked by the mean return of their last 10
training episodes (`final_mean_return` of the run, progress.csv's `mean_return`). Each member
of the bottom quarter copies the newest checkpoint and progress.csv of a random member of the
top quarter (weights, optimizers, replay memory, environments, the run's counters: the one
checkpoint format of `parl-train`) and explores from the source's hyperparameters, as Ray
Tune's `PopulationBasedTraining` does: each key is drawn anew from the space with
`resample_probability`, otherwise a range's value is multiplied by 0.8 or 1.2 (kept within
the range) and an int or a choice moves to a neighbouring value. Then every member continues
with `--resume`'s machinery; a member that copied builds its Trainer from its new config and,
after taking the checkpoint, its optimizers take that config's settings (the learning rate).

Keys that shape what a checkpoint holds (the networks, the rollouts, the replay memory, the
environments: every `[env]` and `[train]` key and `FIXED_KEYS`) cannot change within a run
and are refused. `lineage.csv` has a row per member at the start and at each interval: its
return, the member it copied (if it did) and the hyperparameters it continues with. At the
end the best member (the highest return) is named with its run directory, and `best.toml` is
its last config, runnable with `parl-train DIR/best.toml`. With `train.stop_at_target`, the
population stops after the interval in which a member reached `train.target_return`.

A population stopped by Ctrl-C or `kill -9` continues with the same command: `population.json`
(`_Population`) holds the intervals finished, each member's hyperparameters and the random
generator's state, and the interval under way runs again from the members' latest checkpoints.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import parl
from parl_algos.train._config import Config, ConfigError, TrainSection, dump_config
from parl_algos.train._run import Run, latest_checkpoint
from parl_algos.train._skeleton import run
from parl_algos.train._spec import AlgorithmSpec, Trainer, check_config
from parl_algos.train._sweep import (
    Param,
    apply_params,
    check_single,
    connect_cluster,
    default_sweep_dir,
    read_space_table,
    space_params,
)

__all__ = [
    "FIXED_KEYS",
    "MemberJob",
    "MemberOutcome",
    "MemberRunner",
    "PbtResult",
    "PbtSpace",
    "RemoteMemberRunner",
    "check_population",
    "copy_member",
    "default_pbt_dir",
    "exploit",
    "explore",
    "pbt",
    "read_pbt_space",
]

FIXED_KEYS = (
    "agent.hidden_size",
    "agent.n_steps",
    "agent.buffer_size",
    "agent.batch_size",
    "agent.n_step",
    "agent.n_atoms",
    "agent.v_min",
    "agent.v_max",
    "agent.dueling",
    "agent.distributional",
    "agent.noisy",
    "agent.prioritized",
    "agent.variant",
    "agent.mixer",
    "agent.mixing_embed_dim",
    "agent.separate_optimizers",
    "agent.centralized",
    "agent.value_norm",
    "agent.queue_size",
)
"""`[agent]` keys that shape the networks, rollouts or memory a checkpoint holds."""

_PBT_KEYS = ("resample_probability", "quantile")
_STATE = "population.json"  # what continues a stopped population: see `_Population`
Hyperparameters = dict[str, Any]
"""One member's explored values, by dotted key (`agent.lr`)."""
_FACTORS = (0.8, 1.2)


@dataclass(frozen=True)
class PbtSpace:
    """A PBT space file, checked.

    Attributes:
        params: the keys explored, in the file's order.
        resample_probability: the chance that exploring draws a key anew from the space.
        quantile: the share of the population at the bottom that copies one at the top.
        text: the file's text.
    """

    params: tuple[Param, ...]
    resample_probability: float = 0.25
    quantile: float = 0.25
    text: str = ""


@dataclass(frozen=True)
class PbtResult:
    """How a population-based training ended.

    Attributes:
        pbt_dir: its directory.
        best_member: the member with the highest return at the end.
        best_return: that return (None: no member finished an episode).
        best_dir: the best member's run directory.
        intervals: the intervals trained.
        copies: the checkpoints copied in all.
        reached: `(member, env_step, seconds)` of the first member whose return reached
            `train.target_return`, at the end of an interval (the seconds since the start);
            None: none did.
    """

    pbt_dir: str
    best_member: int
    best_return: float | None
    best_dir: str
    intervals: int
    copies: int
    reached: tuple[int, int, float] | None = None


def read_pbt_space(path: str, config: Config) -> PbtSpace:
    """Read the PBT space file `path` and check it against `config`.

    Raises:
        ConfigError: the file is missing or not TOML; a key the config lacks or that cannot
            change within a run; a distribution of another type than its key; an empty range;
            a bad `[pbt]` value.
    """
    text, table = read_space_table(path, ("space", "pbt"))
    params = space_params(path, table, config)
    for p in params:
        if not p.key.startswith("agent.") or p.key in FIXED_KEYS:
            raise ConfigError(
                f"{path}: {p.key} cannot change within a run (it shapes the networks, rollouts, "
                "memory or environments a checkpoint holds); PBT explores [agent] "
                "hyperparameters such as agent.lr; search it with --sweep"
            )
    options = table.get("pbt", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: 'pbt' must be a table ([pbt])")
    chosen: dict[str, float] = {}
    for key, value in options.items():
        if key not in _PBT_KEYS:
            raise ConfigError(
                f"{path}: unknown key pbt.{key}; allowed in [pbt]: {', '.join(_PBT_KEYS)}"
            )
        high = 0.5 if key == "quantile" else 1.0
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
            raise ConfigError(f"{path}: pbt.{key}={value!r} must be a number in (0, {high:g}]")
        chosen[key] = float(value)
    return PbtSpace(params=params, text=text, **chosen)


# -- exploit and explore --------------------------------------------------------------------------


def _draw(p: Param, rng: np.random.Generator) -> Any:
    """A value of `p` drawn anew from its distribution."""
    if p.kind == "choice":
        return p.values[int(rng.integers(len(p.values)))]
    low, high = p.values
    if p.kind == "int":
        return int(rng.integers(low, high + 1))
    if p.kind == "log_uniform":
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    return float(rng.uniform(low, high))


def explore(params: dict[str, Any], space: PbtSpace, rng: np.random.Generator) -> dict[str, Any]:
    """New hyperparameters from `params`, Ray Tune's PBT's way.

    Each key is drawn anew with `space.resample_probability`; otherwise a range's value is
    multiplied by 0.8 or 1.2 (clipped to the range), and an int or a choice moves one step
    up or down (clipped to its ends).
    """
    explored: dict[str, Any] = {}
    for p in space.params:
        value = params[p.key]
        if rng.random() < space.resample_probability:
            explored[p.key] = _draw(p, rng)
            continue
        shift = int(rng.choice((-1, 1)))
        if p.kind == "choice":
            index = min(max(p.values.index(value) + shift, 0), len(p.values) - 1)
            explored[p.key] = p.values[index]
        elif p.kind == "int":
            explored[p.key] = int(min(max(value + shift, p.values[0]), p.values[1]))
        else:
            factor = _FACTORS[0] if shift < 0 else _FACTORS[1]
            explored[p.key] = float(min(max(value * factor, p.values[0]), p.values[1]))
    return explored


def exploit(
    scores: Sequence[float | None], quantile: float, rng: np.random.Generator
) -> dict[int, int]:
    """Which member copies which: `{copier: source}`, the bottom `quantile` from the top.

    The members are ranked by `scores` (None, no episode yet: the lowest); as many as
    `ceil(quantile * members)` (at most half) are at either end.
    """
    order = sorted(
        range(len(scores)), key=lambda i: (-math.inf if scores[i] is None else scores[i], -i)
    )
    n = min(math.ceil(quantile * len(scores)), len(scores) // 2)
    top = order[len(order) - n :]
    return {copier: int(top[int(rng.integers(len(top)))]) for copier in order[:n]}


def copy_member(source_dir: str, dest_dir: str) -> str:
    """Make `source_dir`'s newest checkpoint and progress.csv `dest_dir`'s; the copied path.

    The destination's own checkpoints go, so that its resume continues from the copy.
    """
    checkpoint = latest_checkpoint(source_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{source_dir} has no checkpoint to copy")
    root = os.path.join(dest_dir, "checkpoints")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    dest = os.path.join(root, os.path.basename(checkpoint))
    shutil.copytree(checkpoint, dest)
    shutil.copyfile(
        os.path.join(source_dir, "progress.csv"), os.path.join(dest_dir, "progress.csv")
    )
    return dest


# -- a member, in an actor ------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberJob:
    """What an actor needs to train one member to the end of an interval.

    Attributes:
        config: the member's config (its hyperparameters, seed and run directory).
        spec: its algorithm's spec.
        stop_at: the env step to stop at (the budget at the last interval).
        resume: continue from the newest checkpoint of the run directory.
        retune: the config's hyperparameters are not the checkpoint's (the member copied):
            after taking the checkpoint, the optimizers take the config's settings.
    """

    config: Config
    spec: AlgorithmSpec
    stop_at: int
    resume: bool
    retune: bool = False


@dataclass(frozen=True)
class MemberOutcome:
    """Where a member's interval ended.

    Attributes:
        env_steps: the run's env steps.
        mean_return: the mean return of its last 10 training episodes (None: none yet).
        reached_at: the env step at which it reached `train.target_return` (None: not yet).
        error: the first line of what failed (the traceback is in the run's log.log).
    """

    env_steps: int
    mean_return: float | None
    reached_at: int | None = None
    error: str | None = None


class _Stopping(Run):
    """A run that is done at `stop_at` env steps too (the end of a PBT interval)."""

    stop_at: int

    @property
    def done(self) -> bool:
        """The run's own `done`, or the interval's end."""
        return super().done or self.env_steps >= self.stop_at


def _stopping(run_cls: type[Run], stop_at: int) -> type[Run]:
    bases = (_Stopping,) if run_cls is Run else (_Stopping, run_cls)
    return type(f"Pbt{run_cls.__name__}", bases, {"stop_at": stop_at})


def _optimizers(trainer: Trainer) -> dict[str, torch.optim.Optimizer]:
    alg = trainer.agent.alg
    return {k: v for k, v in vars(alg).items() if isinstance(v, torch.optim.Optimizer)}


def _retuning(make: Callable[..., Trainer]) -> Callable[..., Trainer]:
    """`make` (an `AlgorithmSpec.trainer`) whose Trainer keeps its optimizers' settings.

    A checkpoint's optimizer state holds the settings of the config it was written with (its
    `param_groups`: the learning rate, ...); after a copy, the copier's Trainer was built
    from the explored config, whose settings must win over the copied ones.
    """

    def trainer(config: Config, spec: AlgorithmSpec, run: Run, prepared: Any) -> Trainer:
        made = make(config, spec, run, prepared)
        settings = {
            name: [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            for name, opt in _optimizers(made).items()
        }
        load = made.load_state_dict

        def load_state_dict(state: dict[str, Any], env_steps: int) -> None:
            load(state, env_steps)
            for name, opt in _optimizers(made).items():
                for group, own in zip(opt.param_groups, settings[name], strict=True):
                    group.update(own)

        made.load_state_dict = load_state_dict  # type: ignore[method-assign]
        return made

    return trainer


class MemberRunner:
    """Trains members of a population in an actor of the cluster, an interval at a time."""

    def __init__(self) -> None:
        torch.set_num_threads(1)  # one slot, one core

    def train(self, job: MemberJob) -> MemberOutcome:
        """Train `job`'s member to `job.stop_at` env steps (its run's checkpoint written)."""
        spec = dataclasses.replace(
            job.spec,
            run_cls=_stopping(job.spec.run_cls, job.stop_at),
            trainer=_retuning(job.spec.trainer) if job.retune else job.spec.trainer,
        )
        logdir = job.config.train.logdir
        assert logdir is not None  # pbt gives every member its run directory
        try:
            result = run(job.config, spec, logdir, resume=job.resume)
        except Exception as exc:
            os.makedirs(logdir, exist_ok=True)
            with open(os.path.join(logdir, "log.log"), "a", encoding="utf-8") as f:
                f.write("".join(traceback.format_exception(exc)))
            line = (str(exc).strip().splitlines() or [""])[0]
            return MemberOutcome(0, None, None, f"{type(exc).__name__}: {line}")
        return MemberOutcome(
            result.env_steps, result.summary["final_mean_return"], result.summary["reached_at"]
        )


RemoteMemberRunner = parl.remote_class(wait=False)(MemberRunner)
"""`MemberRunner` as an actor whose calls return futures."""


# -- the population -------------------------------------------------------------------------------


def _last_scores(rows: list[list[Any]], population: int) -> list[float | None]:
    """Each member's return in the last interval of lineage `rows`."""
    last = max(int(row[0]) for row in rows)
    scores: list[float | None] = [None] * population
    for row in rows:
        if int(row[0]) == last and row[3] != "":
            scores[int(row[1])] = float(row[3])
    return scores


def default_pbt_dir(config: Config, space_path: str, root: str = "train_log") -> str:
    """`train_log/<algorithm>-<env>/pbt-<space file's name>`."""
    return default_sweep_dir(config, space_path, root, kind="pbt")


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def check_population(config: Config, population: int, interval: int, pbt_dir: str) -> None:
    """Raise ConfigError unless `population` members of `config` can train in `pbt_dir`.

    At least 2 members; an interval of at least 1 env step and less than the budget (so that
    the members exploit at least once); single mode; a directory without a population, or
    with one that the same command continues (`pbt` checks that it is the same).
    """
    budget = config.train.total_steps
    if population < 2:
        raise ConfigError(f"--population={population}: PBT needs at least 2 members")
    if not 0 < interval < budget:
        raise ConfigError(
            f"--pbt-interval={interval} must be at least 1 and less than the budget "
            f"(train.total_steps={budget}), so that the members exploit at least once"
        )
    check_single(config, "PBT")
    if os.path.exists(os.path.join(pbt_dir, "lineage.csv")) and not os.path.exists(
        os.path.join(pbt_dir, _STATE)
    ):
        raise ConfigError(
            f"{pbt_dir} holds a population that cannot be continued (no {_STATE}); give "
            "another --logdir"
        )


@dataclass
class _Population:
    """What a population is at the end of an interval: all that continuing it needs.

    Written to `population.json` (atomically: a new file renamed over the old) after each
    interval's copies and before the next interval starts; `lineage.csv` is written from its
    rows. The command that started the population is kept too (`command`): another command
    on the directory is refused.
    """

    command: dict[str, Any]
    interval: int
    params: list[Hyperparameters]
    retune: list[bool]
    rng: dict[str, Any]
    rows: list[list[Any]]
    copies: int = 0
    reached: list[Any] | None = None
    seconds: float = 0.0

    def write(self, pbt_dir: str, header: list[str]) -> None:
        """`population.json`, then `lineage.csv` from its rows."""
        path = os.path.join(pbt_dir, _STATE)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f)
        os.replace(path + ".tmp", path)
        lineage = os.path.join(pbt_dir, "lineage.csv")
        with open(lineage + ".tmp", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(self.rows)
        os.replace(lineage + ".tmp", lineage)

    @classmethod
    def read(cls, pbt_dir: str, command: dict[str, Any]) -> _Population | None:
        """The population `pbt_dir` holds (None: none), refused if another command made it."""
        path = os.path.join(pbt_dir, _STATE)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            made = cls(**json.load(f))
        for key, value in command.items():
            if made.command.get(key) != value:
                raise ConfigError(
                    f"{pbt_dir} holds a population of another {key}; continue it with its own "
                    "command, or give this one another --logdir"
                )
        return made


def pbt(
    config: Config,
    spec: AlgorithmSpec,
    space: PbtSpace,
    *,
    population: int,
    interval: int,
    pbt_dir: str,
    out: Callable[[str], None] = print,
) -> PbtResult:
    """Train a population of `population` members of `config`, exploring `space`.

    Args:
        config: the base config (each member sets the space's keys, its seed and run
            directory).
        spec: its algorithm's spec.
        space: the checked space (`read_pbt_space`).
        population: members, trained side by side, each an actor.
        interval: env steps between two exploits (less than `train.total_steps`).
        pbt_dir: the directory of the members' run directories and the outputs.
        out: where the terminal's lines go.

    Raises:
        ConfigError: a bad population or interval, or `pbt_dir` holds another run.
        RuntimeError: a member failed (its run directory's log.log has the traceback).
    """
    check_population(config, population, interval, pbt_dir)
    budget = config.train.total_steps
    keys = [p.key for p in space.params]
    header = ["interval", "member", "env_step", "mean_return", "copied", *keys]
    dirs = [os.path.abspath(os.path.join(pbt_dir, f"member-{i}")) for i in range(population)]
    command = {
        "config": dump_config(config),
        "space": space.text,
        "population": population,
        "interval": interval,
    }
    rng = np.random.default_rng(config.train.seed)
    state = _Population.read(pbt_dir, command)
    if state is None:
        params = [{p.key: _draw(p, rng) for p in space.params} for _ in range(population)]
        rows = [[0, i, 0, "", "", *(repr(params[i][k]) for k in keys)] for i in range(population)]
        state = _Population(command, 0, params, [False] * population, {}, rows)
    else:
        rng.bit_generator.state = state.rng
        out(
            f"pbt: {pbt_dir} continues after interval {state.interval}, each member from its "
            "latest checkpoint"
        )
    params = state.params

    def member_config(i: int) -> Config:
        made = apply_params(config, params[i])
        made.train = dataclasses.replace(
            made.train,
            seed=config.train.seed + i,
            logdir=dirs[i],
            address=None,
            backend=TrainSection.backend,  # a member needs no cluster of its own
            progress=False,
        )
        check_config(made, spec)
        return made

    configs = [member_config(i) for i in range(population)]
    os.makedirs(pbt_dir, exist_ok=True)
    if state.interval == 0 and not state.rng:
        state.rng = rng.bit_generator.state
        state.write(pbt_dir, header)
        for i in range(population):
            out(f"pbt: member {i} starts: {', '.join(f'{k}={_fmt(params[i][k])}' for k in keys)}")
    connect_cluster(config, population)
    runners = [RemoteMemberRunner() for _ in range(population)]
    stops = [*range(interval, budget, interval), budget]
    retune = list(state.retune)
    scores: list[float | None] = [None] * population
    reached = None if state.reached is None else tuple(state.reached)
    start = time.perf_counter() - state.seconds
    intervals = state.interval
    try:
        for k, stop in enumerate(stops, start=1):
            if k <= state.interval:
                continue  # finished before the population was stopped
            futures = [
                runner.train(MemberJob(configs[i], spec, stop, k > 1, retune[i]))
                for i, runner in enumerate(runners)
            ]
            outcomes: list[MemberOutcome] = [future.get() for future in futures]
            del futures
            intervals = k
            for i, outcome in enumerate(outcomes):
                if outcome.error is not None:
                    raise RuntimeError(
                        f"member {i} failed: {outcome.error} (the traceback is in "
                        f"{os.path.join(dirs[i], 'log.log')})"
                    )
            scores = [o.mean_return for o in outcomes]
            seconds = time.perf_counter() - start
            first = [(o.reached_at, i) for i, o in enumerate(outcomes) if o.reached_at is not None]
            if reached is None and first:
                at, i = min(first)
                reached = (i, at, seconds)
            shown = ", ".join("-" if s is None else f"{s:.1f}" for s in scores)
            out(f"pbt: interval {k} of {len(stops)} (env step {stop}, {seconds:.0f} s): {shown}")
            last = stop == budget or (config.train.stop_at_target and reached is not None)
            plan = {} if last else exploit(scores, space.quantile, rng)
            retune = [False] * population
            for i in range(population):
                source = plan.get(i)
                if source is not None:
                    copy_member(dirs[source], dirs[i])
                    params[i] = explore(params[source], space, rng)
                    configs[i] = member_config(i)
                    retune[i] = True
                    state.copies += 1
                    out(
                        f"pbt: member {i} copies member {source}: "
                        + ", ".join(f"{key}={_fmt(params[i][key])}" for key in keys)
                    )
                state.rows.append(
                    [
                        k,
                        i,
                        outcomes[i].env_steps,
                        "" if scores[i] is None else repr(scores[i]),
                        "" if source is None else source,
                        *(repr(params[i][key]) for key in keys),
                    ]
                )
            state.interval, state.params, state.retune = k, params, retune
            state.rng, state.seconds = rng.bit_generator.state, seconds
            state.reached = None if reached is None else list(reached)
            state.write(pbt_dir, header)
            if last:
                break
    finally:
        del runners
    if intervals == state.interval and not any(s is not None for s in scores):
        scores = _last_scores(state.rows, population)  # a population that had finished
    copies = state.copies
    ranked = [-math.inf if s is None else s for s in scores]
    best = int(np.argmax(ranked))
    best_config = dataclasses.replace(configs[best])
    best_config.train = dataclasses.replace(
        configs[best].train, logdir=None, seed=config.train.seed, progress=config.train.progress
    )
    best_path = os.path.join(pbt_dir, "best.toml")
    with open(best_path, "w", encoding="utf-8") as f:
        f.write(
            f"# The best member ({best}, {dirs[best]}) of the population in {pbt_dir}: the "
            f"mean return of its last 10 episodes {_fmt(scores[best])}\n"
        )
        f.write(dump_config(best_config))
    for i in sorted(range(population), key=lambda i: -ranked[i]):
        shown = ", ".join(f"{key}={_fmt(params[i][key])}" for key in keys)
        score = "-" if scores[i] is None else f"{scores[i]:.1f}"
        out(f"  member {i}  mean return {score}  {shown}")
    out(
        f"pbt: best member {best} ({_fmt(scores[best])}), its run in {dirs[best]}; run its "
        f"config with parl-train {best_path}; lineage in {os.path.join(pbt_dir, 'lineage.csv')}"
    )
    return PbtResult(pbt_dir, best, scores[best], dirs[best], intervals, copies, reached)
