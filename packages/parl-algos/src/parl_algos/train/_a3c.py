"""A3C and GA3C in `parl-train`: their `[agent]` sections and the Trainers of their actors.

Both learn with `A2C`'s loss; what differs is where the rollouts (or gradients) come from.
`env.num_envs` environments in all are split over `train.actors` actors (at least one each),
every rollout `agent.n_steps` steps long.

- A3C, `async`: each remote actor (`parl_algos.a3c.RemoteA3CActor`) computes the gradient of
  its own rollout with its copy of the network and sends it; the learner (`A3CLearner`)
  applies each as it arrives and the actor pulls the current weights every `pull_every`
  rollouts. `single` is the same update without actors: one process steps every
  environment and applies the gradient of each rollout at once (A2C's synchronous update,
  which is what A3C's gradient becomes when nothing is stale). A3C has no `sync` mode: its
  actors never wait for each other.
- GA3C, `sync` and `async`: the workers only step environments; every action is chosen here,
  in one batched call a step, by a `parl.samplers.CentralSampler` (the paper's predictor).
  `sync` learns from each rollout before collecting the next; `async` collects in a predictor
  thread that queues its rollouts for the trainer (`GA3CLearner`: the paper's policy lag).
  `single` steps every environment in this process (`SerialSampler`), as A2C.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from parl.samplers import RESTART_SEED_STRIDE, CentralSampler
from parl.utils import summary
from parl_algos.a2c import A2CStats
from parl_algos.a3c import A3CLearner, RemoteA3CActor
from parl_algos.ga3c import GA3CLearner
from parl_algos.train._config import Config
from parl_algos.train._envs import SamplerCollector, connect, make_env, make_eval_env
from parl_algos.train._evaluator import RemoteEvaluator
from parl_algos.train._on_policy import OnPolicyTrainer, VectorEnvSection, build_actor_critic
from parl_algos.train._run import Run
from parl_algos.train._spec import AlgorithmSpec, Trainer, run_args
from parl_algos.training import ActorCriticArgs, train_on_policy

__all__ = ["A3CSection", "A3CTrainer", "ACTOR_SPECS", "GA3CSection", "GA3CTrainer"]

_STEP_TIMEOUT = 300.0
"""Seconds the learner waits for the next gradient or rollout before giving up."""


@dataclass
class A3CSection(ActorCriticArgs):
    """`[agent]` of A3C."""

    lr: float = 1e-3
    pull_every: int = 1
    """async mode: rollouts of an actor between two pulls of the learner's weights."""


@dataclass
class GA3CSection(ActorCriticArgs):
    """`[agent]` of GA3C."""

    lr: float = 1e-3
    queue_size: int = 2
    """async mode: rollouts waiting for the trainer at most (the predictor waits beyond)."""


