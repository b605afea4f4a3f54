"""Offline configs of `parl-train` (BC, CQL, IQL): a dataset, gradient steps, evaluations.

An offline run learns from a fixed dataset and touches its environment only to evaluate.
`[env]` names the environment and the dataset: `dataset` is a `.npz` path (the six arrays of
`parl.utils.OfflineDataset.save`) or a minari id; without one, the run makes its own as the
`examples/offline_pendulum` example does (`make_sac_dataset`: SAC trains online, then a noisy
copy of its policy collects episodes) and caches it in the run directory as `dataset.npz`, so
that a resumed run learns from the same file. `total_steps` counts gradient steps; rows of
progress.csv are written every `log_every` of them, and their `mean_return` column holds the
latest evaluation's mean return (an offline learner plays no training episodes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import parl
from parl.utils import OfflineDataset, ReplayMemory, logger
from parl_algos._common import to_tensor
from parl_algos.agents import ContinuousAgent
from parl_algos.bc import BC, BCStats
from parl_algos.cql import CQL, CQLStats
from parl_algos.iql import IQL, IQLStats
from parl_algos.nets import ContinuousActorCriticMLP, ValueMLP
from parl_algos.rollout import make_rescaled_env
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._run import Run
from parl_algos.train._spec import AlgorithmSpec, Learner, Trainer
from parl_algos.training import OffPolicyArgs, TrainingRun, evaluate, train_off_policy

__all__ = [
    "BCSection",
    "CQLSection",
    "DATA_POLICIES",
    "IQLSection",
    "OFFLINE_SPECS",
    "OfflineEnvSection",
    "OfflineRun",
    "OfflineSection",
    "OfflineTrainer",
    "build_offline",
    "check_offline",
    "load_offline_dataset",
    "make_sac_dataset",
    "noisy_policy",
    "scale_rewards",
]

DATA_POLICIES = ("final", "medium")
"""What collects a self-made dataset: SAC's final policy, or its snapshot nearest the medium
score (both made noisy by `noisy_policy`)."""


@dataclass
class OfflineEnvSection:
    """`[env]` of the offline algorithms: the environment, and the dataset or how to make it."""

    id: str = "Pendulum-v1"
    """The gymnasium environment (evaluations; and the self-made dataset's collection)."""
    dataset: str | None = None
    """A dataset `.npz` path or a minari id (none: make one, cached as dataset.npz)."""
    sac_steps: int = 8_000
    """Self-made dataset: env steps of the online SAC run that makes the data."""
    data_policy: str = "final"
    """Self-made dataset: 'final' (SAC's last policy) or 'medium' (its snapshot whose noisy
    copy scores nearest `medium_score`) collects the data."""
    medium_score: float = 0.5
    """'medium': the normalised score aimed at (0: random policy, 1: SAC's final policy)."""
    snapshot_every: int = 500
    """'medium': keep SAC's weights every this many env steps."""
    data_random: float = 0.5
    """Self-made dataset: probability of a uniformly random action at each step."""
    data_noise: float = 0.3
    """Self-made dataset: std of the Gaussian noise added to the policy's other actions."""
    dataset_episodes: int = 200
    """Self-made dataset: episodes collected."""


@dataclass
class OfflineSection:
    """`[agent]` keys every offline learner has."""

    lr: float = 3e-4
    """Adam learning rate (of every network)."""
    batch_size: int = 128
    """Transitions per gradient step."""
    hidden_size: int = 128
    """Width of the two hidden layers of every network."""


@dataclass
class BCSection(OfflineSection):
    """`[agent]` of BC."""


@dataclass
class CQLSection(OfflineSection):
    """`[agent]` of CQL."""

    gamma: float = 0.99
    tau: float = 0.005
    """Polyak rate of the target critics."""
    cql_weight: float = 5.0
    """The penalty's weight (with target_action_gap: the multiplier's start)."""
    num_sampled_actions: int = 4
    """Actions of each of the three kinds per state in the penalty's soft maximum (10 in the
    paper; fewer run faster)."""
    temperature: float = 1.0
    """The soft maximum's temperature."""
    target_action_gap: float | None = None
    """None: a fixed weight; else CQL-Lagrange aiming the penalty at this gap."""
    reward_scale: float = 1.0
    """Every reward of the dataset is multiplied by this before learning."""


@dataclass
class IQLSection(OfflineSection):
    """`[agent]` of IQL."""

    gamma: float = 0.99
    tau: float = 0.005
    """Polyak rate of the target critics."""
    expectile: float = 0.7
    """The expectile of V's loss, in (0, 1)."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights."""
    max_weight: float = 100.0
    """Upper clip of the advantage weights."""
    reward_scale: float = 1.0
    """Every reward of the dataset is multiplied by this before learning."""


def check_offline(config: Config) -> None:
    """Raise `ConfigError` for `[env]` values outside their allowed ranges."""
    env = config.env
    if env.data_policy not in DATA_POLICIES:
        raise ConfigError(
            f"env.data_policy={env.data_policy!r}; allowed: {', '.join(DATA_POLICIES)}"
        )
    if env.dataset is not None and env.dataset.endswith(".npz") and not os.path.exists(env.dataset):
        raise ConfigError(f"env.dataset={env.dataset!r}: no such file")
    if not 0.0 <= env.data_random <= 1.0:
        raise ConfigError(f"env.data_random={env.data_random} must lie in [0, 1]")
    for key in ("sac_steps", "snapshot_every", "dataset_episodes"):
        if getattr(env, key) < 1:
            raise ConfigError(f"env.{key}={getattr(env, key)} must be at least 1")
    if config.agent.batch_size < 1:
        raise ConfigError(f"agent.batch_size={config.agent.batch_size} must be at least 1")
    if getattr(config.agent, "reward_scale", 1.0) <= 0:
        raise ConfigError(f"agent.reward_scale={config.agent.reward_scale} must be positive")


# -- the self-made dataset -----------------------------------------------------------------------


def noisy_policy(
    agent: ContinuousAgent, noise: float, random: float, seed: int
) -> Callable[[np.ndarray], np.ndarray]:
    """A degraded copy of `agent`'s policy, actions in `[-1, 1]`.

    With probability `random` a uniformly random action; else a draw of the agent's policy plus
    Gaussian noise of std `noise` (the "imperfect demonstrations" of Fujimoto et al.'s BCQ,
    https://arxiv.org/abs/1812.02900, with more random steps).
    """
    rng = np.random.default_rng(seed)

    def policy(obs: np.ndarray) -> np.ndarray:
        action = agent.sample(obs)
        if rng.random() < random:
            return rng.uniform(-1.0, 1.0, action.shape).astype(np.float32)
        return np.clip(action + rng.normal(0.0, noise, action.shape), -1.0, 1.0).astype(np.float32)

    return policy


def make_sac_dataset(
    env: OfflineEnvSection, path: str, *, seed: int, logdir: str, progress: bool = True
) -> dict:
    """Train SAC on `env.id`, collect a dataset with a noisy copy of it into `path`.

    SAC trains `env.sac_steps` env steps with the SAC example's settings (`OffPolicyArgs`'
    defaults), logging to `logdir`. Then `env.data_policy` picks the policy that collects
    `env.dataset_episodes` episodes through `noisy_policy`: SAC's final one, or the snapshot
    whose noisy copy scores nearest `env.medium_score` between a uniformly random policy and
    the final one. `progress` shows SAC's progress bar. Returns the returns of the final SAC
    policy (`sac_expert_return`), of the random policy and of the dataset's episodes
    (`data_return`), the snapshot's env step and the dataset's size.
    """
    train_env, eval_env = make_rescaled_env(env.id), make_rescaled_env(env.id)
    obs_dim, act_dim = train_env.observation_space.shape[0], train_env.action_space.shape[0]
    args = OffPolicyArgs(
        env_id=env.id, seed=seed, total_steps=env.sac_steps, eval_every=0, logdir=logdir
    )
    run = TrainingRun(
        f"SAC on {env.id}", args, total_steps=args.total_steps, eval_env=eval_env, progress=progress
    )
    hidden = (args.hidden_size, args.hidden_size)
    model = ContinuousActorCriticMLP(obs_dim, act_dim, hidden, stochastic=True, twin=True)
    lrs = dict(actor_lr=args.lr, critic_lr=args.lr, alpha_lr=args.lr)
    from parl_algos.sac import SAC

    agent = ContinuousAgent(SAC(model, gamma=args.gamma, **lrs))
    snapshots: list[tuple[int, dict[str, np.ndarray]]] = []

    def keep(step: int) -> None:
        if env.data_policy == "medium" and step % env.snapshot_every == 0:
            snapshots.append((step, agent.get_weights()))

    memory = ReplayMemory(args.buffer_size, obs_dim, act_dim, seed=seed)
    train_off_policy(run, train_env, agent, memory, args, after_step=keep)
    run.finish(agent)

    episodes, eval_seed = 10, seed + 20_000
    expert = evaluate(eval_env, agent.predict, episodes, seed=eval_seed)
    rng = np.random.default_rng(seed)
    random = evaluate(eval_env, lambda _: rng.uniform(-1, 1, act_dim), episodes, seed=eval_seed)
    step, weights = env.sac_steps, agent.get_weights()
    if env.data_policy == "medium":
        target = random + env.medium_score * (expert - random)
        best = None
        for at, snapshot in snapshots:
            agent.set_weights(snapshot)
            policy = noisy_policy(agent, env.data_noise, env.data_random, seed)
            ret = evaluate(eval_env, policy, max(1, episodes // 3), seed=eval_seed)
            logger.info("snapshot at env step %d: noisy policy return %.1f", at, ret)
            if best is None or abs(ret - target) < abs(best[1] - target):
                best = (at, ret, snapshot)
        if best is not None:
            step, _, weights = best
    agent.set_weights(weights)
    policy = noisy_policy(agent, env.data_noise, env.data_random, seed + 1)
    dataset = OfflineDataset.collect(
        train_env, policy, episodes=env.dataset_episodes, seed=seed + 30_000
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    dataset.save(path)
    info = {
        "sac_expert_return": expert,
        "random_return": random,
        "snapshot_env_step": step,
        "data_return": float(dataset.episode_returns().mean()),
        "transitions": len(dataset),
    }
    logger.info("dataset %s: %s", path, info)
    return info


def scale_rewards(
    dataset: OfflineDataset, scale: float, *, seed: int | None = None
) -> OfflineDataset:
    """`dataset` with every reward multiplied by `scale` (its other arrays shared, not copied).

    Offline learners are sensitive to the rewards' scale: Pendulum's rewards reach -16 a
    step, so its values reach -1600 with `gamma = 0.99`, and IQL's advantage weights
    `exp(beta * A)` and CQL's penalty, against the Bellman error, act on that scale. As the
    IQL paper normalises its datasets' rewards, the Pendulum configs scale them by 0.1.
    """
    if scale == 1.0:
        return dataset
    d = dataset
    return OfflineDataset(
        d.obs, d.action, d.reward * scale, d.next_obs, d.terminated, d.truncated, seed=seed
    )


def load_offline_dataset(config: Config, logdir: str) -> OfflineDataset:
    """The run's dataset: `env.dataset` (a `.npz` or a minari id), or the run's own.

    The run's own is `logdir/dataset.npz`, made by `make_sac_dataset` on first use (its SAC
    run logs to `logdir/sac`) and read back on resume.
    """
    env, seed = config.env, config.train.seed
    if env.dataset is None:
        path = os.path.join(logdir, "dataset.npz")
        if not os.path.exists(path):
            sac_logdir = os.path.join(logdir, "sac")
            make_sac_dataset(
                env, path, seed=seed, logdir=sac_logdir, progress=config.train.progress
            )
        return OfflineDataset.load(path, seed=seed)
    if env.dataset.endswith(".npz") or os.path.exists(env.dataset):
        if not os.path.exists(env.dataset):
            raise FileNotFoundError(f"env.dataset={env.dataset!r}: no such file")
        return OfflineDataset.load(env.dataset, seed=seed)
    return OfflineDataset.from_minari(env.dataset, seed=seed)


# -- the learners and their loop -----------------------------------------------------------------


def build_offline(config: Config, obs_dim: int, act_dim: int) -> parl.Algorithm:
    """BC, CQL or IQL for `config`, with `hidden_size`-wide networks."""
    a = config.agent
    hidden = (a.hidden_size, a.hidden_size)
    if config.algorithm == "BC":
        return BC(ContinuousActorCriticMLP(obs_dim, act_dim, hidden), lr=a.lr)
    model = ContinuousActorCriticMLP(obs_dim, act_dim, hidden, stochastic=True, twin=True)
    if config.algorithm == "CQL":
        return CQL(
            model,
            actor_lr=a.lr,
            critic_lr=a.lr,
            alpha_lr=a.lr,
            gamma=a.gamma,
            tau=a.tau,
            cql_weight=a.cql_weight,
            num_sampled_actions=a.num_sampled_actions,
            temperature=a.temperature,
            target_action_gap=a.target_action_gap,
        )
    return IQL(
        model,
        ValueMLP(obs_dim, hidden),
        actor_lr=a.lr,
        critic_lr=a.lr,
        value_lr=a.lr,
        gamma=a.gamma,
        tau=a.tau,
        expectile=a.expectile,
        beta=a.beta,
        max_weight=a.max_weight,
    )


class OfflineRun(Run):
    """An offline run: no training episodes, so progress.csv shows the evaluations.

    Its `mean_return` is the latest evaluation's; a step's row is written after that step's
    evaluation; each evaluation is seeded by its index, so that a resumed run evaluates on the
    episodes the uninterrupted one would have.
    """

    _latest: Any = None

    def mean_return(self) -> float | None:
        """The latest evaluation's mean return."""
        return self.eval_curve[-1][1] if self.eval_curve else None

    def eval_seed(self) -> int | None:
        """The seed of the next evaluation: its index's."""
        return self.seed + 10_000 + len(self.eval_curve)

    def record(self, env_steps: int, episodes: Any = (), stats: Any = None) -> None:
        """`TrainingRun.record`; the row waits for the step's evaluation."""
        TrainingRun.record(self, env_steps, episodes, stats)
        self._latest = stats

    def maybe_evaluate(self, policy: Callable[[np.ndarray], Any]) -> float | None:
        """The evaluation when due, then the step's row and checkpoint when due."""
        result = TrainingRun.maybe_evaluate(self, policy)
        Run.record(self, self.env_steps, (), self._latest)  # the row, when due
        Run.maybe_evaluate(self, policy)  # the checkpoint, when due
        return result


class OfflineTrainer(Trainer):
    """Gradient steps on minibatches of the dataset, evaluating on schedule.

    Args:
        config: the run's config.
        dataset: the dataset (`AlgorithmSpec.prepare`: `load_offline_dataset`).
    """

    def __init__(self, config: Config, dataset: OfflineDataset) -> None:
        torch.manual_seed(config.train.seed)
        self.eval_env = make_rescaled_env(config.env.id)
        obs_dim = self.eval_env.observation_space.shape[0]
        act_dim = self.eval_env.action_space.shape[0]
        if dataset.obs.shape[1:] != (obs_dim,) or dataset.action.shape[1:] != (act_dim,):
            raise ConfigError(
                f"env.dataset holds observations {dataset.obs.shape[1:]} and actions "
                f"{dataset.action.shape[1:]}; env.id={config.env.id!r} has ({obs_dim},) and "
                f"({act_dim},)"
            )
        self.agent = ContinuousAgent(build_offline(config, obs_dim, act_dim))
        self.dataset = scale_rewards(dataset, getattr(config.agent, "reward_scale", 1.0))
        self.batch_size = config.agent.batch_size
        self.total_steps = config.train.total_steps
        # The generator that draws the minibatches: saved with each checkpoint, so that a
        # resumed run draws the batches the uninterrupted one would have.
        self.rng = np.random.default_rng(config.train.seed)
        self.title = f"{config.algorithm} on {config.env.id}"

    def state_dict(self) -> dict[str, Any]:
        """`Trainer.state_dict` and the minibatches' generator (the dataset is made anew)."""
        return {**super().state_dict(), "rng": self.rng}

    def load_state_dict(self, state: dict[str, Any], env_steps: int) -> None:
        """Draw the minibatches the uninterrupted run would have."""
        self.rng = state["rng"]
        super().load_state_dict(state, env_steps)

    def train(self, run: Run) -> None:
        """Gradient steps until `total_steps` of them (or the run is done)."""
        agent = self.agent
        run.start()
        for step in range(run.env_steps + 1, self.total_steps + 1):
            batch = self.dataset.sample_batch(self.batch_size, self.rng)
            stats = agent.alg.learn(*(to_tensor(x, agent.device) for x in batch[:5]))
            run.record(step, (), stats)  # steps here are gradient steps
            run.maybe_evaluate(agent.predict)
            if run.done:
                break


def _trainer(config: Config, spec: AlgorithmSpec, run: Run, dataset: OfflineDataset) -> Trainer:
    """`AlgorithmSpec.trainer` of the offline algorithms (`prepare` made the dataset)."""
    return OfflineTrainer(config, dataset)


def _build_learner(config: Config, obs_space: Any, act_space: Any) -> Learner:
    """`AlgorithmSpec.build`: the agent alone (an offline run has no replay memory)."""
    obs_dim, act_dim = obs_space.shape[0], act_space.shape[0]
    return Learner(ContinuousAgent(build_offline(config, obs_dim, act_dim)))


OFFLINE_SPECS = tuple(
    AlgorithmSpec(
        name=name,
        family="offline",
        env=OfflineEnvSection,
        agent=section,
        stats=stats,
        build=_build_learner,
        trainer=_trainer,
        check=check_offline,
        prepare=load_offline_dataset,
        run_cls=OfflineRun,
    )
    for name, section, stats in (
        ("BC", BCSection, BCStats),
        ("CQL", CQLSection, CQLStats),
        ("IQL", IQLSection, IQLStats),
    )
)
"""The specs of BC, CQL and IQL."""
