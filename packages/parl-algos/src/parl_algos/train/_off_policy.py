"""The replay-based algorithms of `parl-train` (DQN's family, DDPG, TD3, SAC): sections, Trainer.

Their `[env]` is one environment stepped one step at a time (`EnvSection`; the DQN family's
may be an Atari game, `QEnvSection`); their `[agent]` sections extend the hyperparameters the
family shares (`ReplayArgs`, declared once in `parl_algos.training`). The `OffPolicyTrainer`
runs `train_off_policy` in `single` mode; in `sync` and `async` modes workers fill the replay
memory through a `ReplayWriter` (`train_off_policy_rounds`), for the DQN family Ape-X style in
`async` mode (see `_apex`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.utils import NStepAdder, PrioritizedReplayMemory, ReplayMemory, summary
from parl_algos._common import to_tensor
from parl_algos.agents import ContinuousAgent, DQNAgent
from parl_algos.ddpg import DDPG, DDPGStats
from parl_algos.dqn import DQN, DQNStats
from parl_algos.nets import ContinuousActorCriticMLP, NatureQNetwork, QNetwork
from parl_algos.sac import SAC, SACStats
from parl_algos.td3 import TD3, TD3Stats
from parl_algos.train._apex import QActing, ReplayWriter
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._envs import (
    SamplerCollector,
    check_atari_env,
    make_collector,
    make_env_fn,
    make_eval_env,
)
from parl_algos.train._evaluator import EpsilonGreedy, RemoteEvaluator
from parl_algos.train._run import Run
from parl_algos.train._spec import (
    AlgorithmSpec,
    Learner,
    Trainer,
    continuous_actions,
    discrete_actions,
    run_args,
)
from parl_algos.training import (
    OffPolicyArgs,
    OffPolicyState,
    ReplayArgs,
    TrainingRun,
    train_off_policy,
)

__all__ = [
    "BatchActing",
    "C51Section",
    "DDPGSection",
    "DDQNSection",
    "DQNSection",
    "DuelingDQNSection",
    "EnvSection",
    "OFF_POLICY_SPECS",
    "OffPolicyTrainer",
    "QEnvSection",
    "QRDQNSection",
    "RainbowSection",
    "SACSection",
    "TD3Section",
    "check_dqn",
    "off_policy_trainer",
    "train_off_policy_rounds",
]


@dataclass
class EnvSection:
    """`[env]` of the off-policy algorithms: one environment, one step at a time."""

    id: str = "CartPole-v1"
    """The gymnasium environment."""


@dataclass
class QEnvSection(EnvSection):
    """`[env]` of the DQN family: one environment, vector observations or Atari frames."""

    atari: bool = False
    """An Atari game of ale-py (`id = "ALE/<Game>-v5"`) as the Nature DQN plays it: 4 stacked
    84x84 grayscale frames (`parl_algos.rollout.make_atari_env`), the Nature CNN's torso
    under the head, uint8 frames in the replay memory, rewards clipped to their sign for
    learning (the returns reported stay the game's scores)."""
    fire_reset: bool = False
    """With `atari`: FIRE pressed for the agent when a life starts, after reset and after each
    lost life (`parl_algos.rollout.FireOnLifeStart`), for games such as Breakout that wait for
    it; the episode stays the whole game."""


@dataclass
class DQNSection(ReplayArgs):
    """`[agent]` of DQN (and, with other defaults, of each named member of its family)."""

    lr: float = 2.3e-3
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1000
    train_freq: int = 256
    gradient_steps: int = 128
    target_update_interval: int = 10
    """Env steps between two copies of the model into the target network."""
    exploration_fraction: float = 0.16
    """Fraction of total_steps over which epsilon decays (warm-up steps included)."""
    eps_end: float = 0.04
    """Final exploration rate."""
    double: bool = True
    """Use the double-DQN target."""
    dueling: bool = False
    """Use a dueling Q-network."""
    prioritized: bool = False
    """Sample the replay memory by priority (TD error)."""
    priority_alpha: float = 0.6
    """Prioritized replay: transitions are drawn in proportion to priority ** this (0: uniform,
    1: proportional; the Rainbow paper's is 0.5)."""
    priority_beta: float = 0.4
    """Prioritized replay: the importance-sampling exponent at the start, annealed to 1 over
    the run's gradient steps."""
    priority_weight_norm: str = "batch"
    """Prioritized replay: the importance-sampling weights are divided by the largest weight
    in the batch ('batch', as Dopamine's and Tianshou's: the loss's scale stays put) or in the
    whole memory ('memory': the scale follows the smallest priority stored)."""
    priority_stratified: bool = True
    """Prioritized replay: draw each batch stratified over the priority mass (one transition
    from each of batch_size equal segments, the PER paper's and Dopamine's) or, false,
    batch_size independent draws over the whole mass (Tianshou's)."""
    c51_priority: str = "kl"
    """Prioritized replay with c51: a transition's priority is its KL loss ('kl', the Rainbow
    paper's) or its cross-entropy ('cross_entropy', the loss plus the target's entropy, as
    Dopamine's and Tianshou's Rainbow prioritize: flatter priorities)."""
    n_step: int = 1
    """Steps of each stored transition's return (n-step learning)."""
    noisy: bool = False
    """Noisy layers in the Q-network's head explore instead of epsilon."""
    noisy_epsilon: bool = False
    """With noisy layers, act epsilon-greedily too, on the same schedule as without them
    (exploration_fraction, eps_end; in async mode the actors' Ape-X epsilons); by default (the
    Rainbow paper's) the noise alone explores: epsilon 0."""
    noisy_acting: bool = True
    """With noisy layers, act with their noise (the Rainbow paper's); false: on their means,
    as Tianshou's collector acts with its Rainbow (with noisy_epsilon, epsilon alone explores;
    the updates stay noisy)."""
    distributional: str | None = None
    """None, 'c51' (a categorical return distribution) or 'qr' (quantile regression)."""
    n_atoms: int | None = None
    """Atoms (c51) or quantiles (qr) per action (none: 51 for c51, 200 for qr)."""
    v_min: float = 0.0
    """C51's smallest atom (CartPole's discounted returns lie in [0, 100])."""
    v_max: float = 100.0
    """C51's largest atom."""
    apex_eps: float = 0.4
    """async mode (Ape-X): the base epsilon; actor i of N explores with
    apex_eps ** (1 + apex_alpha * i / (N - 1))."""
    apex_alpha: float = 7.0
    """async mode (Ape-X): the exponent of the actors' epsilons."""
    max_grad_norm: float | None = 10.0
    """Clip the gradient's global norm to this (none or inf: no clipping)."""
    adam_eps: float = 1e-8
    """Adam's epsilon (the QR-DQN paper's: 0.01 / batch_size)."""
    eval_epsilon: float = 0.0
    """Exploration rate of the evaluations (0: greedy; the Atari papers' is 0.05)."""


@dataclass
class DDQNSection(DQNSection):
    """`[agent]` of Double DQN."""


@dataclass
class DuelingDQNSection(DQNSection):
    """`[agent]` of Dueling DQN."""

    dueling: bool = True


@dataclass
class C51Section(DQNSection):
    """`[agent]` of C51."""

    double: bool = False
    distributional: str | None = "c51"


@dataclass
class QRDQNSection(DQNSection):
    """`[agent]` of QR-DQN."""

    double: bool = False
    distributional: str | None = "qr"


@dataclass
class RainbowSection(DQNSection):
    """`[agent]` of Rainbow."""

    dueling: bool = True
    prioritized: bool = True
    n_step: int = 3
    noisy: bool = True
    distributional: str | None = "c51"


@dataclass
class SACSection(ReplayArgs):
    """`[agent]` of SAC."""

    alpha: float | None = None
    """A fixed temperature (none: learn it, aiming at an entropy of -act_dim)."""
    tau: float = 0.005
    """Polyak rate of the target critics."""


@dataclass
class DDPGSection(ReplayArgs):
    """`[agent]` of DDPG."""

    gamma: float = 0.98
    buffer_size: int = 200_000
    learning_starts: int = 1000
    tau: float = 0.005
    """Polyak rate of the target networks."""
    exploration_noise: float = 0.1
    """Standard deviation of the Gaussian exploration noise (actions in [-1, 1])."""


@dataclass
class TD3Section(DDPGSection):
    """`[agent]` of TD3."""

    policy_noise: float = 0.2
    """Standard deviation of the target policy smoothing noise."""
    noise_clip: float = 0.5
    """Bound of the target policy smoothing noise."""
    policy_delay: int = 2
    """Critic updates per actor update."""


def _build_dqn(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a, train, atari = config.agent, config.train, config.env.atari
    n_actions = discrete_actions(config, act_space)
    check_dqn(config)
    n_atoms = None if a.distributional is None else a.n_atoms or _ATOMS[a.distributional]
    heads = dict(dueling=a.dueling, noisy=a.noisy, n_atoms=n_atoms or 1)
    if not atari and len(obs_space.shape) != 1:
        raise ConfigError(
            f"{config.algorithm}'s MLP needs vector observations; env.id={config.env.id!r} "
            f"has {obs_space} (an Atari game: env.atari = true)"
        )
    try:
        if atari:
            model: parl.Model = NatureQNetwork(
                n_actions, in_channels=obs_space.shape[0], hidden=a.hidden_size, **heads
            )
        else:
            hidden = (a.hidden_size, a.hidden_size)
            model = QNetwork(obs_space.shape[0], n_actions, hidden, **heads)
        alg = DQN(
            model,
            lr=a.lr,
            gamma=a.gamma,
            double=a.double,
            dueling=a.dueling,
            n_step=a.n_step,
            noisy=a.noisy,
            distributional=a.distributional,
            n_atoms=n_atoms,
            v_min=a.v_min,
            v_max=a.v_max,
            max_grad_norm=a.max_grad_norm,
            adam_eps=a.adam_eps,
            c51_priority=a.c51_priority,
        )
    except ValueError as exc:
        raise ConfigError(f"[agent] of {config.algorithm}: {exc}") from None
    decay = max(int(a.exploration_fraction * train.total_steps) - a.learning_starts, 1)
    noise_only = a.noisy and not a.noisy_epsilon  # noisy networks explore with their noise
    agent = DQNAgent(
        alg,
        n_actions,
        eps_start=0.0 if noise_only else 1.0,
        eps_end=0.0 if noise_only else a.eps_end,
        eps_decay_steps=decay,
        seed=train.seed,
        act_with_noise=a.noisy_acting,
    )
    # Observations are stored as they come: Atari's frames as uint8, vectors as float32.
    stored = dict(obs_dtype=obs_space.dtype, seed=train.seed)
    if a.prioritized:  # beta anneals to 1 over the run's gradient steps
        beta_steps = max(train.total_steps * a.gradient_steps // a.train_freq, 1)
        memory = PrioritizedReplayMemory(
            a.buffer_size,
            obs_space.shape,
            0,
            alpha=a.priority_alpha,
            beta=a.priority_beta,
            beta_steps=beta_steps,
            weight_norm=a.priority_weight_norm,
            stratified=a.priority_stratified,
            **stored,
        )
    else:
        memory = ReplayMemory(a.buffer_size, obs_space.shape, 0, **stored)
    acting = None
    if train.mode != "single":
        acting = QActing(
            agent,
            mode=train.mode,
            actors=train.actors,
            learning_starts=a.learning_starts,
            noisy=noise_only,
            apex_eps=a.apex_eps,
            apex_alpha=a.apex_alpha,
            act_with_noise=a.noisy_acting,
        )

    def after_step(step: int) -> None:
        if step % a.target_update_interval == 0:
            alg.sync_target()
        if step % 1000 == 0:
            epsilon = agent.epsilon if acting is None else acting.scheduled_epsilon()
            summary.add_scalar("rollout/epsilon", epsilon, step)

    eval_agent = None
    if a.eval_epsilon > 0:
        eval_agent = EpsilonGreedy(agent, n_actions, a.eval_epsilon, seed=train.seed + 1)
    return Learner(
        agent,
        memory=memory,
        after_step=after_step,
        acting=acting,
        n_step=a.n_step,
        reward_fn=np.sign if atari else None,
        eval_agent=eval_agent,
    )


_ATOMS = {"c51": 51, "qr": 200}


def check_dqn(config: Config) -> None:
    a = config.agent
    if a.distributional not in (None, *_ATOMS):
        raise ConfigError(f"agent.distributional={a.distributional!r}; allowed: none, c51, qr")
    for key in ("n_step", "train_freq", "batch_size", "target_update_interval"):
        if getattr(a, key) < 1:
            raise ConfigError(f"agent.{key}={getattr(a, key)} must be at least 1")
    if not 0.0 <= a.eval_epsilon <= 1.0:
        raise ConfigError(f"agent.eval_epsilon={a.eval_epsilon} must be in [0, 1]")
    if a.priority_alpha < 0:
        raise ConfigError(f"agent.priority_alpha={a.priority_alpha} must be non-negative")
    if not 0.0 <= a.priority_beta <= 1.0:
        raise ConfigError(f"agent.priority_beta={a.priority_beta} must be in [0, 1]")
    if a.priority_weight_norm not in ("memory", "batch"):
        raise ConfigError(
            f"agent.priority_weight_norm={a.priority_weight_norm!r}; allowed: 'memory', 'batch'"
        )
    if a.c51_priority not in ("kl", "cross_entropy"):
        raise ConfigError(f"agent.c51_priority={a.c51_priority!r}; allowed: 'kl', 'cross_entropy'")
    if a.noisy and not a.noisy_acting and not a.noisy_epsilon:
        raise ConfigError(
            "agent.noisy_acting = false acts on the noisy layers' means: nothing would explore "
            "past the warm-up; set agent.noisy_epsilon = true as well"
        )
    check_atari_env(config.env)


def _build_continuous(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a, seed = config.agent, config.train.seed
    obs_dim, act_dim = obs_space.shape[0], continuous_actions(config, act_space)
    hidden = (a.hidden_size, a.hidden_size)
    lrs = dict(actor_lr=a.lr, critic_lr=a.lr)
    if config.algorithm == "SAC":
        model = ContinuousActorCriticMLP(obs_dim, act_dim, hidden, stochastic=True, twin=True)
        alg = SAC(model, alpha_lr=a.lr, gamma=a.gamma, tau=a.tau, alpha=a.alpha, **lrs)
    elif config.algorithm == "TD3":
        alg = TD3(
            ContinuousActorCriticMLP(obs_dim, act_dim, hidden, twin=True),
            gamma=a.gamma,
            tau=a.tau,
            policy_noise=a.policy_noise,
            noise_clip=a.noise_clip,
            policy_delay=a.policy_delay,
            exploration_noise=a.exploration_noise,
            seed=seed,
            **lrs,
        )
    else:
        alg = DDPG(
            ContinuousActorCriticMLP(obs_dim, act_dim, hidden),
            gamma=a.gamma,
            tau=a.tau,
            exploration_noise=a.exploration_noise,
            seed=seed,
            **lrs,
        )
    memory = ReplayMemory(a.buffer_size, obs_dim, act_dim, seed=seed)
    return Learner(ContinuousAgent(alg), memory=memory)


class BatchActing:
    """An off-policy agent acting on a batch of observations, as the samplers' workers need.

    The first `random_steps` steps (counted over the batches this copy acted on) take uniformly
    random actions, as `train_off_policy`'s warm-up does; after that, the agent's `sample`
    acts on each observation. Weights go to and from the agent.

    Args:
        agent: a `DQNAgent` or `ContinuousAgent`.
        action_space: the environment's action space (its own seeded generator).
        random_steps: steps of random actions before the agent acts.
    """

    def __init__(self, agent: Any, action_space: gym.Space, random_steps: int) -> None:
        self.agent = agent
        self.action_space = action_space
        self.random_steps = random_steps
        self.steps = 0

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """One action per row of `obs`."""
        self.steps += len(obs)
        if self.steps <= self.random_steps:
            return np.stack([self.action_space.sample() for _ in obs])
        return np.stack([np.asarray(self.agent.sample(o)) for o in obs])

    def get_weights(self) -> dict:
        """The agent's weights."""
        return self.agent.get_weights()

    def set_weights(self, weights: dict) -> None:
        """Load weights into the agent."""
        self.agent.set_weights(weights)


def train_off_policy_rounds(
    run: TrainingRun,
    collector: SamplerCollector,
    agent: Any,
    writer: ReplayWriter,
    args: OffPolicyArgs,
    *,
    after_step: Callable[[int], None] | None = None,
    acting: QActing | None = None,
    eval_policy: Callable[[np.ndarray], Any] | None = None,
) -> None:
    """Off-policy learning from workers: they fill the replay memory, the learner learns.

    Each round the workers get the latest weights (with `acting`, the exploration it decides
    at the run's env-step count) and the learner takes the next batch: every worker's `horizon`
    steps (`sync`), or one worker's as soon as it has them (`async`, Ape-X style: the workers
    never wait). `writer` stores every transition; then, for each env step of the batch, the
    learner does what `train_off_policy` does after that step: `gradient_steps` updates at
    every multiple of `train_freq` past `learning_starts`, then `after_step`. Evaluations in
    this process run `eval_policy` (default: `agent.predict`).
    """
    run.start()
    stats = None
    while collector.env_steps < args.total_steps and not run.done:
        before = collector.env_steps
        if acting is not None:
            acting.env_steps = before
        trajectory = collector.collect(0)
        if acting is not None:
            acting.observe(trajectory)
        writer.store(trajectory)
        steps = collector.env_steps
        for step in range(before + 1, steps + 1):  # train_off_policy's schedule, step by step
            if step > args.learning_starts and step % args.train_freq == 0:
                for _ in range(args.gradient_steps):
                    stats = agent.learn(writer.memory, args.batch_size)
            if after_step is not None:
                after_step(step)
        run.record(steps, collector.pop_episodes(), stats)
        run.maybe_evaluate(agent.predict if eval_policy is None else eval_policy)


class OffPolicyTrainer(Trainer):
    """A replay-based algorithm's training (see the module's docstring).

    Args:
        config: the run's config.
        spec: its algorithm's spec.
        run: the run (its directory: videos of evaluations go there; its env step, when it
            resumes: the workers' share of the warm-up's random actions left).
    """

    def __init__(self, config: Config, spec: AlgorithmSpec, run: Run) -> None:
        train = self.train_section = config.train
        self.config = config
        self.eval_env = make_eval_env(config, run.logdir)
        env = make_env_fn(config)()
        self.learner = learner = spec.build(config, env.observation_space, env.action_space)
        self.agent = learner.agent
        self.memory: Any = learner.memory
        self.env: gym.Env | None = None
        self.loop: OffPolicyState | None = None
        self.writer: ReplayWriter | None = None
        self.collector: SamplerCollector | None = None
        if train.mode == "single":
            if learner.n_step > 1:
                self.memory = NStepAdder(self.memory, learner.n_step, config.agent.gamma)
            self.env, self.loop = env, OffPolicyState.start(env, train.seed)
        else:
            self.writer = ReplayWriter(
                self.memory,
                n_step=learner.n_step,
                gamma=config.agent.gamma,
                reward_fn=learner.reward_fn,
            )
            env.action_space.seed(train.seed)
            # The warm-up's random actions, each worker its share of what is left of them.
            warm_up = max(config.agent.learning_starts - run.env_steps, 0)
            random_steps = warm_up // train.actors
            acting = learner.acting or BatchActing(learner.agent, env.action_space, random_steps)
            env.close()
            self.collector = make_collector(config, spec, acting)
            run.restart_sources.append(self.collector)  # its workers replaced: progress.csv's
            if learner.acting is not None:  # priorities from the actors' Q
                self.writer.bootstrap_q = functools.partial(_outputs, self.agent)
                self.writer.priority = functools.partial(_priority, self.agent)
        self.args = run_args(config, spec, run.logdir)
        self.title = f"{spec.name} on {config.env.id}"

    def evaluator(self) -> Any:
        """A `RemoteEvaluator` with a copy of the evaluated agent (None without evaluations)."""
        if self.config.train.eval_every <= 0:
            return None
        return RemoteEvaluator(make_env_fn(self.config), self.learner.eval_agent or self.agent)

    def state_dict(self) -> dict[str, Any]:
        """`Trainer.state_dict`, the memory, the environments and the loop's (or writer's)."""
        state = {**super().state_dict(), "eval_env": self.eval_env, "memory": self.memory}
        if self.learner.eval_agent is not None:  # its generator, for an exact resume
            state["eval_rng"] = self.learner.eval_agent.rng
        if self.writer is not None:
            state["writer"] = self.writer
        else:
            state.update(env=self.env, loop=self.loop)
        return state

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Take the checkpoint's memory and environments; workers' environments start afresh."""
        self.eval_env = state.get("eval_env", self.eval_env)
        self.memory = self.learner.memory = state.get("memory", self.memory)
        if "eval_rng" in state:
            self.learner.eval_agent.rng = state["eval_rng"]
        if self.collector is not None:  # the workers' environments start afresh
            self.collector.offset = env_steps
            if "writer" in state:
                writer = state["writer"]
                writer.bootstrap_q, writer.priority = self.writer.bootstrap_q, self.writer.priority
                self.writer = writer
            self.writer.memory = self.memory
            self.writer.drop_pending()  # the episodes under way ended with their workers
        else:
            self.env = state.get("env", self.env)
            self.loop = state.get("loop", self.loop)
        super().load_state_dict(state, env_steps)

    def train(self, run: Run) -> None:
        """Fill the replay memory and learn from it, on schedule."""
        learner = self.learner
        eval_policy = None if learner.eval_agent is None else learner.eval_agent.predict
        if self.collector is not None:
            train_off_policy_rounds(
                run,
                self.collector,
                self.agent,
                self.writer,
                self.args,
                after_step=learner.after_step,
                acting=learner.acting,
                eval_policy=eval_policy,
            )
        else:
            train_off_policy(
                run,
                self.env,
                self.agent,
                self.memory,
                self.args,
                after_step=learner.after_step,
                reward_fn=learner.reward_fn,
                eval_policy=eval_policy,
                state=self.loop,
            )

    def close(self) -> None:
        """Close the sampler and its workers (`sync`, `async`)."""
        if self.collector is not None:
            self.collector.close()


def off_policy_trainer(config: Config, spec: AlgorithmSpec, run: Run, prepared: Any) -> Trainer:
    """`AlgorithmSpec.trainer` of the family."""
    return OffPolicyTrainer(config, spec, run)


@torch.no_grad()
def _outputs(agent: Any, obs: np.ndarray) -> np.ndarray:
    """The learner's network outputs for a batch of observations (a distribution's too)."""
    return agent.alg.model(to_tensor(obs, agent.device)).cpu().numpy()


def _priority(agent: Any, *arrays: np.ndarray) -> np.ndarray:
    """`DQN.priority` on numpy arrays (see `ReplayWriter`)."""
    tensors = [to_tensor(np.asarray(a, np.float32), agent.device) for a in arrays]
    return agent.alg.priority(*tensors).cpu().numpy()


ASYNC = ("single", "sync", "async")

OFF_POLICY_SPECS = (
    *(
        AlgorithmSpec(
            name=name,
            family="off_policy",
            env=QEnvSection,
            agent=section,
            stats=DQNStats,
            build=_build_dqn,
            trainer=off_policy_trainer,
            modes=ASYNC,
            check=check_dqn,
        )
        for name, section in (
            ("DQN", DQNSection),
            ("DDQN", DDQNSection),
            ("DuelingDQN", DuelingDQNSection),
            ("C51", C51Section),
            ("QRDQN", QRDQNSection),
            ("Rainbow", RainbowSection),
        )
    ),
    *(
        AlgorithmSpec(
            name=name,
            family="off_policy",
            env=EnvSection,
            agent=section,
            stats=stats,
            build=_build_continuous,
            trainer=off_policy_trainer,
            modes=ASYNC,
        )
        for name, section, stats in (
            ("DDPG", DDPGSection, DDPGStats),
            ("TD3", TD3Section, TD3Stats),
            ("SAC", SACSection, SACStats),
        )
    ),
)
"""The specs of the DQN family, DDPG, TD3 and SAC."""
