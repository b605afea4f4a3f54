"""What `parl-train` knows of an algorithm, and the one protocol it trains with: `Trainer`.

An `AlgorithmSpec` ties an algorithm's name (`"PPO"`) to the dataclasses of its `[env]` and
`[agent]` sections (the keys a config may set, with their types and defaults), its family
(`on_policy`, `off_policy`, `recurrent`, `multi_agent`, `offline`), the stats dataclass its
`learn` returns (the columns of progress.csv), a `build` function that makes the agent (and its
memory) for given observation and action spaces, and the `Trainer` that trains it. A config
file is read against the spec its `algorithm` key names (`read_config`), which the registry
(`_registry`) looks up; everything below the registry gets the spec passed in.

A `Trainer` is the only way an algorithm trains. The run skeleton (`_skeleton.run`) decides
what happens when (the run directory, checkpoints, resume, the evaluator, Ctrl-C, the summary);
the Trainer does the training and owns its state as typed attributes.
"""

from __future__ import annotations

import dataclasses
import random
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.utils import ReplayMemory
from parl_algos.train._config import (
    BACKENDS,
    SECTIONS,
    Config,
    ConfigError,
    TrainSection,
    check_extra,
    read_table,
    section_from_table,
)
from parl_algos.train._run import Run
from parl_algos.train._track import check_tracking
from parl_algos.training import TARGETS_ON, OffPolicyArgs, OnPolicyArgs, RunArgs

__all__ = [
    "AlgorithmSpec",
    "Learner",
    "Trainer",
    "check_config",
    "continuous_actions",
    "discrete_actions",
    "read_config",
    "rng_states",
    "run_args",
    "set_rng_states",
    "stat_columns",
]


@dataclass
class Learner:
    """What `AlgorithmSpec.build` returns: the agent and what its training loop needs.

    Attributes:
        agent: the agent (`sample`, `predict`, `learn`).
        memory: the replay memory of an off-policy algorithm (None for on-policy ones).
        before_learn: on-policy: called with the env-step count before each update.
        after_step: off-policy: called with the step count after each env step.
        acting: off-policy, sync and async modes: the policy copy the workers act with
            (None: the agent itself, through `BatchActing`).
        n_step: off-policy: steps of each stored transition (an `NStepAdder` per column).
        reward_fn: off-policy: maps each reward to the one learned from (Atari's sign
            clipping); episode returns are still the environment's (None: as they come).
        eval_agent: what evaluations act with, `predict(obs)` and `set_weights(weights)`
            (None: the agent's greedy `predict`).
    """

    agent: parl.Agent
    memory: ReplayMemory | None = None
    before_learn: Callable[[int], None] | None = None
    after_step: Callable[[int], None] | None = None
    acting: Any = None
    n_step: int = 1
    reward_fn: Callable[[Any], Any] | None = None
    eval_agent: Any = None


class Trainer:
    """How an algorithm trains: what the run skeleton drives, the same for every algorithm.

    A subclass builds the agent and everything its training needs (environments, samplers,
    replay memory, actors) in its constructor, which the skeleton calls once the run has
    seeded every generator. Then the skeleton, in this order: gives it a checkpoint's state
    (`load_state_dict`) when the run resumes; asks for its `evaluator` in the `sync` and
    `async` modes; calls `train(run)` unless the budget is spent; takes its `state_dict` at
    every checkpoint; and `close`s it, after an error too.

    The Trainer owns the whole state of a checkpoint but the run's own schedule (`Run`): this
    class gives the agent's (weights, optimizers, counters) and the generators'; a subclass
    adds what its training keeps (replay memory, environments, samplers, counters).

    Attributes:
        agent: the learner's agent (saved with every checkpoint and at the end).
        eval_env: the environment of evaluations in this process (`single` mode, videos).
        title: what is trained on what, for the log and the plot.
    """

    agent: Any
    eval_env: gym.Env
    title: str

    def evaluator(self) -> Any:
        """The evaluation actor of the `sync` and `async` modes (None: evaluate here)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps to continue exactly: `agent`, `rng_states` and a subclass's.

        `agent` is the agent's `state_dict` (every model, the optimizers, the counters);
        `rng_states` the states of python's, numpy's and torch's generators and of those in
        the agent's and its algorithm's attributes. A subclass returns these and its own
        parts beside them. The values are the live objects (as torch's `state_dict`): pickle
        them to keep them past the next step.
        """
        return {"agent": self.agent.state_dict(), "rng_states": rng_states(self.agent)}

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Continue from a `state_dict`, taken at `env_steps`.

        A subclass takes its own parts, then calls this, last: the generators are set after
        anything that might draw from them.
        """
        self.agent.load_state_dict(state["agent"])
        set_rng_states(self.agent, state["rng_states"])

    def train(self, run: Run) -> None:
        """Train until the run's budget is spent or it is done (target, Ctrl-C)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the actors and close the environments (called once, also after an error)."""


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


