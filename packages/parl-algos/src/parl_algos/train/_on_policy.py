"""The trajectory-based algorithms of `parl-train` (A2C, PPO, IMPALA): sections and Trainer.

Their `[env]` is a vector of environments stepped together (`VectorEnvSection`); their
`[agent]` sections extend the hyperparameters the family shares (`ActorCriticArgs`, declared
once in `parl_algos.training` for the example scripts and the configs alike). The
`OnPolicyTrainer` alternates the run's sampler's batches and one `learn` each
(`train_on_policy`): a `SerialSampler` in `single` mode, a `ParallelSampler` of remote workers
in `sync` mode, an `AsyncSampler` in `async` mode (IMPALA corrects for the workers' lag with
V-trace, PPO with its ratio to the behaviour policy, `BehaviourPPOAgent`; A2C's update assumes
on-policy data, so it has no `async` mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

import parl
from parl_algos.a2c import A2C, A2CStats
from parl_algos.a3c import A3C
from parl_algos.agents import ActorCriticAgent, BehaviourPPOAgent, IMPALAAgent
from parl_algos.ga3c import GA3C
from parl_algos.impala import IMPALA, IMPALAStats
from parl_algos.nets import ActorCriticMLP, AtariActorCritic, GaussianActorCriticMLP
from parl_algos.ppo import PPO, PPOStats
from parl_algos.train._config import Config
from parl_algos.train._envs import check_atari_env, make_collector, make_env_fn, make_eval_env
from parl_algos.train._evaluator import RemoteEvaluator
from parl_algos.train._run import Run
from parl_algos.train._spec import (
    AlgorithmSpec,
    Learner,
    Trainer,
    continuous_actions,
    discrete_actions,
    run_args,
)
from parl_algos.training import ActorCriticArgs, train_on_policy

__all__ = [
    "A2CSection",
    "IMPALASection",
    "ON_POLICY_SPECS",
    "OnPolicyTrainer",
    "PPOSection",
    "VectorEnvSection",
    "build_actor_critic",
    "on_policy_trainer",
]


@dataclass
class VectorEnvSection:
    """`[env]` of the on-policy algorithms: a vector of environments stepped together."""

    id: str = "CartPole-v1"
    """The gymnasium environment."""
    num_envs: int = 8
    """Environments stepped together."""
    atari: bool = False
    """An Atari game of ale-py (`id = "ALE/<Game>-v5"`) with the Nature DQN's preprocessing
    (`parl_algos.rollout.make_atari_env`), `parl_algos.nets.AtariActorCritic` for the network
    (`hidden_size` its dense layer's width) and rewards clipped to their sign for learning (the
    returns reported stay the game's scores)."""
    fire_reset: bool = False
    """With `atari`: FIRE pressed for the agent when a life starts, after reset and after each
    lost life (`parl_algos.rollout.FireOnLifeStart`), for games such as Breakout that wait for
    it; the episode stays the whole game."""


@dataclass
class A2CSection(ActorCriticArgs):
    """`[agent]` of A2C."""


@dataclass
class PPOSection(ActorCriticArgs):
    """`[agent]` of PPO."""

    n_steps: int = 32
    lr: float = 1e-3
    gamma: float = 0.98
    gae_lambda: float = 0.8
    anneal: bool = True
    """Let the learning rate and the clip range fall linearly to zero over total_steps."""
    variant: str = "clip"
    """'clip' (clipped surrogate) or 'kl' (adaptive KL penalty)."""
    clip_coef: float = 0.2
    """Clip range of the surrogate objective."""
    kl_target: float = 0.01
    """Target KL of the 'kl' variant."""
    clip_value: float | None = None
    """Clip range of the value prediction (none: no value clipping)."""
    update_epochs: int = 20
    """Passes over each batch."""
    minibatch_size: int = 256
    """Samples per gradient step."""


@dataclass
class IMPALASection(ActorCriticArgs):
    """`[agent]` of IMPALA."""

    n_steps: int = 20
    lr: float = 2e-3
    ent_coef: float = 0.01
    max_grad_norm: float = 40.0
    rho_bar: float = 1.0
    """V-trace's truncation of the importance weights."""
    c_bar: float = 1.0
    """V-trace's truncation of the trace coefficients."""


def build_actor_critic(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a = config.agent
    hidden = (a.hidden_size, a.hidden_size)
    reward_fn = np.sign if config.env.atari else None
    if config.env.atari:
        model: parl.Model = AtariActorCritic(
            discrete_actions(config, act_space), a.hidden_size, obs_space.shape[0]
        )
    elif isinstance(act_space, gym.spaces.Box):  # a Gaussian policy; the environment clips
        model = GaussianActorCriticMLP(
            obs_space.shape[0], continuous_actions(config, act_space), hidden
        )
    else:
        model = ActorCriticMLP(obs_space.shape[0], discrete_actions(config, act_space), hidden)
    common = dict(lr=a.lr, ent_coef=a.ent_coef, vf_coef=a.vf_coef, max_grad_norm=a.max_grad_norm)
    if config.algorithm in _A2C_LOSS:  # A3C and GA3C differ from A2C in their Trainers
        alg = _A2C_LOSS[config.algorithm](model, **common)
        return Learner(
            ActorCriticAgent(alg, gamma=a.gamma, gae_lambda=a.gae_lambda, reward_fn=reward_fn)
        )
    alg = PPO(
        model,
        variant=a.variant,
        clip_coef=a.clip_coef,
        kl_target=a.kl_target,
        clip_value=a.clip_value,
        update_epochs=a.update_epochs,
        minibatch_size=a.minibatch_size,
        seed=config.train.seed,
        **common,
    )
    total_steps = config.train.total_steps

    def anneal(env_steps: int) -> None:  # linear in the progress still to go, like SB3's zoo
        if a.anneal:
            remaining = max(1.0 - env_steps / total_steps, 0.0)
            alg.optimizer.param_groups[0]["lr"] = a.lr * remaining
            alg.clip_coef = max(a.clip_coef * remaining, 1e-8)

    agent_cls = BehaviourPPOAgent if config.train.mode == "async" else ActorCriticAgent
    agent = agent_cls(alg, gamma=a.gamma, gae_lambda=a.gae_lambda, reward_fn=reward_fn)
    return Learner(agent, before_learn=anneal)


_A2C_LOSS = {"A2C": A2C, "A3C": A3C, "GA3C": GA3C}


def _build_impala(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a, n_actions = config.agent, discrete_actions(config, act_space)
    if config.env.atari:
        model: parl.Model = AtariActorCritic(n_actions, a.hidden_size, obs_space.shape[0])
    else:
        model = ActorCriticMLP(obs_space.shape[0], n_actions, (a.hidden_size, a.hidden_size))
    alg = IMPALA(
        model,
        lr=a.lr,
        gamma=a.gamma,
        vf_coef=a.vf_coef,
        ent_coef=a.ent_coef,
        rho_bar=a.rho_bar,
        c_bar=a.c_bar,
        max_grad_norm=a.max_grad_norm,
    )
    return Learner(IMPALAAgent(alg, reward_fn=np.sign if config.env.atari else None))


def _check_on_policy(config: Config) -> None:
    check_atari_env(config.env)


class OnPolicyTrainer(Trainer):
    """`train_on_policy` on the run's sampler (see the module's docstring).

    Args:
        config: the run's config.
        spec: its algorithm's spec.
        run: the run (its directory: videos of evaluations go there).
    """

    def __init__(self, config: Config, spec: AlgorithmSpec, run: Run) -> None:
        self.config = config
        self.eval_env = make_eval_env(config, run.logdir)
        self.learner = spec.build(
            config, self.eval_env.observation_space, self.eval_env.action_space
        )
        self.agent = self.learner.agent
        self.collector = make_collector(config, spec, self.agent)
        run.restart_sources.append(self.collector)  # its workers replaced: progress.csv's count
        self.args = run_args(config, spec, run.logdir)
        self.title = f"{spec.name} on {config.env.id}"

    def evaluator(self) -> Any:
        """A `RemoteEvaluator` with a copy of the agent (None without evaluations)."""
        if self.config.train.eval_every <= 0:
            return None
        return RemoteEvaluator(make_env_fn(self.config), self.agent)

    def state_dict(self) -> dict[str, Any]:
        """`Trainer.state_dict`, the evaluation environment, and the sampler (`single` mode)."""
        state = {**super().state_dict(), "eval_env": self.eval_env}
        if self.config.train.mode == "single":
            state["collector"] = self.collector
        return state

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Take the checkpoint's environments; workers' environments start afresh."""
        self.eval_env = state.get("eval_env", self.eval_env)
        if "collector" in state:
            self.collector.close()
            self.collector = state["collector"]
            self.collector.sampler.agent = self.agent  # not the pickled copy
        else:  # the workers' environments start afresh
            self.collector.offset = env_steps
        super().load_state_dict(state, env_steps)

    def train(self, run: Run) -> None:
        """Alternate the sampler's batches and the agent's updates."""
        before_learn = self.learner.before_learn
        train_on_policy(run, self.collector, self.agent, self.args, before_learn=before_learn)

    def close(self) -> None:
        """Close the sampler (its environments, and its workers if it has any)."""
        self.collector.close()


def on_policy_trainer(config: Config, spec: AlgorithmSpec, run: Run, prepared: Any) -> Trainer:
    """`AlgorithmSpec.trainer` of the family."""
    return OnPolicyTrainer(config, spec, run)


ON = ("single", "sync")
ASYNC = ("single", "sync", "async")

ON_POLICY_SPECS = (
    AlgorithmSpec(
        name="A2C",
        family="on_policy",
        env=VectorEnvSection,
        agent=A2CSection,
        stats=A2CStats,
        build=build_actor_critic,
        trainer=on_policy_trainer,
        modes=ON,
    ),
    AlgorithmSpec(
        name="PPO",
        family="on_policy",
        env=VectorEnvSection,
        agent=PPOSection,
        stats=PPOStats,
        build=build_actor_critic,
        trainer=on_policy_trainer,
        modes=ASYNC,
        check=_check_on_policy,
    ),
    AlgorithmSpec(
        name="IMPALA",
        family="on_policy",
        env=VectorEnvSection,
        agent=IMPALASection,
        stats=IMPALAStats,
        build=_build_impala,
        trainer=on_policy_trainer,
        modes=ASYNC,
        check=_check_on_policy,
    ),
)
"""The specs of A2C, PPO and IMPALA."""
