"""R2D2 in `parl-train`: its `[env]` and `[agent]` sections, its builder and its Trainer.

R2D2 learns from sequences that its actors fold their steps into, each with the recurrent
state the actor had (`parl_algos.r2d2`). In every mode the learner stores the sequences of
`R2D2Actor`s with their initial priorities, makes `updates_per_collect` updates after each
actor call that returned sequences, and sends its weights to the actors every `sync_every`
updates:

- `single`: one actor in this process, stepping `envs_per_actor` environments;
- `sync`: `train.actors` remote actors collect at once, and the learner takes all their
  sequences when the last one is back;
- `async`: the same actors never wait: the learner takes each actor's call as it comes back
  and queues its next one at once (the paper's distributed actors).

The `[env]` section names an optional observation wrapper (`wrapper = "mask_velocity"`:
CartPole without its velocities, the partially observable task R2D2 is shown on here).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import parl
from parl_algos.r2d2 import (
    R2D2,
    ActorOutput,
    FeedForwardQNetwork,
    GreedyPolicy,
    R2D2Actor,
    R2D2Agent,
    R2D2Args,
    R2D2Stats,
    RecurrentQNetwork,
    RemoteR2D2Actor,
    StateReset,
    apex_epsilons,
)
from parl_algos.rollout import Episode, MaskVelocity
from parl_algos.samplers import RESTART_SEED_STRIDE, Replacements
from parl_algos.sequence_replay import SequenceReplayMemory
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._envs import connect, make_eval_env
from parl_algos.train._evaluator import Evaluator
from parl_algos.train._run import Run
from parl_algos.train._spec import AlgorithmSpec, Learner, Trainer, discrete_actions
from parl_algos.training import evaluate
from parl_remote import RemoteActorDiedError, RemoteError

logger = logging.getLogger(__name__)

__all__ = [
    "R2D2EnvSection",
    "R2D2Section",
    "R2D2Trainer",
    "R2D2_SPEC",
    "RecurrentEvaluator",
    "RemoteRecurrentEvaluator",
    "WRAPPERS",
    "build_r2d2",
    "check_r2d2",
    "make_wrapped_env",
]

WRAPPERS: dict[str, Callable[[gym.Env], gym.Env]] = {"mask_velocity": MaskVelocity}
"""The observation wrappers an `[env]` section may name, by name."""


@dataclass
class R2D2EnvSection:
    """`[env]` of R2D2: one environment, and an optional observation wrapper."""

    id: str = "CartPole-v1"
    """The gymnasium environment."""
    wrapper: str | None = None
    """An observation wrapper: none, or 'mask_velocity' (CartPole's velocities hidden)."""


@dataclass
class R2D2Section(R2D2Args):
    """`[agent]` of R2D2 (the settings of `examples/r2d2`)."""


def make_wrapped_env(env_id: str, wrapper: str | None = None) -> gym.Env:
    """`gym.make(env_id)`, with the observation wrapper called `wrapper` (see `WRAPPERS`)."""
    env = gym.make(env_id)
    return env if wrapper is None else WRAPPERS[wrapper](env)


def check_r2d2(config: Config) -> None:
    """Raise `ConfigError` for what the types of R2D2's keys cannot say."""
    a = config.agent
    if config.env.wrapper is not None and config.env.wrapper not in WRAPPERS:
        raise ConfigError(
            f"env.wrapper={config.env.wrapper!r}; allowed: none, {', '.join(WRAPPERS)}"
        )
    for key in ("envs_per_actor", "collect_steps", "learn_len", "n_step", "batch_size"):
        if getattr(a, key) < 1:
            raise ConfigError(f"agent.{key}={getattr(a, key)} must be at least 1")
    for key in ("updates_per_collect", "target_update_interval", "sync_every", "buffer_size"):
        if getattr(a, key) < 1:
            raise ConfigError(f"agent.{key}={getattr(a, key)} must be at least 1")
    if a.burn_in < 0:
        raise ConfigError(f"agent.burn_in={a.burn_in} must be 0 or more")


def build_r2d2(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    """The learner's `R2D2Agent` and its `SequenceReplayMemory`, as a `Learner`."""
    a, train = config.agent, config.train
    obs_dim, n_actions = obs_space.shape[0], discrete_actions(config, act_space)
    if a.memory:
        model: parl.Model = RecurrentQNetwork(obs_dim, n_actions, a.hidden_size, a.lstm_size)
    else:
        model = FeedForwardQNetwork(obs_dim, n_actions, a.hidden_size)
    try:
        alg = R2D2(model, lr=a.lr, gamma=a.gamma, n_step=a.n_step, burn_in=a.burn_in, eta=a.eta)
        memory = SequenceReplayMemory(
            a.buffer_size,
            a.burn_in + a.learn_len,
            obs_space.shape,
            model.state_size,
            alpha=a.alpha,
            beta=a.beta,
            beta_steps=max(train.total_steps // 4, 1),
            seed=train.seed,
        )
    except ValueError as exc:
        raise ConfigError(f"[agent] of R2D2: {exc}") from None
    return Learner(R2D2Agent(alg, n_actions, seed=train.seed), memory=memory)


class RecurrentEvaluator(Evaluator):
    """The evaluation actor of a recurrent agent: its greedy policy, the state reset each episode.

    Args:
        env_fn: a picklable zero-argument callable returning the evaluation environment.
        agent: an `R2D2Agent` (a copy of the learner's).
    """

    def __init__(self, env_fn: Callable[[], gym.Env], agent: R2D2Agent) -> None:
        super().__init__(env_fn, agent)
        self.policy = GreedyPolicy(agent)
        self.env = StateReset(self.env, self.policy)

    def evaluate(self, weights: Any, episodes: int, seed: int | None) -> float:
        """The mean return of `episodes` greedy episodes with `weights`."""
        self.agent.set_weights(weights)
        return evaluate(self.env, self.policy, episodes, seed=seed)


RemoteRecurrentEvaluator = parl.remote_class(wait=False)(RecurrentEvaluator)
"""`RecurrentEvaluator` as an actor whose methods return `RemoteFuture`s."""


@dataclass
class _Counters:
    env_steps: int = 0
    updates: int = 0
    stats: R2D2Stats | None = None


class R2D2Trainer(Trainer):
    """R2D2's loop in every mode (see the module's docstring).

    Args:
        config: the run's config.
        run: the run (videos of evaluations go in its directory).
    """

    def __init__(self, config: Config, run: Run) -> None:
        self.config = config
        self.env_fn = functools.partial(make_wrapped_env, config.env.id, config.env.wrapper)
        if config.train.capture_video:
            env = make_eval_env(config, run.logdir)
            env = env if config.env.wrapper is None else WRAPPERS[config.env.wrapper](env)
        else:
            env = self.env_fn()
        learner = build_r2d2(config, env.observation_space, env.action_space)
        self.agent: R2D2Agent = learner.agent
        self.memory: SequenceReplayMemory = learner.memory
        self._policy = GreedyPolicy(self.agent)
        self.eval_env = StateReset(env, self._policy)
        wrapper = f" ({config.env.wrapper})" if config.env.wrapper else ""
        self.title = f"R2D2 on {config.env.id}{wrapper}"
        self.counters = _Counters()
        self.actors: list[Any] = []
        self.pending: list[Any] = []
        self._replacements = Replacements(
            "R2D2: actor {i}", config.train.max_restarts, setting="train.max_restarts"
        )
        self.local_actor: R2D2Actor | None = None
        if config.train.mode != "single":
            connect(config)

    def evaluator(self) -> Any:
        """A `RemoteRecurrentEvaluator` with a copy of the agent."""
        return RemoteRecurrentEvaluator(self.env_fn, self.agent)

    def state_dict(self) -> dict[str, Any]:
        """`Trainer.state_dict`, the memory, the counters and (`single`) the local actor."""
        state = {**super().state_dict(), "memory": self.memory, "counters": self.counters}
        if self.local_actor is not None:
            state["actor"] = self.local_actor
        return state

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Take the checkpoint's memory, counters and local actor (with the learner's agent)."""
        self.memory = state["memory"]
        self.counters = state["counters"]
        self.counters.env_steps = env_steps
        if "actor" in state and self.config.train.mode == "single":
            self.local_actor = state["actor"]
            self.local_actor.agent = self.agent
        super().load_state_dict(state, env_steps)

    def _start_actors(self) -> None:
        a, train = self.config.agent, self.config.train
        if train.mode == "single":
            if self.local_actor is None:
                epsilons = apex_epsilons(a.envs_per_actor, a.eps_base, a.eps_alpha)
                self.local_actor = self._actor(R2D2Actor, self.agent, epsilons.tolist(), 0)
            return
        epsilons = apex_epsilons(train.actors * a.envs_per_actor, a.eps_base, a.eps_alpha)
        n = a.envs_per_actor
        self._epsilons = [epsilons[i * n : (i + 1) * n].tolist() for i in range(train.actors)]
        self.actors = [
            self._actor(RemoteR2D2Actor, self.agent, self._epsilons[i], i)
            for i in range(train.actors)
        ]

    def _actor(
        self, cls: Any, agent: R2D2Agent, epsilons: list[float], i: int, replaced: int = 0
    ) -> Any:
        a = self.config.agent
        # Resumed runs start their remote actors' environments afresh, with other seeds; so
        # do replaced ones.
        seed = self.config.train.seed * 1000 + i * a.envs_per_actor + self.counters.env_steps
        seed += RESTART_SEED_STRIDE * replaced
        return cls(
            self.env_fn, agent, epsilons, burn_in=a.burn_in, learn_len=a.learn_len, seed=seed
        )

    def _get(self, i: int, future: Any) -> ActorOutput | None:
        """Actor `i`'s output; None where it died and was replaced (its call's steps lost)."""
        try:
            return future.get()
        except RemoteError as exc:
            if not self.config.train.restart_actors or type(exc) not in (
                RemoteError,
                RemoteActorDiedError,
            ):
                raise  # no replacing, or the actor's own code failed
            error = exc
        del future  # a call holds its actor
        try:
            self._replace(i, error)
        finally:
            del error
        return None

    @property
    def restarts(self) -> int:
        """Remote actors replaced so far (`train.restart_actors`)."""
        return self._replacements.total

    def _replace(self, i: int, exc: BaseException) -> None:
        """Make actor `i` anew (the learner's current weights) for one that died with `exc`."""
        self.actors[i] = None  # its last handle: the actor and its slot are freed
        make = functools.partial(self._actor, RemoteR2D2Actor, self.agent, self._epsilons[i], i)
        self.actors[i] = self._replacements.replace(i, exc, make)

    def _outputs(self, turn: int) -> list[ActorOutput]:
        steps = self.config.agent.collect_steps
        if self.local_actor is not None:
            return [self.local_actor.collect(steps)]
        if self.config.train.mode == "sync":
            futures = [actor.collect(steps) for actor in self.actors]
            outputs = []
            for i in range(len(futures)):
                while (out := self._get(i, futures[i])) is None:  # a replacement's call again
                    futures[i] = self.actors[i].collect(steps)
                outputs.append(out)
            futures.clear()
            return outputs
        i = turn % len(self.actors)  # take actor i's finished call, and queue its next one
        out = self._get(i, self.pending[i])
        self.pending[i] = self.actors[i].collect(steps)
        return [] if out is None else [out]

    def train(self, run: Run) -> None:
        """Collect, store, learn and send weights until the budget is spent or the run is done."""
        a, total = self.config.agent, self.config.train.total_steps
        self._start_actors()
        run.restart_sources.append(self)
        if self.config.train.mode == "async":
            self.pending = [actor.collect(a.collect_steps) for actor in self.actors]
        c = self.counters
        run.start()
        turn = 0
        while c.env_steps < total and not run.done:
            episodes = []
            for out in self._outputs(turn):
                for record, priority in zip(out.records, out.priorities, strict=True):
                    self.memory.append(record, priority)
                episodes += [Episode(c.env_steps + out.env_steps, r, n) for r, n in out.episodes]
                c.env_steps += out.env_steps
                if len(self.memory) >= a.learning_starts and out.records:
                    self._learn()
            run.record(c.env_steps, episodes, c.stats)
            run.maybe_evaluate(self._policy)
            turn += 1

    def _learn(self) -> None:
        a, c = self.config.agent, self.counters
        for _ in range(a.updates_per_collect):
            c.stats = self.agent.learn(self.memory, a.batch_size)
            c.updates += 1
            if c.updates % a.target_update_interval == 0:
                self.agent.alg.sync_target()
            if c.updates % a.sync_every == 0 and self.actors:
                weights = self.agent.get_weights()
                for actor in self.actors:
                    with contextlib.suppress(RemoteActorDiedError):  # its collect says so
                        actor.set_weights(weights)  # after the call under way (calls keep order)

    def close(self) -> None:
        """Wait for the actors' calls under way; close the local actor's environments."""
        for future in self.pending:
            with contextlib.suppress(Exception):  # an actor that died: nothing to wait for
                future.get(timeout=120)
        self.pending, self.actors = [], []
        if self.local_actor is not None:
            self.local_actor.close()


def _r2d2_trainer(config: Config, spec: AlgorithmSpec, run: Run, prepared: Any) -> Trainer:
    """`AlgorithmSpec.trainer` of R2D2."""
    return R2D2Trainer(config, run)


R2D2_SPEC = AlgorithmSpec(
    name="R2D2",
    family="recurrent",
    env=R2D2EnvSection,
    agent=R2D2Section,
    stats=R2D2Stats,
    build=build_r2d2,
    trainer=_r2d2_trainer,
    modes=("single", "sync", "async"),
    check=check_r2d2,
)
"""The spec of R2D2."""
