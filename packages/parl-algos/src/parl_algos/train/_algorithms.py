"""What `parl-train` knows of each algorithm: its config sections, its stats and how to build it.

An `AlgorithmSpec` ties an algorithm's name (`"PPO"`) to the dataclasses of its `[env]` and
`[agent]` sections (the keys a config may set, with their types and defaults), the family of
its training loop (`on_policy`: trajectories of a vector of environments; `off_policy`: a
replay memory filled one step at a time), the stats dataclass its `learn` returns (the columns
of progress.csv) and a `build` function that makes the agent (and its memory) for given
observation and action spaces. The defaults are those of the example scripts: the `[agent]`
sections extend the hyperparameters each family shares, declared once in `parl_algos.training`
(`ActorCriticArgs`, `ReplayArgs`) for the scripts and the configs alike.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.utils import PrioritizedReplayMemory, ReplayMemory, summary
from parl_algos._common import to_tensor
from parl_algos.a2c import A2C, A2CStats
from parl_algos.a3c import A3C
from parl_algos.agents import ActorCriticAgent, ContinuousAgent, DQNAgent, IMPALAAgent
from parl_algos.ddpg import DDPG, DDPGStats
from parl_algos.dqn import DQN, DQNStats
from parl_algos.ga3c import GA3C
from parl_algos.impala import IMPALA, IMPALAStats
from parl_algos.nets import (
    ActorCriticMLP,
    AtariActorCritic,
    ContinuousActorCriticMLP,
    GaussianActorCriticMLP,
    NatureQNetwork,
    QNetwork,
)
from parl_algos.ppo import PPO, PPOStats
from parl_algos.r2d2 import R2D2Stats
from parl_algos.rollout import Trajectory
from parl_algos.sac import SAC, SACStats
from parl_algos.td3 import TD3, TD3Stats
from parl_algos.train._a3c import A3CSection, A3CSession, GA3CSection, GA3CSession
from parl_algos.train._apex import QActing
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._evaluator import EpsilonGreedy
from parl_algos.train._marl import MULTI_AGENT_SPECS
from parl_algos.train._offline import OFFLINE_SPECS
from parl_algos.train._recurrent import (
    R2D2EnvSection,
    R2D2Section,
    R2D2Session,
    build_r2d2,
    check_r2d2,
)
from parl_algos.training import ActorCriticArgs, ReplayArgs

__all__ = [
    "A2CSection",
    "AlgorithmSpec",
    "BehaviourPPOAgent",
    "C51Section",
    "DDPGSection",
    "DDQNSection",
    "DQNSection",
    "DuelingDQNSection",
    "EnvSection",
    "IMPALASection",
    "Learner",
    "PPOSection",
    "QEnvSection",
    "QNetwork",
    "QRDQNSection",
    "RainbowSection",
    "SACSection",
    "SPECS",
    "TD3Section",
    "VectorEnvSection",
    "get_spec",
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


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm of the zoo as `parl-train` drives it.

    Attributes:
        name: the name a config's `algorithm` key gives (`"PPO"`).
        family: `"on_policy"` or `"off_policy"`: which training loop runs it (`"recurrent"`:
            R2D2's sequences, only in its session).
        env: dataclass of the `[env]` section.
        agent: dataclass of the `[agent]` section.
        stats: the dataclass the algorithm's `learn` returns.
        build: `(config, observation_space, action_space) -> Learner`.
        modes: the modes it runs in.
        check: raises `ConfigError` for what the types of the `[agent]` keys cannot say (a
            string outside its allowed values), before anything starts.
        session: `(config, logdir) -> Session`: a training loop of the algorithm's own
            (`train._sessions`), for the modes of `session_modes`.
        session_modes: the modes its session runs (the others run its family's loop).
        run: `(config, logdir, *, resume) -> RunResult` for an algorithm with a training loop
            of its own (offline, multi-agent: `run_own_loop`); None: `run_single`'s loops.
    """

    name: str
    family: str
    env: type
    agent: type
    stats: type
    build: Callable[[Config, gym.Space, gym.Space], Learner]
    modes: tuple[str, ...] = ("single",)
    check: Callable[[Config], None] | None = None
    session: Callable[[Config, str], Any] | None = None
    session_modes: tuple[str, ...] = ()
    run: Callable[..., Any] | None = None