def rng_states(agent: Any) -> dict[str, Any]:
    """The states of python's, numpy's and torch's global generators and of `agent`'s own."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "agent": _generators(agent),
        "algorithm": _generators(agent.alg),
    }


def set_rng_states(agent: Any, states: dict[str, Any]) -> None:
    """Set the generators to what `rng_states` returned."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    _set_generators(agent, states["agent"])
    _set_generators(agent.alg, states["algorithm"])


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm of the zoo as `parl-train` drives it.

    Attributes:
        name: the name a config's `algorithm` key gives (`"PPO"`).
        family: `"on_policy"`, `"off_policy"`, `"recurrent"`, `"multi_agent"` or `"offline"`.
        env: dataclass of the `[env]` section.
        agent: dataclass of the `[agent]` section.
        stats: the dataclass the algorithm's `learn` returns.
        build: `(config, observation_space, action_space) -> Learner`.
        trainer: `(config, spec, run, prepared) -> Trainer`, called once the run has seeded
            every generator (when resuming, with the run's state loaded: `run.env_steps` is
            the checkpoint's); `prepared` is what `prepare` returned.
        modes: the modes it runs in.
        check: raises `ConfigError` for what the types of the `[agent]` keys cannot say (a
            string outside its allowed values), before anything starts.
        prepare: `(config, logdir) -> prepared`, called before the run seeds its generators
            and opens its log (making a dataset, connecting to a cluster); None: nothing.
        run_cls: the `Run` of its runs (a subclass may say what `mean_return` is).
    """

    name: str
    family: str
    env: type
    agent: type
    stats: type
    build: Callable[[Config, gym.Space, gym.Space], Learner]
    trainer: Callable[[Config, AlgorithmSpec, Run, Any], Trainer]
    modes: tuple[str, ...] = ("single",)
    check: Callable[[Config], None] | None = None
    prepare: Callable[[Config, str], Any] | None = None
    run_cls: type[Run] = Run


def read_config(
    name: str, get_spec: Callable[[Any], AlgorithmSpec], *, check: bool = True
) -> Config:
    """Read the config `name` (a shipped `<algorithm>/<env>` or a TOML file's path).

    Args:
        name: the config.
        get_spec: the spec of an algorithm's name (the registry's lookup).
        check: also check the values against what is installed and what the algorithm allows
            (`check_config`); False checks the keys and their types only (`parl-train --list`).

    Raises:
        ConfigError: unknown algorithm, section or key, or a value of the wrong type.
    """
    table, shown = read_table(name)
    unknown = sorted(table.keys() - {"algorithm", *SECTIONS})
    if unknown:
        raise ConfigError(
            f"{shown}: unknown top-level key(s) {unknown}; allowed: algorithm, "
            + ", ".join(f"[{s}]" for s in SECTIONS)
        )
    if "algorithm" not in table:
        raise ConfigError(f'{shown}: the config must name its algorithm, e.g. algorithm = "PPO"')
    spec = get_spec(table["algorithm"])
    sections = {
        section: section_from_table(section, cls, table.get(section, {}), shown)
        for section, cls in zip(SECTIONS, (spec.env, spec.agent, TrainSection), strict=True)
    }
    config = Config(algorithm=spec.name, name=shown, **sections)
    if check:
        check_config(config, spec)
    return config


def check_config(config: Config, spec: AlgorithmSpec) -> None:
    """Check what the types alone cannot: the mode is one the algorithm supports, and so on."""
    train = config.train
    if train.mode not in spec.modes:
        raise ConfigError(
            f"train.mode={train.mode!r} is not supported by {spec.name}; "
            f"allowed: {', '.join(spec.modes)}"
        )
    if train.backend not in BACKENDS:
        raise ConfigError(f"train.backend={train.backend!r} is not one of {', '.join(BACKENDS)}")
    for key in ("total_steps", "actors", "log_every", "checkpoint_every", "eval_episodes"):
        if getattr(train, key) < 1:
            raise ConfigError(f"train.{key}={getattr(train, key)} must be at least 1")
    if train.eval_every < 0:
        raise ConfigError(f"train.eval_every={train.eval_every} must be 0 (never) or more")
    if train.weights_every < 0:
        raise ConfigError(f"train.weights_every={train.weights_every} must be 0 or more")
    if train.max_restarts < 0:
        raise ConfigError(f"train.max_restarts={train.max_restarts} must be 0 or more")
    if train.weights_every and spec.family != "off_policy":
        raise ConfigError(
            f"train.weights_every={train.weights_every}: only the replay-based algorithms "
            f"(DQN's family, DDPG, TD3, SAC) send weights less often; {spec.name}'s actors get "
            "them before every batch (0)"
        )
    if train.target_on not in TARGETS_ON:
        raise ConfigError(f"train.target_on={train.target_on!r}; allowed: {', '.join(TARGETS_ON)}")
    if train.target_on == "eval" and train.target_return is not None and not train.eval_every:
        raise ConfigError("train.target_on='eval' needs evaluations: train.eval_every must be > 0")
    check_extra(config, spec.family)
    check_tracking(config)
    if spec.check is not None:
        spec.check(config)


def stat_columns(stats: type) -> list[str]:
    """The scalar fields of a stats dataclass: the algorithm's columns of progress.csv."""
    hints = typing.get_type_hints(stats)
    return [f.name for f in dataclasses.fields(stats) if hints[f.name] in (float, int)]


def run_args(config: Config, spec: AlgorithmSpec, logdir: str) -> RunArgs:
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


def discrete_actions(config: Config, action_space: gym.Space) -> int:
    """The number of actions of a discrete `action_space` (ConfigError for another kind)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"{config.algorithm} needs discrete actions; "
            f"env.id={config.env.id!r} has {action_space}"
        )
    return int(action_space.n)


def continuous_actions(config: Config, action_space: gym.Space) -> int:
    """The size of a continuous (Box) `action_space`'s actions (ConfigError for another kind)."""
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(
            f"{config.algorithm} needs continuous (Box) actions; env.id={config.env.id!r} has "
            f"{action_space}"
        )
    return int(action_space.shape[0])
