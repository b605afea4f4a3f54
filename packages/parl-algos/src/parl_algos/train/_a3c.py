"""A3C and GA3C in `parl-train`: their `[agent]` sections and the sessions of their actors.

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

from parl.utils import summary
from parl_algos.a3c import A3CLearner, RemoteA3CActor
from parl_algos.ga3c import GA3CLearner
from parl_algos.train._config import Config
from parl_algos.train._sessions import Session
from parl_algos.training import ActorCriticArgs

__all__ = ["A3CSection", "A3CSession", "GA3CSection", "GA3CSession"]

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


class _ActorCriticSession(Session):
    """What A3C's and GA3C's sessions share: the agent, evaluation, and the env-step offset."""

    def __init__(self, config: Config, logdir: str) -> None:
        from parl_algos.train._algorithms import get_spec
        from parl_algos.train._runner import make_eval_env

        self.config = config
        self.eval_env = make_eval_env(config, logdir)
        spec = get_spec(config.algorithm)
        self.agent = spec.build(
            config, self.eval_env.observation_space, self.eval_env.action_space
        ).agent
        self.env_fn = functools.partial(gym.make, config.env.id)
        train = config.train
        self.envs_per_actor = max(config.env.num_envs // train.actors, 1)
        self.title = f"{spec.name} on {config.env.id}, {train.actors} actors ({train.mode})"
        self.offset = 0
        """Env steps of the sessions of the run before this one (a resume starts actors anew)."""

    def evaluator(self) -> Any:
        """A `RemoteEvaluator` with a copy of the agent."""
        from parl_algos.train._evaluator import RemoteEvaluator
        from parl_algos.train._runner import make_env

        return RemoteEvaluator(functools.partial(make_env, self.config.env.id), self.agent)

    def restore(self, objects: dict[str, Any], env_steps: int) -> None:
        """Go on counting env steps from the checkpoint's."""
        self.offset = env_steps

    def _updates(self, run: Any, step: Callable[[], Any], lag: str) -> None:
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


class A3CSession(_ActorCriticSession):
    """A3C's `async` mode: remote actors send gradients, the learner applies them as they come.

    Args:
        config: the run's config.
        logdir: the run directory.
    """

    def __init__(self, config: Config, logdir: str) -> None:
        super().__init__(config, logdir)
        self.learner: A3CLearner | None = None

    def train(self, run: Any) -> None:
        """Start the actors and apply their gradients until the run ends."""
        config, n = self.config, self.envs_per_actor
        seed = config.train.seed + self.offset
        actors = [
            RemoteA3CActor(
                self.env_fn, self.agent, num_envs=n, n_steps=config.agent.n_steps, seed=seed + i * n
            )
            for i in range(config.train.actors)
        ]
        self.learner = A3CLearner(
            self.agent, actors, pull_every=config.agent.pull_every, timeout=_STEP_TIMEOUT
        )
        self._updates(run, self.learner.step, "staleness")

    def close(self) -> None:
        """Stop the actors' threads (each after its call under way)."""
        if self.learner is not None:
            self.learner.close()


class GA3CSession(_ActorCriticSession):
    """GA3C's `sync` and `async` modes: a `CentralSampler` chooses every action here.

    Args:
        config: the run's config.
        logdir: the run directory.
    """

    def __init__(self, config: Config, logdir: str) -> None:
        super().__init__(config, logdir)
        self.closers: list[Callable[[], None]] = []

    def train(self, run: Any) -> None:
        """Collect with the central predictor and learn, in rounds (sync) or from a queue."""
        from parl_algos.train._algorithms import get_spec
        from parl_algos.train._runner import SamplerCollector, _run_args
        from parl_algos.training import train_on_policy

        config = self.config
        kwargs = dict(
            num_workers=config.train.actors,
            envs_per_worker=self.envs_per_actor,
            horizon=config.agent.n_steps,
            seed=config.train.seed + self.offset,
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
            self._updates(run, learner.step, "lag")
            return
        from parl.samplers import CentralSampler

        sampler = CentralSampler(self.env_fn, self.agent, **kwargs)
        self.closers.append(sampler.close)
        collector = SamplerCollector(sampler, offset=self.offset)
        args = _run_args(config, get_spec(config.algorithm), config.train.logdir or "")
        train_on_policy(run, collector, self.agent, args)

    def close(self) -> None:
        """Stop the predictor (or the sampler) and its workers."""
        for close in self.closers:
            close()
        self.closers = []