class _ActorCriticTrainer(Trainer):
    """What A3C's and GA3C's Trainers share: the agent, evaluation, and the env-step offset."""

    def __init__(self, config: Config, spec: AlgorithmSpec, run: Run) -> None:
        self.config = config
        self.eval_env = make_eval_env(config, run.logdir)
        self.agent = spec.build(
            config, self.eval_env.observation_space, self.eval_env.action_space
        ).agent
        self.env_fn = functools.partial(gym.make, config.env.id)
        train = config.train
        self.envs_per_actor = max(config.env.num_envs // train.actors, 1)
        self.title = f"{spec.name} on {config.env.id}, {train.actors} actors ({train.mode})"
        self.args = run_args(config, spec, run.logdir)
        self.offset = 0
        """Env steps of the sessions of the run before this one (a resume starts actors anew)."""
        connect(config)

    def evaluator(self) -> Any:
        """A `RemoteEvaluator` with a copy of the agent."""
        return RemoteEvaluator(functools.partial(make_env, self.config.env.id), self.agent)

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Go on counting env steps from the checkpoint's (the actors start afresh)."""
        self.offset = env_steps
        super().load_state_dict(state, env_steps)

    def _updates(self, run: Run, step: Callable[[], Any], lag: str) -> None:
        """Record every update `step()` makes until the budget is spent or the run is done."""
        run.start()
        total, updates = self.config.train.total_steps, 0
        while not run.done:
            update = step()
            updates += 1
            env_steps = self.offset + update.env_steps
            episodes = [e._replace(env_step=e.env_step + self.offset) for e in update.episodes]
            run.record(env_steps, episodes, update.stats)
            if updates % 100 == 0:  # how stale the gradients (rollouts) are
                summary.add_scalar(f"train/{lag}", getattr(update, lag), env_steps)
            run.maybe_evaluate(self.agent.predict)
            if env_steps >= total:
                break


class A3CTrainer(_ActorCriticTrainer):
    """A3C's `async` mode: remote actors send gradients, the learner applies them as they come.

    Args:
        config: the run's config.
        spec: A3C's spec.
        run: the run.
    """

    def __init__(self, config: Config, spec: AlgorithmSpec, run: Run) -> None:
        super().__init__(config, spec, run)
        self.learner: A3CLearner | None = None

    def train(self, run: Run) -> None:
        """Start the actors and apply their gradients until the run ends."""
        config, n = self.config, self.envs_per_actor
        seed = config.train.seed + self.offset

        def actor(i: int, replaced: int = 0) -> Any:  # a replacement: a seed stream of its own
            stream = seed + i * n + RESTART_SEED_STRIDE * replaced
            return RemoteA3CActor(
                self.env_fn, self.agent, num_envs=n, n_steps=config.agent.n_steps, seed=stream
            )

        self.learner = A3CLearner(
            self.agent,
            [actor(i) for i in range(config.train.actors)],
            pull_every=config.agent.pull_every,
            timeout=_STEP_TIMEOUT,
            replace=actor if config.train.restart_actors else None,
            max_restarts=config.train.max_restarts,
        )
        run.restart_sources.append(self.learner)
        self._updates(run, self.learner.step, "staleness")

    def close(self) -> None:
        """Stop the actors' threads (each after its call under way)."""
        if self.learner is not None:
            self.learner.close()


class GA3CTrainer(_ActorCriticTrainer):
    """GA3C's `sync` and `async` modes: a `CentralSampler` chooses every action here.

    Args:
        config: the run's config.
        spec: GA3C's spec.
        run: the run.
    """

    def __init__(self, config: Config, spec: AlgorithmSpec, run: Run) -> None:
        super().__init__(config, spec, run)
        self.closers: list[Callable[[], None]] = []

    def train(self, run: Run) -> None:
        """Collect with the central predictor and learn, in rounds (sync) or from a queue."""
        config = self.config
        kwargs = dict(
            num_workers=config.train.actors,
            envs_per_worker=self.envs_per_actor,
            horizon=config.agent.n_steps,
            seed=config.train.seed + self.offset,
            restart=config.train.restart_actors,
            max_restarts=config.train.max_restarts,
        )
        if config.train.mode == "async":
            learner = GA3CLearner(
                self.agent,
                self.env_fn,
                queue_size=config.agent.queue_size,
                timeout=_STEP_TIMEOUT,
                **kwargs,
            )
            self.closers.append(learner.close)
            run.restart_sources.append(learner)
            self._updates(run, learner.step, "lag")
            return
        sampler = CentralSampler(self.env_fn, self.agent, **kwargs)
        self.closers.append(sampler.close)
        collector = SamplerCollector(sampler, offset=self.offset)
        run.restart_sources.append(collector)
        train_on_policy(run, collector, self.agent, self.args)

    def close(self) -> None:
        """Stop the predictor (or the sampler) and its workers."""
        for close in self.closers:
            close()
        self.closers = []


def _a3c_trainer(config: Config, spec: AlgorithmSpec, run: Run, prepared: Any) -> Trainer:
    """A3C's actors in `async` mode; in `single` mode the on-policy family's loop (A2C's)."""
    if config.train.mode == "async":
        return A3CTrainer(config, spec, run)
    return OnPolicyTrainer(config, spec, run)


def _ga3c_trainer(config: Config, spec: AlgorithmSpec, run: Run, prepared: Any) -> Trainer:
    """GA3C's predictor in `sync` and `async` modes; in `single` mode the on-policy loop."""
    if config.train.mode in ("sync", "async"):
        return GA3CTrainer(config, spec, run)
    return OnPolicyTrainer(config, spec, run)


ACTOR_SPECS = (
    AlgorithmSpec(
        name="A3C",
        family="on_policy",
        env=VectorEnvSection,
        agent=A3CSection,
        stats=A2CStats,
        build=build_actor_critic,
        trainer=_a3c_trainer,
        modes=("single", "async"),
    ),
    AlgorithmSpec(
        name="GA3C",
        family="on_policy",
        env=VectorEnvSection,
        agent=GA3CSection,
        stats=A2CStats,
        build=build_actor_critic,
        trainer=_ga3c_trainer,
        modes=("single", "sync", "async"),
    ),
)
"""The specs of A3C and GA3C."""