# -- [env] sections ------------------------------------------------------------------------------


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


# -- [agent] sections ----------------------------------------------------------------------------


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


# -- builders ------------------------------------------------------------------------------------


def _discrete(config: Config, action_space: gym.Space) -> int:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"{config.algorithm} needs discrete actions; "
            f"env.id={config.env.id!r} has {action_space}"
        )
    return int(action_space.n)


def _continuous(config: Config, action_space: gym.Space) -> int:
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(
            f"{config.algorithm} needs continuous (Box) actions; env.id={config.env.id!r} has "
            f"{action_space}"
        )
    return int(action_space.shape[0])


def _build_actor_critic(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a = config.agent
    hidden = (a.hidden_size, a.hidden_size)
    reward_fn = np.sign if config.env.atari else None
    if config.env.atari:
        model: parl.Model = AtariActorCritic(
            _discrete(config, act_space), a.hidden_size, obs_space.shape[0]
        )
    elif isinstance(act_space, gym.spaces.Box):  # a Gaussian policy; the environment clips
        model = GaussianActorCriticMLP(obs_space.shape[0], _continuous(config, act_space), hidden)
    else:
        model = ActorCriticMLP(obs_space.shape[0], _discrete(config, act_space), hidden)
    common = dict(lr=a.lr, ent_coef=a.ent_coef, vf_coef=a.vf_coef, max_grad_norm=a.max_grad_norm)
    if config.algorithm in _A2C_LOSS:  # A3C and GA3C differ from A2C in their sessions
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


class BehaviourPPOAgent(ActorCriticAgent):
    """PPO from the trajectories of stale policy copies (`async` mode): its own correction.

    The workers' copies keep `log mu(a|s)` of their (behaviour) policy beside each action
    (`extras["log_prob"]`). The learner takes decoupled PPO's objective (Hilton et al. 2021,
    see `PPO.learn`'s `weight`): the ratio is clipped around its own policy as the update
    begins, `pi_old`, and each sample is weighted by `min(pi_old / mu, rho_bar)`, V-trace's
    truncated importance weight. Clipping around `mu` instead held a stale batch's updates
    back: where the learner's policy had already moved past the clip range since the copy
    collected, those samples gave no gradient from the first epoch on. The advantages use
    the learner's current value function. When `mu` is the learner's policy every weight is
    1 and the update is on-policy PPO's.

    Args:
        algorithm: a `PPO`.
        gamma: discount factor of the advantages.
        gae_lambda: the GAE lambda.
        rho_bar: the truncation of the importance weights.
    """

    def __init__(
        self,
        algorithm: PPO,
        *,
        gamma: float,
        gae_lambda: float,
        rho_bar: float = 1.0,
        reward_fn: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        super().__init__(algorithm, gamma=gamma, gae_lambda=gae_lambda, reward_fn=reward_fn)
        self.rho_bar = rho_bar

    @torch.no_grad()
    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions drawn from the policy for a batch of observations, and their log-probs."""
        dist = self.alg.distribution(to_tensor(obs, self.device))
        action = dist.sample()
        return action.cpu().numpy(), {"log_prob": dist.log_prob(action).cpu().numpy()}

    def learn(self, trajectory: Trajectory) -> PPOStats:
        """Update from one (possibly stale) trajectory, its samples weighted by `pi_old / mu`."""
        b = self.advantages(trajectory)
        behaviour = to_tensor(trajectory.extras["log_prob"].reshape(-1), self.device)
        with torch.no_grad():
            old_log_prob = self.alg.distribution(b.obs).log_prob(b.action)
            weight = (old_log_prob - behaviour).exp().clamp(max=self.rho_bar)
        return self.alg.learn(
            b.obs,
            b.action,
            b.advantage,
            b.value_target,
            value=b.value,
            old_log_prob=old_log_prob,
            weight=weight,
        )


def _build_impala(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a, n_actions = config.agent, _discrete(config, act_space)
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


def _build_dqn(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a, train, atari = config.agent, config.train, config.env.atari
    n_actions = _discrete(config, act_space)
    _check_dqn(config)
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


def _check_dqn(config: Config) -> None:
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
    if config.env.atari:
        _check_atari(config.env.id)


def _check_atari(env_id: str) -> None:
    """Raise ConfigError unless `env_id` is a game of ale-py (which must be installed)."""
    try:
        import ale_py
    except ImportError:
        raise ConfigError(
            "env.atari = true needs ale-py (the Atari games): pip install 'parl-algos[examples]'"
        ) from None
    gym.register_envs(ale_py)
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        entry_point = ""
    if not entry_point.startswith("ale_py"):
        raise ConfigError(
            f"env.atari = true needs an Atari game of ale-py, e.g. id = 'ALE/RoadRunner-v5'; "
            f"env.id={env_id!r} is not one"
        )


def _check_on_policy(config: Config) -> None:
    if config.env.atari:
        _check_atari(config.env.id)


def _build_continuous(config: Config, obs_space: gym.Space, act_space: gym.Space) -> Learner:
    a, seed = config.agent, config.train.seed
    obs_dim, act_dim = obs_space.shape[0], _continuous(config, act_space)
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


# The modes of each family: A2C's update assumes on-policy data, so it has no async mode;
# IMPALA corrects for the actors' lag with V-trace, PPO with its ratio to the behaviour policy
# (BehaviourPPOAgent); a replay memory takes any data.
ON = ("single", "sync")
ASYNC = ("single", "sync", "async")

SPECS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            "A2C", "on_policy", VectorEnvSection, A2CSection, A2CStats, _build_actor_critic, ON
        ),
        AlgorithmSpec(
            "A3C",
            "on_policy",
            VectorEnvSection,
            A3CSection,
            A2CStats,
            _build_actor_critic,
            ("single", "async"),
            session=A3CSession,
            session_modes=("async",),
        ),
        AlgorithmSpec(
            "GA3C",
            "on_policy",
            VectorEnvSection,
            GA3CSection,
            A2CStats,
            _build_actor_critic,
            ASYNC,
            session=GA3CSession,
            session_modes=("sync", "async"),
        ),
        AlgorithmSpec(
            "R2D2",
            "recurrent",
            R2D2EnvSection,
            R2D2Section,
            R2D2Stats,
            build_r2d2,
            ASYNC,
            check_r2d2,
            session=R2D2Session,
            session_modes=ASYNC,
        ),
        AlgorithmSpec(
            "PPO",
            "on_policy",
            VectorEnvSection,
            PPOSection,
            PPOStats,
            _build_actor_critic,
            ASYNC,
            _check_on_policy,
        ),
        AlgorithmSpec(
            "IMPALA",
            "on_policy",
            VectorEnvSection,
            IMPALASection,
            IMPALAStats,
            _build_impala,
            ASYNC,
            _check_on_policy,
        ),
        *(
            AlgorithmSpec(
                name, "off_policy", QEnvSection, section, DQNStats, _build_dqn, ASYNC, _check_dqn
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
        AlgorithmSpec(
            "DDPG", "off_policy", EnvSection, DDPGSection, DDPGStats, _build_continuous, ASYNC
        ),
        AlgorithmSpec(
            "TD3", "off_policy", EnvSection, TD3Section, TD3Stats, _build_continuous, ASYNC
        ),
        AlgorithmSpec(
            "SAC", "off_policy", EnvSection, SACSection, SACStats, _build_continuous, ASYNC
        ),
        *(AlgorithmSpec(**fields) for fields in (*OFFLINE_SPECS, *MULTI_AGENT_SPECS)),
    )
}
"""Every algorithm `parl-train` runs, by the name a config gives."""


def get_spec(name: Any) -> AlgorithmSpec:
    """The spec of algorithm `name` (case-insensitive).

    Raises:
        ConfigError: no algorithm has that name (the message lists those there are).
    """
    for spec in SPECS.values():
        if isinstance(name, str) and spec.name.lower() == name.lower():
            return spec
    raise ConfigError(f"unknown algorithm={name!r}; allowed: {', '.join(SPECS)}")


def stat_columns(stats: type) -> list[str]:
    """The scalar fields of a stats dataclass: the algorithm's columns of progress.csv."""
    hints = typing.get_type_hints(stats)
    return [f.name for f in dataclasses.fields(stats) if hints[f.name] in (float, int)]
